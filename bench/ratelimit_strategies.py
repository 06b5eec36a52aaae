"""Settle's GCRA buckets against the `limits` package on the API-key limit (100/s, burst 200).

    .venv/bin/python bench/ratelimit_strategies.py [--seconds 8]

Why this exists: issue 22 asked whether `limits` (Redis and memory storage) can replace
shared/ratelimit.py. It has no GCRA (fixed window, moving window, sliding window counter)
and no fallback when Redis is down. This prints, for each, what a client gets: a burst of
300 requests at once (the limit promises 200), then requests offered at 150/s, over the
limit (it promises 100/s sustained), and the Redis round trips per request (counted on the
client's connections). The windows closest to "100/s, burst 200" are "200 per 2 seconds"
(the burst) and "100 per second" (the rate). Needs Redis on 127.0.0.1:6379; keys are
unique to the run and expire.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import redis.connection
from limits import parse
from limits.storage import RedisStorage
from limits.strategies import (
    FixedWindowRateLimiter,
    MovingWindowRateLimiter,
    SlidingWindowCounterRateLimiter,
)

from bench.harness import machine
from shared.ratelimit import MemoryStore, RedisStore

URL = "redis://127.0.0.1:6379/0"
RATE, BURST, OFFERED = 100.0, 200, 150.0

_sent = [0]
_send = redis.connection.Connection.send_packed_command


def _counted(self: Any, *args: Any, **kwargs: Any) -> Any:
    _sent[0] += 1
    return _send(self, *args, **kwargs)


def run(name: str, hit: Callable[[], bool], seconds: float) -> None:
    burst = sum(hit() for _ in range(300))
    sent, started, admitted = _sent[0], time.monotonic(), 0
    n = int(seconds * OFFERED)
    for i in range(n):
        wait = started + i / OFFERED - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        admitted += hit()
    elapsed = time.monotonic() - started
    print(
        f"  {name:48s} burst of 300 admits {burst:3d}; at {OFFERED:.0f}/s admits "
        f"{admitted / elapsed:5.1f}/s; Redis round trips per request {(_sent[0] - sent) / n:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    redis.connection.Connection.send_packed_command = _counted  # type: ignore[method-assign]
    print(f"Rate limits on {machine()}: goal {RATE:.0f}/s, burst {BURST}")
    run_id = uuid.uuid4().hex
    for name, store in [
        ("Settle GCRA, Redis (leases)", RedisStore(URL, prefix=f"bench:{run_id}:")),
        ("Settle GCRA, memory", MemoryStore()),
    ]:
        key = f"key-{run_id}"
        run(name, lambda store=store, key=key: store.hit(key, RATE, BURST).allowed, args.seconds)
    storage = RedisStorage(URL)
    for strategy, item in [
        (MovingWindowRateLimiter, parse("200/2 seconds")),
        (SlidingWindowCounterRateLimiter, parse("200/2 seconds")),
        (FixedWindowRateLimiter, parse("100/second")),
    ]:
        limiter, key = strategy(storage), f"bench-{run_id}-{strategy.__name__}"
        label = f"limits {strategy.__name__.removesuffix('RateLimiter')}, {item}, Redis"
        run(label, lambda limiter=limiter, item=item, key=key: limiter.hit(item, key), args.seconds)


if __name__ == "__main__":
    main()
