"""Registers `settle notifier api|consume|worker|upgrade-queues`.

Imports nothing heavy: the handlers are in services/notifier/cli.py, imported when
their command runs (services/commands.py).
"""

from __future__ import annotations

import argparse

from services.commands import lazy


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    notifier = sub.add_parser("notifier", help="notifier processes").add_subparsers(
        dest="action", required=True
    )
    p = notifier.add_parser("api", help="serve the notifier's HTTP API with gunicorn")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--workers", type=int, help="default: the number of CPUs (at least 2)")
    p.add_argument("--threads", type=int, default=4)
    p.set_defaults(func=lazy("services.notifier.cli:notifier_api"))

    p = notifier.add_parser(
        "consume", help="store domain events from RabbitMQ and fan out deliveries (+ sweeper)"
    )
    p.set_defaults(func=lazy("services.notifier.cli:notifier_consume"))

    p = notifier.add_parser("worker", help="send deliveries (Dramatiq worker threads)")
    p.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads per process (SETTLE_NOTIFIER_WORKER_THREADS)",
    )
    p.set_defaults(func=lazy("services.notifier.cli:notifier_worker"))

    p = notifier.add_parser(
        "upgrade-queues",
        help="replace classic queues of an older deployment by quorum queues "
        "(notifier and core's relay stopped; docs/DEPLOY.md)",
    )
    p.set_defaults(func=lazy("services.notifier.cli:notifier_upgrade_queues"))
