"""The delivery engine's metrics, on a registry the process passes around.

Counters and histograms live in the process that observes them (consumer, worker)
and are served on its SETTLE_METRICS_PORT; the queue depth is read from the
database at scrape time, so the notifier API can serve it from any of its workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.notifier.models import DISABLED, PENDING, RETRYING, SKIPPED, Delivery, Endpoint
from shared.db import Database
from shared.timefmt import utcnow

#: Attempt latency buckets (seconds): a receiver should answer in milliseconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Commit-to-receipt buckets (seconds), first attempts and retries alike.
END_TO_END_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300, 3600, 86400)


class NotifierMetrics:
    """What the consumer and the workers count."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.events = Counter(
            "settle_notifier_events",
            "Domain events taken from the bus, by result (stored, duplicate, malformed, untrusted)",
            ["result"],
            registry=self.registry,
        )
        self.attempts = Counter(
            "settle_webhook_attempts",
            "Delivery attempts by outcome (success, or the error code)",
            ["outcome"],
            registry=self.registry,
        )
        self.deliveries = Counter(
            "settle_webhook_deliveries",
            "Deliveries that reached a final state, by outcome (succeeded, failed)",
            ["outcome"],
            registry=self.registry,
        )
        self.attempt_latency = Histogram(
            "settle_webhook_attempt_latency_seconds",
            "Time from sending a delivery to the receiver's answer (or the error)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.end_to_end = Histogram(
            "settle_webhook_end_to_end_seconds",
            "Time from the event's createdAt in core to a 2xx from the receiver",
            buckets=END_TO_END_BUCKETS,
            registry=self.registry,
        )
        self.saturated = Counter(
            "settle_webhook_endpoint_saturated",
            "Deliveries put back because their endpoint had all its slots busy in this process",
            registry=self.registry,
        )
        self.paced = Counter(
            "settle_webhook_rate_limited",
            "Deliveries put back to keep to their endpoint's rateLimitPerSecond",
            registry=self.registry,
        )
        self.held = Counter(
            "settle_webhook_breaker_held",
            "Deliveries put back because their endpoint's circuit breaker was open",
            registry=self.registry,
        )
        self.breaker_opened = Counter(
            "settle_webhook_breaker_opened",
            "Times an endpoint's circuit breaker opened (its attempts kept failing)",
            registry=self.registry,
        )
        self.endpoints_disabled = Counter(
            "settle_webhook_endpoints_disabled_by_worker",
            "Endpoints a worker disabled, by reason (failing: every attempt failed for days)",
            ["reason"],
            registry=self.registry,
        )
        self.lease_lost = Counter(
            "settle_webhook_attempts_lease_lost",
            "Attempts whose delivery another worker took over before they were recorded",
            registry=self.registry,
        )
        self.swept = Counter(
            "settle_webhook_swept",
            "Due deliveries with no job in flight that the sweeper enqueued again",
            registry=self.registry,
        )


class DeliveryQueueCollector(Collector):
    """Deliveries due now and how late the oldest is: the real queue, from the database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = utcnow()
        with self._db.reader() as session:
            count, oldest = session.execute(
                sa.select(sa.func.count(), sa.func.min(Delivery.next_attempt_at)).where(
                    Delivery.status.in_((PENDING, RETRYING)), Delivery.next_attempt_at <= now
                )
            ).one()
        depth = GaugeMetricFamily(
            "settle_webhook_queue_depth", "Deliveries due now (pending or retrying)"
        )
        depth.add_metric([], int(count or 0))
        yield depth
        late = GaugeMetricFamily(
            "settle_webhook_queue_oldest_due_seconds", "How overdue the oldest due delivery is"
        )
        if oldest is not None:
            if oldest.tzinfo is None:  # SQLite aggregates skip the column type
                oldest = oldest.replace(tzinfo=UTC)
            late.add_metric([], max(0.0, (now - oldest).total_seconds()))
        else:
            late.add_metric([], 0.0)
        yield late
        with self._db.reader() as session:
            disabled = session.scalar(
                sa.select(sa.func.count()).where(
                    Endpoint.status == DISABLED, Endpoint.deleted_at.is_(None)
                )
            )
            skipped = session.scalar(sa.select(sa.func.count()).where(Delivery.status == SKIPPED))
        gauge = GaugeMetricFamily(
            "settle_webhook_endpoints_disabled", "Live endpoints that are disabled"
        )
        gauge.add_metric([], int(disabled or 0))
        yield gauge
        gauge = GaugeMetricFamily(
            "settle_webhook_deliveries_skipped",
            "Deliveries kept for disabled endpoints (enabling an endpoint sends its own)",
        )
        gauge.add_metric([], int(skipped or 0))
        yield gauge


def api_metrics_registry(db: Database) -> CollectorRegistry:
    """The registry the notifier API serves on /metrics."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(DeliveryQueueCollector(db))
    return registry
