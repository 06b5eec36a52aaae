"""`settle notifier consume`: domain events from RabbitMQ to stored events and deliveries.

For each message: parse and check the envelope; in ONE transaction store the event
(once: a redelivered id is a no-op) and one delivery per subscribed, enabled
endpoint; commit; hand the deliveries to the workers; then ack. A crash before the
ack redelivers the message, which then finds the event stored and makes nothing
new; deliveries whose jobs were never enqueued are found by the sweeper.

A malformed message is rejected without requeue, so RabbitMQ dead-letters it to
`settle.events.dlx` -> `settle.notifier.events.dead` (kept for inspection), with
one log line. A database outage keeps the batch in hand and tries again with
backoff (no crash loop, no loss, and no hand-out counted toward the quorum queue's
delivery limit); a message handed out EVENT_DELIVERY_LIMIT times without an ack (a
consumer that dies on it each time) is dead-lettered like a malformed one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pika
import pika.exceptions
import psycopg
import sqlalchemy as sa
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic

from services.notifier import fanout, queue_admin, trust
from services.notifier.context import NotifierContext
from services.notifier.deliveries import (
    InvalidEvent,
    event_row,
    insert_events,
    ordered_as,
    parse_envelope,
)
from services.notifier.metrics import NotifierMetrics
from services.notifier.models import PENDING, RETRYING, Delivery
from shared import logs, topology
from shared.backoff import Backoff
from shared.bus import BusNames, declare_events_exchange, node_parameters, rotated
from shared.db import Database
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

#: Most messages stored in one transaction.
MAX_BATCH = 100
#: How often an idle consumer looks at its stop flag.
IDLE_CHECK_S = 0.25
#: Reconnect / database backoff: first and longest wait.
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 15.0


class MalformedEvent(ValueError):
    """A message that can never become an event; dead-lettered, never retried."""


@dataclass
class Handled:
    """What became of one message: the deliveries to hand off, or why it is malformed."""

    delivery_ids: list[str] = field(default_factory=list)
    malformed: str | None = None
    #: (endpoint id, tenant id) of each new delivery, for the job messages.
    routes: dict[str, tuple[str, str]] = field(default_factory=dict)


def store_events(
    db: Database,
    bodies: Sequence[bytes],
    metrics: NotifierMetrics | None = None,
    *,
    now: datetime | None = None,
    request_ids: Sequence[str | None] | None = None,
) -> list[Handled]:
    """Store a batch of events and their deliveries in ONE transaction (committed on return).

    Each event is stored once: a redelivered id makes no delivery, and hands back its
    unfinished deliveries that are due and idle (the sweeper would find them too,
    only later). Malformed bodies are reported, not stored. A database error rolls
    the whole batch back and propagates.

    On the fast executor (`Database.driver_transaction`): one pipelined INSERT for
    the events, one fan-out query per (tenant, type) of the batch (`fanout`), one
    pipelined INSERT for the deliveries.

    `request_ids` (one per body, or None): the API requests that caused the events (the
    messages' correlation_id), stored with them for the delivery attempts' log lines.
    """
    results = [Handled() for _ in bodies]
    parsed: dict[str, tuple[int, bytes, dict[str, Any]]] = {}
    causes = list(request_ids) if request_ids is not None else [None] * len(bodies)
    repeats: list[tuple[int, str]] = []
    for index, body in enumerate(bodies):
        try:
            envelope = parse_envelope(body)
        except InvalidEvent as err:
            results[index].malformed = str(err)
            continue
        if envelope["id"] in parsed:
            repeats.append((index, envelope["id"]))  # the same event twice in one batch
        else:
            parsed[envelope["id"]] = (index, body, envelope)
    labels = ["malformed" for r in results if r.malformed]
    if parsed:
        now = now or utcnow()
        with db.driver_transaction() as conn:
            rows = [
                event_row(envelope, body, now, causes[index])
                for index, body, envelope in parsed.values()
            ]
            stored = insert_events(db, conn, rows)
            subscribers: dict[tuple[str, str], list[fanout.Subscriber]] = {}
            made: list[dict[str, Any]] = []
            for event_id, (index, _body, envelope) in parsed.items():
                if event_id not in stored:
                    results[index].delivery_ids = _unfinished(db, conn, event_id, now)
                    labels.append("duplicate")
                    continue
                tenant_id, event_type = envelope["tenantId"], envelope["type"]
                key = (tenant_id, event_type)
                if key not in subscribers:
                    subscribers[key] = fanout.subscribers(db, conn, tenant_id, event_type)
                order = ordered_as(envelope)
                for endpoint in subscribers[key]:
                    row = (fanout.pending if endpoint.enabled else fanout.skipped)(
                        tenant_id,
                        event_id,
                        event_type,
                        endpoint.id,
                        now,
                        order=order if endpoint.ordered else None,
                    )
                    made.append(row)
                    if endpoint.enabled:
                        # (A skipped one is kept, not sent: enabling the endpoint sends it.)
                        results[index].delivery_ids.append(row["id"])
                        results[index].routes[row["id"]] = (endpoint.id, tenant_id)
                labels.append("stored")
            fanout.insert_deliveries(db, conn, made)
    labels.extend("duplicate" for _ in repeats)
    if metrics is not None:
        for label in labels:
            metrics.events.labels(label).inc()
    return results


#: A redelivered event's unfinished deliveries that are due and not leased.
_UNFINISHED = sa.select(Delivery.id).where(
    Delivery.event_id == sa.bindparam("event_id"),
    # Not in_(): an expanding IN re-renders the SQL on every execution.
    sa.or_(Delivery.status == PENDING, Delivery.status == RETRYING),
    sa.or_(Delivery.lease_until.is_(None), Delivery.lease_until < sa.bindparam("now")),
    Delivery.next_attempt_at <= sa.bindparam("now"),
)


def _unfinished(
    db: Database, conn: psycopg.Connection[Any], event_id: str, now: datetime
) -> list[str]:
    statement = db.attachment("notifier.unfinished", lambda d: d.driver_statement(_UNFINISHED))
    rows = conn.execute(statement.sql, statement.bind({"event_id": event_id, "now": now}))
    return [delivery_id for (delivery_id,) in rows]


def handle_event(
    ctx: NotifierContext, body: bytes, metrics: NotifierMetrics | None = None
) -> list[str]:
    """Store one event once and fan it out, commit, hand off; returns the delivery ids.

    Raises MalformedEvent for a body that is not an event envelope.
    """
    # The in-process bus runs this in the scope of the request that caused the event.
    (handled,) = store_events(ctx.db, [body], metrics, request_ids=[logs.request_id()])
    if handled.malformed is not None:
        raise MalformedEvent(handled.malformed)
    ctx.hand_off(handled.delivery_ids, handled.routes, [handled.delivery_ids])
    return handled.delivery_ids


def inprocess_handler(
    ctx: NotifierContext, metrics: NotifierMetrics | None = None
) -> Callable[[bytes], list[str]]:
    """`handle_event` for InProcessBus: a malformed event is logged and dropped (no DLQ)."""

    def handle(body: bytes) -> list[str]:
        try:
            return handle_event(ctx, body, metrics)
        except MalformedEvent as err:
            log.error("dropped a malformed event (%s): %r", err, body[:200])
            return []

    return handle


def declare_topology(channel: BlockingChannel, names: BusNames) -> None:
    """Exchanges, the notifier's quorum queue bound to every type, its dead-letter queue.

    A queue of the same name declared before as a classic queue makes RabbitMQ close
    the channel (406 PRECONDITION_FAILED): `settle notifier upgrade-queues` moves it.
    """
    declare_events_exchange(channel, names)
    channel.exchange_declare(names.dead_letter_exchange, exchange_type="fanout", durable=True)
    for queue in topology.event_queues(names.prefix):
        queue_admin.declare(channel, queue)


class EventConsumer:
    """The notifier's queue to stored events and deliveries (`run` until stopped)."""

    def __init__(
        self, ctx: NotifierContext, metrics: NotifierMetrics, names: BusNames, *, prefetch: int
    ) -> None:
        if not ctx.config.amqp_url:
            raise ValueError("the event consumer needs SETTLE_AMQP_URL")
        self.ctx = ctx
        self.metrics = metrics
        self.names = names
        self.prefetch = prefetch
        #: The cluster's nodes: each reconnect begins with the node after the one lost.
        self.nodes = node_parameters(ctx.config.amqp_url)
        for params in self.nodes:
            params.client_properties = {
                "connection_name": f"settle notifier consumer {names.prefix}".strip()
            }
        self.node = 0
        self.db_backoff = Backoff(BACKOFF_FIRST_S, BACKOFF_MAX_S)
        #: Set once `run` is told to stop: a batch the database refuses is requeued then.
        self.stopping = threading.Event()

    def run(self, stop: threading.Event, *, ready: threading.Event | None = None) -> None:
        """Consume until `stop`; reconnects to RabbitMQ with capped backoff."""
        self.stopping = stop
        names = self.names
        backoff = Backoff(BACKOFF_FIRST_S, BACKOFF_MAX_S)
        max_batch = max(1, min(self.prefetch, MAX_BATCH))
        while not stop.is_set():
            connection = None
            try:
                connection = pika.BlockingConnection(rotated(self.nodes, self.node))
                channel = connection.channel()
                declare_topology(channel, names)
                channel.basic_qos(prefetch_count=self.prefetch)
                backoff.reset()
                log.info("notifier consumer ready on %s", names.notifier_queue)
                if ready is not None:
                    ready.set()
                batch: list[tuple[Basic.Deliver, bytes, str | None]] = []
                for method, props, body in channel.consume(
                    names.notifier_queue, inactivity_timeout=IDLE_CHECK_S
                ):
                    if method is not None and trust.admit(
                        channel, method, props, self.ctx.config.core_amqp_user, self.metrics
                    ):
                        assert body is not None
                        batch.append((method, body, props.correlation_id))
                        # Take what is already here, then store it in one transaction.
                        if len(batch) < max_batch and channel.get_waiting_message_count() > 0:
                            continue
                    if batch:
                        self.process(channel, batch)
                        batch = []
                    if stop.is_set():
                        break
            except (pika.exceptions.AMQPError, OSError) as err:
                self.node += 1
                delay = backoff.next()
                if getattr(err, "reply_code", None) == 406:
                    # A queue of an older deployment (classic) refuses the quorum declaration.
                    log.error(
                        "RabbitMQ refused the notifier's queues (%r): an older deployment's "
                        "classic queues? run settle notifier upgrade-queues (docs/DEPLOY.md); "
                        "trying again in %.1fs",
                        err,
                        delay,
                    )
                else:
                    log.warning("RabbitMQ unavailable (%r); reconnecting in %.1fs", err, delay)
                stop.wait(delay)
            finally:
                if connection is not None and connection.is_open:
                    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                        connection.close()

    def process(
        self, channel: BlockingChannel, batch: list[tuple[Basic.Deliver, bytes, str | None]]
    ) -> None:
        """Store a batch, hand off its deliveries, then settle every message of it."""
        ctx = self.ctx
        while True:
            try:
                results = store_events(
                    ctx.db,
                    [body for _, body, _ in batch],
                    self.metrics,
                    request_ids=[cause for _, _, cause in batch],
                )
                break
            except (psycopg.DataError, psycopg.IntegrityError):
                # Something in the batch is refused by the database every time: find it.
                if len(batch) > 1:
                    for one in batch:
                        self.process(channel, [one])
                    return
                method, body, _ = batch[0]
                log.error("dead-lettered an event the database refuses; body=%r", body[:200])
                channel.basic_reject(method.delivery_tag, requeue=False)
                return
            except Exception:
                delay = self.db_backoff.next()
                if self.stopping.is_set():
                    log.exception("%d events not stored; requeued (stopping)", len(batch))
                    channel.basic_nack(batch[-1][0].delivery_tag, multiple=True, requeue=True)
                    return
                # Kept in hand, not requeued: each return counts toward the queue's
                # delivery limit, and a long database outage (a failover) must not
                # dead-letter good events as poison. Sleeping on the connection keeps
                # its heartbeats answered.
                log.exception(
                    "%d events not stored; kept, trying again in %.1fs", len(batch), delay
                )
                channel.connection.sleep(delay)
        self.db_backoff.reset()
        routes: dict[str, tuple[str, str]] = {}
        for (method, body, _), handled in zip(batch, results, strict=True):
            if handled.malformed is not None:
                log.error(
                    "dead-lettered a malformed event message (%s); body=%r",
                    handled.malformed,
                    body[:200],
                )
                channel.basic_reject(method.delivery_tag, requeue=False)
            routes.update(handled.routes)
        # Each id once, in order (a batch of 64 events to 50 endpoints is 3,200 ids).
        ids = list(dict.fromkeys(i for handled in results for i in handled.delivery_ids))
        ctx.hand_off(ids, routes, [handled.delivery_ids for handled in results])
        acked = [m for (m, _, _), h in zip(batch, results, strict=True) if h.malformed is None]
        if acked:
            channel.basic_ack(acked[-1].delivery_tag, multiple=True)
