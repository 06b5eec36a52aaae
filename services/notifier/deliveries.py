"""Events as received and their deliveries: store once, fan out, replay, recover, list.

The engine (consumer, actors, sweeper) and the HTTP API both come through here, so
a delivery is made the same way whether an event arrived from core, a tenant asked
for a test, a replay or a recovery.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from services.notifier.endpoints import get_endpoint, is_plausible_id
from services.notifier.models import (
    DISABLED,
    ENABLED,
    FAILED,
    PENDING,
    RETRYING,
    SUCCEEDED,
    Attempt,
    Delivery,
    Endpoint,
    StoredEvent,
)
from shared import events
from shared.api import Page, field_error, keyset_page
from shared.errors import Conflict, NotFound
from shared.ids import new_id
from shared.timefmt import parse_iso, utcnow

#: Longest window of one recovery.
MAX_RECOVER_WINDOW = timedelta(days=30)
#: Most deliveries one recovery makes; call again to continue (done ones are skipped).
MAX_RECOVER_BATCH = 1000
#: The message of a `webhook.test` event.
TEST_MESSAGE = "Test delivery from Settle"


class InvalidEvent(ValueError):
    """A message body is not an event envelope; the message says what is wrong."""


# -- events -------------------------------------------------------------------------


def parse_envelope(body: bytes) -> dict[str, Any]:
    """The envelope in `body`, checked for the fields every delivery relies on."""
    try:
        envelope = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise InvalidEvent(f"not UTF-8 JSON: {err}") from None
    if not isinstance(envelope, dict):
        raise InvalidEvent("not a JSON object")
    for key in ("id", "type", "createdAt", "tenantId"):
        if not isinstance(envelope.get(key), str) or not envelope[key]:
            raise InvalidEvent(f"{key} missing or not a string")
    if not isinstance(envelope.get("data"), dict):
        raise InvalidEvent("data missing or not an object")
    if len(envelope["id"]) > 120 or not envelope["id"].startswith("evt_"):
        raise InvalidEvent("id must be evt_... and at most 120 characters")
    if envelope["type"] not in events.EVENT_TYPES:
        raise InvalidEvent(f"unknown event type {envelope['type']!r}")
    if len(envelope["tenantId"]) > 36:
        raise InvalidEvent("tenantId longer than 36 characters")
    try:
        parse_iso(envelope["createdAt"])
    except ValueError:
        raise InvalidEvent("createdAt is not an ISO 8601 timestamp") from None
    return envelope


def store_event(
    session: Session, envelope_body: bytes, now: datetime | None = None
) -> StoredEvent | None:
    """Insert the event once; None when its id is already stored (a redelivery).

    The body is kept byte for byte: every delivery of the event sends exactly it.
    Raises InvalidEvent for a body that is not an envelope.
    """
    envelope = parse_envelope(envelope_body)
    values = {
        "id": envelope["id"],
        "tenant_id": envelope["tenantId"],
        "event_type": envelope["type"],
        "body": envelope_body.decode("utf-8"),
        "created_at": parse_iso(envelope["createdAt"]),
        "received_at": now or utcnow(),
    }
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = (
        insert(StoredEvent)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["id"])
        .returning(StoredEvent)
    )
    return session.scalars(statement).one_or_none()


# -- fan-out ------------------------------------------------------------------------


def subscribed_endpoints(session: Session, tenant_id: str, event_type: str) -> list[Endpoint]:
    """The tenant's enabled, live endpoints subscribed to `event_type`."""
    rows = session.scalars(
        sa.select(Endpoint)
        .where(
            Endpoint.tenant_id == tenant_id,
            Endpoint.status == ENABLED,
            Endpoint.deleted_at.is_(None),
        )
        .order_by(Endpoint.id)
    )
    # A tenant has a few endpoints (capped), so the subscription test runs here,
    # the same on PostgreSQL and SQLite.
    return [e for e in rows if event_type in (e.event_types or [])]


def create_deliveries(
    session: Session,
    event: StoredEvent,
    endpoints: Sequence[Endpoint],
    *,
    replay_of: dict[str, str] | None = None,
    now: datetime | None = None,
) -> list[Delivery]:
    """One pending delivery, due now, per endpoint. `replay_of`: endpoint id -> delivery id."""
    now = now or utcnow()
    made = [
        _pending(
            event.tenant_id,
            event.id,
            event.event_type,
            endpoint.id,
            (replay_of or {}).get(endpoint.id),
            now,
        )
        for endpoint in endpoints
    ]
    session.add_all(made)
    session.flush()
    return made


def _pending(
    tenant_id: str,
    event_id: str,
    event_type: str,
    endpoint_id: str,
    replay_of: str | None,
    now: datetime,
) -> Delivery:
    return Delivery(
        id=new_id("whd"),
        tenant_id=tenant_id,
        endpoint_id=endpoint_id,
        event_id=event_id,
        event_type=event_type,
        status=PENDING,
        attempt_count=0,
        next_attempt_at=now,
        lease_until=None,
        replay_of=replay_of,
        created_at=now,
        updated_at=now,
    )


def _sendable_endpoint(session: Session, tenant_id: str, endpoint_id: str) -> Endpoint:
    """A live endpoint that may receive a delivery now (404 if gone, 409 if disabled)."""
    endpoint = get_endpoint(session, tenant_id, endpoint_id)
    if endpoint.status == DISABLED:
        raise Conflict(f"webhook endpoint {endpoint_id} is disabled; enable it first (PATCH)")
    return endpoint


def send_test(
    session: Session, tenant_id: str, endpoint_id: str, now: datetime | None = None
) -> Delivery:
    """A `webhook.test` event and one delivery of it to this endpoint alone."""
    endpoint = _sendable_endpoint(session, tenant_id, endpoint_id)
    now = now or utcnow()
    envelope = events.envelope(
        events.WEBHOOK_TEST,
        tenant_id,
        {"endpointId": endpoint.id, "message": TEST_MESSAGE},
        created_at=now,
    )
    event = store_event(session, events.encode(envelope), now=now)
    assert event is not None  # a fresh ULID id cannot collide
    (delivery,) = create_deliveries(session, event, [endpoint], now=now)
    return delivery


def replay(
    session: Session, tenant_id: str | None, delivery_id: str, now: datetime | None = None
) -> Delivery:
    """A new delivery of the same event (same id, same body) to the same endpoint, due now."""
    original = get_delivery(session, tenant_id, delivery_id)
    try:
        endpoint = _sendable_endpoint(session, original.tenant_id, original.endpoint_id)
    except NotFound:
        raise Conflict(
            f"the endpoint of delivery {delivery_id} was deleted; nothing to replay to"
        ) from None
    event = session.get(StoredEvent, original.event_id)
    assert event is not None  # foreign key
    (delivery,) = create_deliveries(
        session, event, [endpoint], replay_of={endpoint.id: original.id}, now=now
    )
    return delivery


def recover(
    session: Session,
    tenant_id: str,
    endpoint_id: str,
    since: datetime,
    until: datetime | None = None,
    now: datetime | None = None,
) -> list[Delivery]:
    """Send again every event whose delivery to this endpoint failed in [since, until).

    One new delivery per event (naming its latest failed delivery), oldest first, at
    most MAX_RECOVER_BATCH. An event that already has a delivery to this endpoint in
    flight or succeeded is skipped, so calling again never duplicates and continues
    where a capped call stopped.
    """
    now = now or utcnow()
    until = until or now
    if since >= until:
        raise field_error("until", "must be later than since")
    if until - since > MAX_RECOVER_WINDOW:
        raise field_error("until", f"at most {MAX_RECOVER_WINDOW.days} days after since")
    endpoint = _sendable_endpoint(session, tenant_id, endpoint_id)
    failed = aliased(Delivery, name="failed")
    settled = (
        sa.select(Delivery.id)
        .where(
            Delivery.endpoint_id == endpoint.id,
            Delivery.event_id == failed.event_id,
            Delivery.status.in_((PENDING, RETRYING, SUCCEEDED)),
        )
        .exists()
    )
    rows = session.scalars(
        sa.select(failed)
        .where(
            failed.tenant_id == tenant_id,
            failed.endpoint_id == endpoint.id,
            failed.status == FAILED,
            failed.created_at >= since,
            failed.created_at < until,
            ~settled,
        )
        .order_by(failed.created_at, failed.id)
    )
    latest: dict[str, Delivery] = {}
    for row in rows:
        # Rows come oldest first: an event keeps its first place and its latest failure.
        if row.event_id in latest or len(latest) < MAX_RECOVER_BATCH:
            latest[row.event_id] = row
    # The failed delivery names its event and type; the event row itself is not needed.
    made = [
        _pending(o.tenant_id, o.event_id, o.event_type, endpoint.id, o.id, now)
        for o in latest.values()
    ]
    session.add_all(made)
    session.flush()
    return made


# -- reading ------------------------------------------------------------------------


@dataclass(frozen=True)
class DeliveryFilters:
    endpoint_id: str | None = None
    event_id: str | None = None
    event_type: str | None = None
    status: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


def get_delivery(session: Session, tenant_id: str | None, delivery_id: str) -> Delivery:
    """The tenant's delivery (`tenant_id` None: any tenant's, for ops) or 404."""
    if not is_plausible_id(delivery_id):
        raise NotFound(f"no webhook delivery {delivery_id!r}")
    query = sa.select(Delivery).where(Delivery.id == delivery_id)
    if tenant_id is not None:
        query = query.where(Delivery.tenant_id == tenant_id)
    delivery = session.scalar(query)
    if delivery is None:
        raise NotFound(f"no webhook delivery {delivery_id}")
    return delivery


def list_deliveries(
    session: Session,
    tenant_id: str | None,
    filters: DeliveryFilters,
    *,
    limit: int,
    cursor: str | None = None,
) -> Page[Delivery]:
    """Deliveries matching every filter given, newest first (ids sort by creation)."""
    query = sa.select(Delivery)
    if tenant_id is not None:
        query = query.where(Delivery.tenant_id == tenant_id)
    if filters.endpoint_id is not None:
        query = query.where(Delivery.endpoint_id == filters.endpoint_id)
    if filters.event_id is not None:
        query = query.where(Delivery.event_id == filters.event_id)
    if filters.event_type is not None:
        query = query.where(Delivery.event_type == filters.event_type)
    if filters.status is not None:
        query = query.where(Delivery.status == filters.status)
    if filters.created_after is not None:
        query = query.where(Delivery.created_at >= filters.created_after)
    if filters.created_before is not None:
        query = query.where(Delivery.created_at < filters.created_before)
    return keyset_page(session, query, Delivery.id, limit=limit, cursor=cursor)


def attempts_of(session: Session, delivery_id: str) -> list[Attempt]:
    """Every attempt of a delivery, first first."""
    return list(
        session.scalars(
            sa.select(Attempt)
            .where(Attempt.delivery_id == delivery_id)
            .order_by(Attempt.number, Attempt.id)
        )
    )


def event_of(session: Session, delivery: Delivery) -> StoredEvent:
    event = session.get(StoredEvent, delivery.event_id)
    assert event is not None  # foreign key
    return event
