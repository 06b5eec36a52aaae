"""The delivery engine's metrics, on a registry the process passes around.

Counters and histograms live in the process that observes them (consumer, worker)
and are served on its SETTLE_METRICS_PORT; the queue depth is read from the
database at scrape time, so the notifier API can serve it from any of its workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pika
import pika.exceptions
import sqlalchemy as sa
from dramatiq.common import xq_name
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.notifier.breaker import HALF_OPEN, OPEN, CircuitBreakers
from services.notifier.models import (
    DISABLED,
    FAILED,
    PENDING,
    RETRYING,
    SKIPPED,
    SUCCEEDED,
    Delivery,
    Endpoint,
)
from shared.bus import BusNames, node_parameters
from shared.db import Database
from shared.metrics import CachedCollector
from shared.timefmt import utcnow
from shared.topology import JOB_QUEUE, NOTIFIER_DEAD_QUEUE, RETRY_JOB_QUEUE

#: What `settle_notifier_events_total{result}` counts: a message stored as an event, one
#: already stored (redelivered), one that can never be an event, one not from core.
EVENT_RESULTS = ("stored", "duplicate", "malformed", "untrusted")
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
        # Known label values start at 0, so rates and `absent()` see them before the
        # first event (Prometheus' advice for labelled counters).
        for result in EVENT_RESULTS:
            self.events.labels(result)
        for outcome in (SUCCEEDED, FAILED, SKIPPED):
            self.deliveries.labels(outcome)
        self.attempts.labels("success")
        self.endpoints_disabled.labels("failing")


#: The `queue` label of the delivery gauges: the job queue a due delivery waits on
#: (first attempts, and retries: `broker.DeliveryQueues`), named as in RabbitMQ.
FIRST_QUEUE, RETRY_QUEUE = JOB_QUEUE, RETRY_JOB_QUEUE


class DeliveryQueueCollector(Collector):
    """Deliveries due now and how late the oldest is, per queue: the real queue, from the
    database (a delivery with no attempt yet waits for a first attempt; one with attempts,
    for a retry). Lag is measured from when a delivery fell due, not from its event."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = utcnow()
        depth = GaugeMetricFamily(
            "settle_webhook_queue_depth",
            "Deliveries due now and not yet sent (pending or retrying), per queue",
            labels=["queue"],
        )
        late = GaugeMetricFamily(
            "settle_webhook_queue_oldest_due_seconds",
            "How long the oldest due delivery has been due, per queue (0: none due)",
            labels=["queue"],
        )
        queue = sa.case((Delivery.attempt_count > 0, RETRY_QUEUE), else_=FIRST_QUEUE)
        found: dict[str, tuple[int, datetime | None]] = {}
        with self._db.reader() as session:
            for name, count, oldest in session.execute(
                sa.select(queue, sa.func.count(), sa.func.min(Delivery.next_attempt_at))
                .where(Delivery.status.in_((PENDING, RETRYING)), Delivery.next_attempt_at <= now)
                .group_by(queue)
            ):
                found[name] = (int(count or 0), oldest)
            disabled = session.scalar(
                sa.select(sa.func.count()).where(
                    Endpoint.status == DISABLED, Endpoint.deleted_at.is_(None)
                )
            )
            skipped = session.scalar(sa.select(sa.func.count()).where(Delivery.status == SKIPPED))
        for name in (FIRST_QUEUE, RETRY_QUEUE):
            count, oldest = found.get(name, (0, None))
            depth.add_metric([name], count)
            due_for = 0.0 if oldest is None else (now - oldest).total_seconds()
            late.add_metric([name], max(0.0, due_for))
        yield depth
        yield late
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


class BreakerCollector(Collector):
    """`settle_webhook_breakers{state}`: endpoints whose circuit breaker is open (no attempt
    goes) or half-open (a probe may go) in this worker process. No endpoint label: which
    endpoints, the logs and the portal say."""

    def __init__(self, breakers: CircuitBreakers) -> None:
        self._breakers = breakers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "settle_webhook_breakers",
            "Endpoints whose circuit breaker is open or half-open in this worker process",
            labels=["state"],
        )
        states = self._breakers.states()
        for state in (OPEN, HALF_OPEN):
            family.add_metric([state], states.get(state, 0))
        yield family


def api_metrics_registry(db: Database) -> CollectorRegistry:
    """The registry the notifier API serves on /metrics."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(CachedCollector(DeliveryQueueCollector(db)))
    return registry


class DeadLetterCollector(Collector):
    """`settle_dead_letter_messages{queue}`: messages waiting in the dead-letter queues,
    read from RabbitMQ (a passive declare each; a queue not declared yet holds none):
    domain events the consumer refused (malformed, untrusted: `settle.notifier.events.dead`)
    and delivery jobs that raised (Dramatiq's `.XQ` of each job queue). The `queue` label
    is the name without SETTLE_AMQP_PREFIX."""

    def __init__(self, amqp_url: str, names: BusNames) -> None:
        self._nodes = node_parameters(amqp_url)
        for params in self._nodes:
            params.blocked_connection_timeout = 5
            params.client_properties = {"connection_name": "settle notifier metrics"}
        self._prefix = names.prefix
        self._queues = (NOTIFIER_DEAD_QUEUE, xq_name(FIRST_QUEUE), xq_name(RETRY_QUEUE))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "settle_dead_letter_messages",
            "Messages waiting in a dead-letter queue (refused events, delivery jobs that raised)",
            labels=["queue"],
        )
        connection = pika.BlockingConnection(self._nodes)
        try:
            channel = connection.channel()
            for queue in self._queues:
                try:
                    declared = channel.queue_declare(self._prefix + queue, passive=True)
                    count = int(declared.method.message_count)
                except pika.exceptions.ChannelClosedByBroker as err:
                    if err.reply_code != 404:
                        raise
                    count = 0  # never declared: nothing was ever dead-lettered there
                    channel = connection.channel()
                family.add_metric([queue], count)
        finally:
            if connection.is_open:
                connection.close()
        yield family
