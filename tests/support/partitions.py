"""A fresh database given the partitions a year-old one keeps (tests and benches)."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa

from services.core import retention as core_retention
from services.notifier import retention as notifier_retention
from shared import partitions


def steady_state_partitions(url: str) -> int:
    """Give a fresh database the partitions a year-old one keeps: one per period back to
    each table's retention (defaults), besides the current one and those made ahead.

    The hot path's cost depends on how many partitions a statement cannot prune; a fresh
    database has 5 per table, a production one 30-365 days' worth. Returns how many
    partitions the database has then.
    """
    now = datetime.now(UTC)
    settings = partitions.PartitionSettings()
    specs = [
        *notifier_retention.partitioned_tables(notifier_retention.WebhookRetention()),
        *core_retention.partitioned_tables(core_retention.OutboxRetention()),
    ]
    engine = sa.create_engine(url)
    made = 0
    try:
        with engine.begin() as conn:
            for spec in specs:
                there = partitions.existing(conn, spec)
                for partition in partitions.span(spec, now - spec.retention, now, settings):
                    overlaps = any(
                        partition.start < e.end and e.start < partition.end for e in there
                    )
                    if not overlaps:
                        partitions.create(conn, spec, partition)
                made += len(partitions.existing(conn, spec))
    finally:
        engine.dispose()
    return made
