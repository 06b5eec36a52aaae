"""Events as received and their deliveries: store once, fan out, replay, recover, list.

The consumer and the HTTP API both come through here, and every delivery is made by
`fanout` (who gets one, what a new one looks like), whether an event arrived from
core, a tenant asked for a test, a replay or a recovery.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session, aliased

from services.notifier import fanout, ordering
from services.notifier.models import (
    FAILED,
    PENDING,
    RETRYING,
    SKIPPED,
    SUCCEEDED,
    Attempt,
    Delivery,
    StoredEvent,
    StoredEventId,
)
from services.notifier.webhook_endpoints import is_plausible_id
from shared import event_catalog, events
from shared.api import Page, field_error, keyset_page
from shared.audit.log import Change
from shared.db import Database, adopt, database_of, driver_connection
from shared.errors import Conflict, NotFound
from shared.ids import ulid
from shared.logs import plausible_request_id
from shared.timefmt import parse_iso, utcnow

#: Longest window of one recovery.
MAX_RECOVER_WINDOW = timedelta(days=30)
#: Most deliveries one recovery makes; call again to continue (done ones are skipped).
MAX_RECOVER_BATCH = 1000
#: The message of a `webhook.test` event.
TEST_MESSAGE = "Test delivery from Settle"


#: Every column of a stored event (all bound: no Python-side default).
_EVENT_COLUMNS = (
    "id",
    "tenant_id",
    "event_type",
    "body",
    "created_at",
    "received_at",
    "request_id",
    "account_id",
    "sequence",
)
#: Longest account id an event may name to be ordered (core's are `acc_` + a ULID).
MAX_ACCOUNT_ID = 40
#: Largest `sequence` (a BIGINT).
MAX_SEQUENCE = 2**63 - 1


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
    if not isinstance(envelope.get("livemode", True), bool):
        raise InvalidEvent("livemode is not a boolean")
    if len(envelope["tenantId"]) > 36:
        raise InvalidEvent("tenantId longer than 36 characters")
    try:
        parse_iso(envelope["createdAt"])
    except ValueError:
        raise InvalidEvent("createdAt is not an ISO 8601 timestamp") from None
    sequence = envelope.get("sequence")
    if sequence is not None and (
        isinstance(sequence, bool)
        or not isinstance(sequence, int)
        or not 0 < sequence <= MAX_SEQUENCE
    ):
        raise InvalidEvent("sequence must be a positive integer")
    return envelope


def ordered_as(envelope: dict[str, Any]) -> tuple[str, int] | None:
    """(account id, sequence) of an event that has both (a `parse_envelope` result), else
    None: the key and place its deliveries to an ordered endpoint take."""
    sequence = envelope.get("sequence")
    account = events.account_of(envelope["data"])
    if sequence is None or account is None or len(account) > MAX_ACCOUNT_ID:
        return None
    return account, sequence


def event_row(
    envelope: dict[str, Any], body: bytes, now: datetime, request_id: str | None = None
) -> dict[str, Any]:
    """The stored event's columns: the body kept byte for byte (every delivery sends it),
    and the id of the request that caused it (None when unknown or implausible)."""
    order = ordered_as(envelope)
    return {
        "id": envelope["id"],
        "tenant_id": envelope["tenantId"],
        "event_type": envelope["type"],
        "body": body.decode("utf-8"),
        "created_at": parse_iso(envelope["createdAt"]),
        "received_at": now,
        "request_id": plausible_request_id(request_id),
        "account_id": None if order is None else order[0],
        "sequence": None if order is None else order[1],
    }


def _insert_event() -> sa.Insert:
    """Store an event once: a redelivered id inserts nothing (and returns no row).

    The id goes first into `notifier_event_ids`, unique across the events' partitions;
    the event row is written only when that id was new (one statement, a CTE).
    """
    table: sa.Table = StoredEvent.__table__  # type: ignore[assignment]
    seen = (
        postgresql.insert(StoredEventId)
        .values(id=sa.bindparam("id"), received_at=sa.bindparam("received_at"))
        .on_conflict_do_nothing(index_elements=["id"])
        .returning(StoredEventId.id)
        .cte("seen")
    )
    values = sa.select(
        *(sa.bindparam(name, type_=table.c[name].type) for name in _EVENT_COLUMNS)
    ).select_from(seen)
    return (
        sa.insert(StoredEvent)
        .from_select(list(_EVENT_COLUMNS), values)
        .add_cte(seen)
        .returning(StoredEvent.id)
    )


_INSERT_EVENT = _insert_event()


def store_event(
    session: Session, envelope_body: bytes, now: datetime | None = None
) -> StoredEvent | None:
    """Insert the event once; None when its id is already stored (a redelivery).

    Raises InvalidEvent for a body that is not an envelope.
    """
    row = event_row(parse_envelope(envelope_body), envelope_body, now or utcnow())
    db = database_of(session)
    assert db is not None, "a session of a shared.db.Database"
    if not insert_events(db, driver_connection(session), [row]):
        return None
    event = StoredEvent(**row)
    adopt(session, [event])
    return event


def insert_events(
    db: Database, conn: psycopg.Connection[Any], rows: list[dict[str, Any]]
) -> set[str]:
    """`event_row`s stored once, on a driver connection of `db`; the ids that were new."""
    statement = db.attachment("notifier.insert_event", lambda d: d.driver_statement(_INSERT_EVENT))
    new: set[str] = set()
    with conn.cursor() as cur:
        cur.executemany(statement.sql, [statement.bind(row) for row in rows], returning=True)
        while True:
            new.update(event_id for (event_id,) in cur.fetchall())
            if not cur.nextset():
                break
    return new


# -- deliveries asked for by name ---------------------------------------------------


def send_test(
    session: Session,
    tenant_id: str,
    endpoint_id: str,
    now: datetime | None = None,
    *,
    example_of: str | None = None,
) -> Delivery:
    """A `webhook.test` event and one delivery of it to this endpoint alone.

    With `example_of` (a catalog type), the event is the catalog's example `data` of
    that type instead, under a fresh id: never the example's, nor a durable
    `evt_dep_...` id a receiver may already have seen.
    """
    endpoint = fanout.sendable_endpoint(session, tenant_id, endpoint_id)
    now = now or utcnow()
    event_type, data = events.WEBHOOK_TEST, {"endpointId": endpoint.id, "message": TEST_MESSAGE}
    if example_of is not None and example_of != events.WEBHOOK_TEST:
        example = event_catalog.get(example_of).example["data"]
        event_type, data = example_of, example_ids(example)
    # A test, never money: `livemode: false`, an `evt_test_` id (delivered with
    # `x-service-test: 1`), and ids no real object has (issue 23).
    envelope = events.envelope(
        event_type,
        tenant_id,
        data,
        event_id=events.new_test_event_id(),
        created_at=now,
        livemode=False,
    )
    event = store_event(session, events.encode(envelope), now=now)
    assert event is not None  # a fresh ULID id cannot collide
    row = fanout.pending(tenant_id, event.id, event.event_type, endpoint.id, now)
    (delivery,) = fanout.create_deliveries(session, [row])
    return delivery


#: An object id as Settle makes them: a kind prefix, then a ULID (shared/ids.py).
_OBJECT_ID = re.compile(r"^([a-z]+)_[0-9A-HJKMNP-TV-Z]{26}$")


def example_ids(value: Any) -> Any:
    """A catalog example with each object id (`dep_01J...`) made one no real object has
    (`dep_example_01J...`, fresh each time), so a receiver can never match it to a real
    deposit or account."""
    if isinstance(value, dict):
        return {key: example_ids(item) for key, item in value.items()}
    if isinstance(value, list):
        return [example_ids(item) for item in value]
    if isinstance(value, str) and (match := _OBJECT_ID.match(value)):
        return f"{match.group(1)}_example_{ulid()}"
    return value


def replay(
    session: Session, tenant_id: str | None, delivery_id: str, now: datetime | None = None
) -> Delivery:
    """A new delivery of the same event (same id, same body) to the same endpoint, due now."""
    original = get_delivery(session, tenant_id, delivery_id)
    try:
        endpoint = fanout.sendable_endpoint(session, original.tenant_id, original.endpoint_id)
    except NotFound:
        raise Conflict(
            f"the endpoint of delivery {delivery_id} was deleted; nothing to replay to"
        ) from None
    row = fanout.pending(
        original.tenant_id,
        original.event_id,
        original.event_type,
        endpoint.id,
        now or utcnow(),
        replay_of=original.id,
    )
    (delivery,) = fanout.create_deliveries(session, [row])
    return delivery


def replayed(delivery: Delivery) -> Change:
    """The audit log's entry of a replay: the delivery replayed, and the new one."""
    after = {
        "deliveryId": delivery.id,
        "eventId": delivery.event_id,
        "eventType": delivery.event_type,
    }
    return Change("webhook_delivery.replayed", "webhook_delivery", delivery.replay_of, None, after)


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
    endpoint = fanout.sendable_endpoint(session, tenant_id, endpoint_id)
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
            # Skipped: kept while the endpoint was disabled (enabling it also sends them).
            sa.or_(failed.status == FAILED, failed.status == SKIPPED),
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
        fanout.pending(o.tenant_id, o.event_id, o.event_type, endpoint.id, now, replay_of=o.id)
        for o in latest.values()
    ]
    return fanout.create_deliveries(session, made)


# -- what a pair's deliveries say (settle reconcile) ---------------------------------


class DeliveryFacts(Protocol):
    """The columns of a delivery the rules below read (an ORM row or a Core row)."""

    id: str
    status: str
    replay_of: str | None
    created_at: datetime


def duplicate_originals(pair: Sequence[DeliveryFacts]) -> list[str]:
    """Ids of one (event, endpoint) pair's deliveries that are not replays, if more than one.

    Fan-out makes one delivery per pair; replays and recoveries name the delivery they
    repeat. Two originals mean the receiver got (or gets) the event twice. Sorted.
    """
    originals = sorted(d.id for d in pair if d.replay_of is None)
    return originals if len(originals) > 1 else []


def undelivered(pair: Sequence[DeliveryFacts], made_before: datetime) -> DeliveryFacts | None:
    """The pair's latest delivery when none succeeded and it was made before `made_before`.

    None when one succeeded, or when the latest is younger (still being tried).
    """
    if not pair or any(d.status == SUCCEEDED for d in pair):
        return None
    latest = max(pair, key=lambda d: (d.created_at, d.id))
    return latest if latest.created_at < made_before else None


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


def holders(session: Session, shown: Sequence[Delivery]) -> dict[str, str]:
    """For those of `shown` that wait for an earlier delivery of their ordered endpoint
    and account: the id of the one they wait for (ordering.py), in one query."""
    ids = [d.id for d in shown if d.order_key is not None and d.status in (PENDING, RETRYING)]
    if not ids:
        return {}
    return {
        delivery_id: holder
        for delivery_id, holder in session.execute(ordering.holders(ids))
        if holder is not None
    }


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
