"""How long the notifier keeps events, deliveries and attempts: its partitioned tables.

Deliveries are partitioned by their id (`whd_<ULID>`: a day of ids is a range of ids),
so the claim, the record and every lookup by id find one partition, and the id stays
unique across partitions (it is the key). Attempts are partitioned by their delivery's
id, with the same ranges: a delivery's attempts live in the day it was made. Events are
partitioned by when they were received; their ids (core's) are kept unique across
partitions by `notifier_event_ids`, a plain table pruned with the partitions it covers
(docs/DECISIONS.md, "Bounded data").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from shared.partitions import PartitionedTable, SeenIds, env_retention_days
from shared.settings import SettingsError

#: The prefix of delivery ids (fanout.pending).
DELIVERY_ID_PREFIX = "whd_"


@dataclass(frozen=True)
class WebhookRetention:
    attempts: timedelta = timedelta(days=30)
    deliveries: timedelta = timedelta(days=30)
    events: timedelta = timedelta(days=90)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WebhookRetention:
        retention = cls(
            attempts=env_retention_days(env, "SETTLE_RETENTION_WEBHOOK_ATTEMPTS_DAYS", 30),
            deliveries=env_retention_days(env, "SETTLE_RETENTION_WEBHOOK_DELIVERIES_DAYS", 30),
            events=env_retention_days(env, "SETTLE_RETENTION_WEBHOOK_EVENTS_DAYS", 90),
        )
        if retention.events < retention.deliveries:
            # A delivery still retrying must find its event (the claim reads its body).
            raise SettingsError(
                "SETTLE_RETENTION_WEBHOOK_EVENTS_DAYS must be at least "
                "SETTLE_RETENTION_WEBHOOK_DELIVERIES_DAYS"
            )
        return retention


def partitioned_tables(retention: WebhookRetention) -> list[PartitionedTable]:
    return [
        PartitionedTable(
            "notifier_events",
            "received_at",
            retention.events,
            seen_ids=SeenIds("notifier_event_ids", "received_at"),
        ),
        PartitionedTable(
            "webhook_deliveries", "id", retention.deliveries, id_prefix=DELIVERY_ID_PREFIX
        ),
        PartitionedTable(
            "webhook_attempts", "delivery_id", retention.attempts, id_prefix=DELIVERY_ID_PREFIX
        ),
    ]
