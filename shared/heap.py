"""The cyclic garbage collector in long-lived processes."""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Keep what a long-lived process has built so far out of the cyclic collector's
    full passes: call it once start-up is done (API workers, the delivery worker, the
    consumer, core's worker).

    The app, its modules and schemas (~200,000 objects for core) live as long as the
    process, yet every full collection walked them all: ~0.1 s each, every few thousand
    requests, ~4 % of an account creation's CPU; in the delivery path's processes, a
    pause that every event in flight waited for (the p99 tail of bench/webhooks.py,
    docs/PERFORMANCE.md). Frozen, a full pass walks only what was made since. Garbage
    from start-up is collected first.
    """
    gc.collect()
    gc.freeze()
