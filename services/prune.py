"""`settle prune [--dry-run]`: drop the partitions past their retention, now, as JSON.

The workers do this every hour on their own (shared.partitions.Maintainer); the
command is for ops: see what a prune drops (`--dry-run` drops nothing) or free disk
at once after shortening a retention. Retentions and the partition length come from
the same settings the workers read (docs/RUNBOOK.md, "Bounded data").
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when the command runs: `settle prune --help` stays light
    from shared.partitions import PartitionedTable, PruneReport


def targets(env: Mapping[str, str]) -> list[tuple[str, Sequence[PartitionedTable]]]:
    """Each database and its partitioned tables (core's and the notifier's may differ)."""
    from services.core import retention as core_retention
    from services.core.config import CoreConfig
    from services.notifier import retention as notifier_retention
    from services.notifier.config import NotifierConfig

    core = CoreConfig.from_env(env)
    notifier = NotifierConfig.from_env(env)
    return [
        (core.database_url, core_retention.partitioned_tables(core.retention)),
        (notifier.database_url, notifier_retention.partitioned_tables(notifier.retention)),
    ]


def prune_all(
    env: Mapping[str, str],
    *,
    dry_run: bool,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> PruneReport:
    from shared import partitions
    from shared.db import make_engine
    from shared.partitions import PruneReport

    now = clock()
    report = PruneReport(dry_run, now)
    for url, specs in targets(env):
        engine = make_engine(url, pool_size=1)
        try:
            report.extend(partitions.prune(engine, specs, now, dry_run=dry_run))
        finally:
            engine.dispose()
    return report


def prune(args: argparse.Namespace) -> int:
    import os

    print(json.dumps(prune_all(dict(os.environ), dry_run=args.dry_run).as_json(), indent=2))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "prune",
        help="drop data past its retention (old partitions), as JSON (--dry-run: only say what)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print what would be dropped; drop nothing"
    )
    p.set_defaults(func=prune)
