"""`settle notifier consume`: domain events from RabbitMQ to stored events and deliveries.

For each message: parse and check the envelope; in ONE transaction store the event
(once: a redelivered id is a no-op) and one delivery per subscribed, enabled
endpoint; commit; hand the deliveries to the workers; then ack. A crash before the
ack redelivers the message, which then finds the event stored and makes nothing
new; deliveries whose jobs were never enqueued are found by the sweeper.

A malformed message is rejected without requeue, so RabbitMQ dead-letters it to
`settle.events.dlx` -> `settle.notifier.events.dead` (kept for inspection), with
one log line. A database outage requeues the message and backs off: no crash loop,
no loss.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions
import sqlalchemy as sa
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic
from sqlalchemy.dialects import postgresql, sqlite

from services.notifier import trust
from services.notifier.context import NotifierContext
from services.notifier.deliveries import InvalidEvent, parse_envelope
from services.notifier.models import ENABLED, PENDING, RETRYING, Delivery, Endpoint, StoredEvent
from shared.bus import BusNames, declare_events_exchange
from shared.ids import new_id
from shared.timefmt import parse_iso, utcnow

if TYPE_CHECKING:
    from services.notifier.engine import Engine
    from services.notifier.metrics import NotifierMetrics

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


def store_events(
    ctx: NotifierContext, bodies: Sequence[bytes], metrics: NotifierMetrics | None = None
) -> list[Handled]:
    """Store a batch of events and their deliveries in ONE transaction (committed on return).

    Each event is stored once: a redelivered id makes no delivery, and hands back its
    unfinished deliveries that are due and idle (the sweeper would find them too,
    only later). Malformed bodies are reported, not stored. A database error rolls
    the whole batch back and propagates.

    Rows are written in bulk (one INSERT for the events, one for the deliveries): the
    same rows `deliveries.store_event` and `deliveries.create_deliveries` write one
    by one, at a fraction of the cost per event.
    """
    results = [Handled() for _ in bodies]
    parsed: dict[str, tuple[int, bytes, dict[str, Any]]] = {}
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
        now = utcnow()
        # Core on one connection, not an ORM session: at one event per batch (a steady
        # trickle) the session's bookkeeping cost several times the SQL.
        with ctx.db.engine.begin() as conn:
            stored = _insert_events(conn, parsed.values(), now)
            subscribers: dict[tuple[str, str], list[str]] = {}
            rows: list[dict[str, Any]] = []
            for event_id, (index, _body, envelope) in parsed.items():
                if event_id not in stored:
                    results[index].delivery_ids = _unfinished(conn, event_id)
                    labels.append("duplicate")
                    continue
                key = (envelope["tenantId"], envelope["type"])
                if key not in subscribers:
                    subscribers[key] = _subscriber_ids(conn, *key)
                for endpoint_id in subscribers[key]:
                    rows.append(_delivery_row(envelope, endpoint_id, now))
                    results[index].delivery_ids.append(rows[-1]["id"])
                labels.append("stored")
            if rows:
                conn.execute(_INSERT_DELIVERIES, rows)
    labels.extend("duplicate" for _ in repeats)
    if metrics is not None:
        for label in labels:
            metrics.events.labels(label).inc()
    return results


#: Core statements of store_events, built once.
_INSERT_DELIVERIES = sa.insert(Delivery.__table__)
_EVENTS = StoredEvent.__table__
_INSERT_EVENTS = {
    name: insert(_EVENTS).on_conflict_do_nothing(index_elements=["id"]).returning(_EVENTS.c.id)
    for name, insert in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
}
_SUBSCRIBERS = (
    sa.select(Endpoint.id, Endpoint.event_types)
    .where(
        Endpoint.tenant_id == sa.bindparam("tenant_id"),
        Endpoint.status == ENABLED,
        Endpoint.deleted_at.is_(None),
    )
    .order_by(Endpoint.id)
)


def _subscriber_ids(conn: sa.Connection, tenant_id: str, event_type: str) -> list[str]:
    """Ids of deliveries.subscribed_endpoints (same test), without loading whole rows."""
    rows = conn.execute(_SUBSCRIBERS, {"tenant_id": tenant_id})
    return [endpoint_id for endpoint_id, types in rows if event_type in (types or [])]


def _insert_events(
    conn: sa.Connection, parsed: Iterable[tuple[int, bytes, dict[str, Any]]], now: datetime
) -> set[str]:
    """INSERT ... ON CONFLICT DO NOTHING for the batch; the ids that were new."""
    rows = [
        {
            "id": envelope["id"],
            "tenant_id": envelope["tenantId"],
            "event_type": envelope["type"],
            "body": body.decode("utf-8"),
            "created_at": parse_iso(envelope["createdAt"]),
            "received_at": now,
        }
        for _index, body, envelope in parsed
    ]
    statement = _INSERT_EVENTS[conn.dialect.name]
    return set(conn.execute(statement, rows).scalars())


def _delivery_row(envelope: dict[str, Any], endpoint_id: str, now: datetime) -> dict[str, Any]:
    """A new delivery, pending and due now (as deliveries.create_deliveries makes it)."""
    return {
        "id": new_id("whd"),
        "tenant_id": envelope["tenantId"],
        "endpoint_id": endpoint_id,
        "event_id": envelope["id"],
        "event_type": envelope["type"],
        "status": PENDING,
        "attempt_count": 0,
        "next_attempt_at": now,
        "lease_until": None,
        "replay_of": None,
        "created_at": now,
        "updated_at": now,
    }


def _unfinished(conn: sa.Connection, event_id: str) -> list[str]:
    now = utcnow()
    return list(
        conn.scalars(
            sa.select(Delivery.id).where(
                Delivery.event_id == event_id,
                Delivery.status.in_((PENDING, RETRYING)),
                sa.or_(Delivery.lease_until.is_(None), Delivery.lease_until < now),
                Delivery.next_attempt_at <= now,
            )
        )
    )


def handle_event(
    ctx: NotifierContext, body: bytes, metrics: NotifierMetrics | None = None
) -> list[str]:
    """Store one event once and fan it out, commit, hand off; returns the delivery ids.

    Raises MalformedEvent for a body that is not an event envelope.
    """
    (handled,) = store_events(ctx, [body], metrics)
    if handled.malformed is not None:
        raise MalformedEvent(handled.malformed)
    ctx.hand_off(handled.delivery_ids)
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
    """Exchange, dead-letter exchange and queue, the notifier's queue bound to every type."""
    declare_events_exchange(channel, names)
    channel.exchange_declare(names.dead_letter_exchange, exchange_type="fanout", durable=True)
    channel.queue_declare(names.notifier_dead_queue, durable=True)
    channel.queue_bind(names.notifier_dead_queue, names.dead_letter_exchange)
    channel.queue_declare(
        names.notifier_queue,
        durable=True,
        arguments={"x-dead-letter-exchange": names.dead_letter_exchange},
    )
    channel.queue_bind(names.notifier_queue, names.exchange, routing_key="#")


class _Backoff:
    def __init__(self) -> None:
        self.current = 0.0

    def next(self) -> float:
        self.current = BACKOFF_FIRST_S if not self.current else min(BACKOFF_MAX_S, self.current * 2)
        return self.current * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.current = 0.0


def run_consumer(
    engine: Engine, stop: threading.Event, *, ready: threading.Event | None = None
) -> None:
    """Consume until `stop`; reconnects to RabbitMQ with capped backoff."""
    ctx = engine.ctx
    names = engine.settings.names
    assert ctx.config.amqp_url
    params = pika.URLParameters(ctx.config.amqp_url)
    params.socket_timeout = 5
    params.client_properties = {
        "connection_name": f"settle notifier consumer {names.prefix}".strip()
    }
    backoff = _Backoff()
    batcher = _Batcher(engine)
    max_batch = max(1, min(engine.settings.prefetch, MAX_BATCH))
    while not stop.is_set():
        connection = None
        try:
            connection = pika.BlockingConnection(params)
            channel = connection.channel()
            declare_topology(channel, names)
            channel.basic_qos(prefetch_count=engine.settings.prefetch)
            backoff.reset()
            log.info("notifier consumer ready on %s", names.notifier_queue)
            if ready is not None:
                ready.set()
            batch: list[tuple[Basic.Deliver, bytes]] = []
            for method, props, body in channel.consume(
                names.notifier_queue, inactivity_timeout=IDLE_CHECK_S
            ):
                if method is not None and trust.admit(
                    channel, method, props, ctx.config.core_amqp_user, engine.metrics
                ):
                    assert body is not None
                    batch.append((method, body))
                    # Take what is already here, then store it in one transaction.
                    if len(batch) < max_batch and channel.get_waiting_message_count() > 0:
                        continue
                if batch:
                    batcher.process(channel, batch)
                    batch = []
                if stop.is_set():
                    break
        except (pika.exceptions.AMQPError, OSError) as err:
            delay = backoff.next()
            log.warning("RabbitMQ unavailable (%r); reconnecting in %.1fs", err, delay)
            stop.wait(delay)
        finally:
            if connection is not None and connection.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                    connection.close()


class _Batcher:
    """Stores a batch, hands off its deliveries, then settles every message of it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.db_backoff = _Backoff()

    def process(self, channel: BlockingChannel, batch: list[tuple[Basic.Deliver, bytes]]) -> None:
        ctx, metrics = self.engine.ctx, self.engine.metrics
        try:
            results = store_events(ctx, [body for _, body in batch], metrics)
        except (sa.exc.DataError, sa.exc.IntegrityError):
            # Something in the batch is refused by the database every time: find it.
            if len(batch) > 1:
                for one in batch:
                    self.process(channel, [one])
                return
            method, body = batch[0]
            log.error("dead-lettered an event the database refuses; body=%r", body[:200])
            channel.basic_reject(method.delivery_tag, requeue=False)
            return
        except Exception:
            delay = self.db_backoff.next()
            log.exception("%d events not stored; requeued, pausing %.1fs", len(batch), delay)
            channel.basic_nack(batch[-1][0].delivery_tag, multiple=True, requeue=True)
            channel.connection.sleep(delay)
            return
        self.db_backoff.reset()
        ids: list[str] = []
        for (method, body), handled in zip(batch, results, strict=True):
            if handled.malformed is not None:
                log.error(
                    "dead-lettered a malformed event message (%s); body=%r",
                    handled.malformed,
                    body[:200],
                )
                channel.basic_reject(method.delivery_tag, requeue=False)
            ids.extend(i for i in handled.delivery_ids if i not in ids)
        ctx.hand_off(ids)
        acked = [m for (m, _), h in zip(batch, results, strict=True) if h.malformed is None]
        if acked:
            channel.basic_ack(acked[-1].delivery_tag, multiple=True)
