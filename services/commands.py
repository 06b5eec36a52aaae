"""Registering commands without importing what they run.

`settle --help` and `settle <group> --help` must answer at once, so the modules that
register commands import only argparse and light helpers; each command's handler is
named as `"module:function"` and imported when that command runs (`lazy`). Handlers
raising `shared.errors.ApiError` print it and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]


def lazy(target: str) -> Handler:
    """A handler that imports `module:function` when it runs, then calls it."""
    module_name, _, name = target.partition(":")

    def run(args: argparse.Namespace) -> int:
        handler: Handler = getattr(importlib.import_module(module_name), name)
        return guarded(handler)(args)

    run.__qualname__ = f"lazy({target})"
    return run


def guarded(fn: Handler) -> Handler:
    """`fn`, with an API error (a refusal a person can act on) printed, exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except Exception as err:
            from shared.errors import ApiError  # only when something failed

            if not isinstance(err, ApiError):
                raise
            sys.stderr.write(f"error: {err.code}: {err.message}\n")
            return 2

    return run


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`settle dev` and `settle reconcile`."""
    p = sub.add_parser("dev", help="everything in one process (embedded PostgreSQL and broker)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=lazy("services.dev:run_dev"))
    add_reconcile(sub, lazy("services.reconcile:command"))


#: `settle reconcile`'s default: events younger than a minute are in flight, not lost.
DEFAULT_SETTLE_S = 60.0


def _time(text: str) -> object:
    from shared.timefmt import parse_iso

    try:
        return parse_iso(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return value


def add_reconcile(sub: argparse._SubParsersAction[argparse.ArgumentParser], func: Handler) -> None:
    """`settle reconcile` and its options, running `func`."""
    p = sub.add_parser(
        "reconcile",
        help="check that every event reached the notifier, once, intact, and that the hot wallet "
        "paid only what Settle recorded (exit 1 if not)",
        description="Compare core's outbox and deposits with the notifier's events and"
        " deliveries for events created in [since, until). Exit 0 when clean, 1 on any"
        " discrepancy, 2 when the check could not run. See docs/RECONCILE.md.",
    )
    p.add_argument("--since", type=_time, help="ISO 8601 (default: 24 h before --until)")
    p.add_argument("--until", type=_time, help="ISO 8601, exclusive (default: now)")
    p.add_argument(
        "--settle-seconds",
        type=_seconds,
        default=DEFAULT_SETTLE_S,
        metavar="N",
        help=f"time an event or delivery may be in flight (default {DEFAULT_SETTLE_S:g})",
    )
    p.add_argument(
        "--require-delivered",
        action="store_true",
        help="a live endpoint's delivery not succeeded after the settle time is a discrepancy",
    )
    p.add_argument("--tenant", action="append", metavar="ID", help="only this tenant (repeatable)")
    p.add_argument(
        "--chain-balances",
        choices=("deposited", "all", "none"),
        default="deposited",
        help="deposit addresses whose balances are read on each chain with a node"
        " (SETTLE_RPC_URL_<id>): those with deposits or sweeps (default), all, or none",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--no-chain",
        action="store_true",
        help="do not read the hot wallet's payouts from the chains' nodes",
    )
    p.set_defaults(func=func)
