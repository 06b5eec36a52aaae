"""How long core keeps its outbox rows: the outbox's partitions.

The outbox is range-partitioned on (timeline, created_at): `timeline` is true for a
deposit's status events (its recorded timeline, `GET /v1/deposits/{id}/timeline`),
kept a year in partitions of 30 days; every other event is published and then kept
30 days, in daily partitions. A partition still holding an unpublished row is never
dropped (the bus was down that long: the rows wait for it). A durable deposit event id
stays written at most once across partitions by `outbox_durable_ids`, pruned with the
timeline (docs/DECISIONS.md, "Bounded data").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from shared.partitions import PartitionedTable, SeenIds, env_retention_days

#: Days per partition of the timeline's rows (a year of them is 13 partitions).
TIMELINE_PERIOD_DAYS = 30
#: A row not yet on the bus.
UNPUBLISHED = "published_at IS NULL"


@dataclass(frozen=True)
class OutboxRetention:
    #: Published events that are not a deposit's status events.
    events: timedelta = timedelta(days=30)
    #: A deposit's status events (its timeline).
    deposit_events: timedelta = timedelta(days=365)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OutboxRetention:
        return cls(
            events=env_retention_days(env, "SETTLE_RETENTION_OUTBOX_DAYS", 30),
            deposit_events=env_retention_days(env, "SETTLE_RETENTION_DEPOSIT_EVENTS_DAYS", 365),
        )


def partitioned_tables(retention: OutboxRetention) -> list[PartitionedTable]:
    return [
        PartitionedTable(
            "outbox",
            "created_at",
            retention.events,
            lead="false",
            stem="outbox_events",
            lead_condition="NOT timeline",
            hold_if=UNPUBLISHED,
        ),
        PartitionedTable(
            "outbox",
            "created_at",
            retention.deposit_events,
            lead="true",
            stem="outbox_timeline",
            lead_condition="timeline",
            hold_if=UNPUBLISHED,
            period_days=TIMELINE_PERIOD_DAYS,
            seen_ids=SeenIds("outbox_durable_ids", "created_at"),
        ),
    ]
