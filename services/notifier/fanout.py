"""Fan-out: which endpoints get a delivery of an event, and the new delivery itself.

The one rule, used by every path that makes deliveries (the consumer, test sends,
replays, recoveries) and by `settle reconcile` to say which deliveries must exist:

- an event of type T of tenant X goes to X's endpoints that are **enabled**, **not
  deleted** and **subscribed to T** (`RECEIVING` + `subscribes`); a disabled endpoint
  subscribed to T gets a **skipped** delivery instead (`skipped`), which enabling it
  again sends (disabled_endpoints.py);
- a delivery asked for by name (test, replay, recover) goes to a live endpoint only
  if it is enabled: 404 when deleted (or another tenant's), 409 when disabled
  (`sendable_endpoint`);
- a new delivery is pending and due now (`pending`), the replay or recovery naming
  the delivery it repeats; to an endpoint ordering `per_account`, the delivery of an
  event about an account carries the account and the event's `sequence` (`order`),
  which the claim honours (delivery_store.py); replays, recoveries and tests do not;
- after the fact (`settle reconcile`), which endpoints must have received an event
  (`receivers`, `must_receive`).

The consumer's fan-out runs on the fast executor (`shared.db.Database.driver_*`):
one compiled statement per (tenant, type) of a batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.notifier.models import ENABLED, PENDING, PER_ACCOUNT, SKIPPED, Delivery, Endpoint
from services.notifier.webhook_endpoints import get_endpoint, live
from shared import subscriptions
from shared.db import Database, DriverStatement, adopt, database_of, driver_connection
from shared.errors import Conflict
from shared.ids import new_id

#: The endpoints that receive an event's deliveries (besides subscribing to its type).
RECEIVING: tuple[sa.ColumnElement[bool], ...] = (Endpoint.status == ENABLED, live())

#: A tenant's live endpoints, their types and status, for `subscribers`.
_SUBSCRIBERS = (
    sa.select(Endpoint.id, Endpoint.event_types, Endpoint.status, Endpoint.ordering)
    .where(Endpoint.tenant_id == sa.bindparam("tenant_id"), live())
    .order_by(Endpoint.id)
)
#: `last_error` of a delivery skipped because its endpoint is disabled.
ENDPOINT_DISABLED = "endpoint_disabled"

#: Every column of a new delivery (so no Python-side default is needed: see DriverStatement).
_DELIVERY_COLUMNS = (
    "id",
    "tenant_id",
    "endpoint_id",
    "event_id",
    "event_type",
    "status",
    "attempt_count",
    "next_attempt_at",
    "lease_until",
    "replay_of",
    "last_attempt_at",
    "last_response_status",
    "last_error",
    "succeeded_at",
    "created_at",
    "updated_at",
    "order_key",
    "order_seq",
)
_INSERT_DELIVERY = sa.insert(Delivery).values(
    {name: sa.bindparam(name) for name in _DELIVERY_COLUMNS}
)


def subscribes(event_types: Iterable[str] | None, event_type: str) -> bool:
    """True when an endpoint subscribed to `event_types` (types or patterns such as `*`
    and `deposit.*`) wants events of `event_type`."""
    # A tenant has a few endpoints (capped), so the test runs here rather than in SQL.
    return subscriptions.subscribes(event_types, event_type)


@dataclass(frozen=True, slots=True)
class Subscriber:
    """A live endpoint subscribed to an event's type, as fan-out needs it."""

    id: str
    #: An enabled one gets a pending delivery, a disabled one a skipped delivery.
    enabled: bool
    #: It orders deliveries per account (`pending`'s `order`).
    ordered: bool


def subscribers(
    db: Database, conn: psycopg.Connection[Any], tenant_id: str, event_type: str
) -> list[Subscriber]:
    """The tenant's live endpoints subscribed to `event_type`, in id order. Runs on
    `conn`, a driver connection of `db` (`driver_transaction()`)."""
    statement = _statements(db)["subscribers"]
    rows = conn.execute(statement.sql, statement.bind({"tenant_id": tenant_id}))
    return [
        Subscriber(endpoint_id, status == ENABLED, ordering == PER_ACCOUNT)
        for endpoint_id, types, status, ordering in rows
        if subscribes(types, event_type)
    ]


def pending(
    tenant_id: str,
    event_id: str,
    event_type: str,
    endpoint_id: str,
    now: datetime,
    *,
    replay_of: str | None = None,
    order: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """A new delivery's columns: pending, due now; `replay_of` the delivery it repeats;
    `order` the (account, sequence) it waits its turn by (deliveries.ordered_as)."""
    return {
        "id": new_id("whd"),
        "tenant_id": tenant_id,
        "endpoint_id": endpoint_id,
        "event_id": event_id,
        "event_type": event_type,
        "status": PENDING,
        "attempt_count": 0,
        "next_attempt_at": now,
        "lease_until": None,
        "replay_of": replay_of,
        "last_attempt_at": None,
        "last_response_status": None,
        "last_error": None,
        "succeeded_at": None,
        "created_at": now,
        "updated_at": now,
        "order_key": None if order is None else order[0],
        "order_seq": None if order is None else order[1],
    }


def skipped(
    tenant_id: str,
    event_id: str,
    event_type: str,
    endpoint_id: str,
    now: datetime,
    *,
    order: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """A delivery kept for a disabled endpoint: not due, sent once the endpoint is enabled
    (in order, when it has one)."""
    row = pending(tenant_id, event_id, event_type, endpoint_id, now, order=order)
    row.update(status=SKIPPED, next_attempt_at=None, last_error=ENDPOINT_DISABLED)
    return row


def insert_deliveries(
    db: Database, conn: psycopg.Connection[Any], rows: list[dict[str, Any]]
) -> None:
    """Write new deliveries (`pending` rows) on a driver connection of `db`, one round trip."""
    if not rows:
        return
    statement = _statements(db)["insert"]
    with conn.cursor() as cur:
        cur.executemany(statement.sql, [statement.bind(row) for row in rows])


def create_deliveries(session: Session, rows: list[dict[str, Any]]) -> list[Delivery]:
    """`insert_deliveries` in the session's transaction; the deliveries as ORM objects.

    For the API's paths (test, replay, recover), which render what they made.
    """
    db = database_of(session)
    assert db is not None, "a session of a shared.db.Database"
    insert_deliveries(db, driver_connection(session), rows)
    made = [Delivery(**row) for row in rows]
    adopt(session, made)
    return made


def sendable_endpoint(session: Session, tenant_id: str, endpoint_id: str) -> Endpoint:
    """A delivery asked for by name may go to this endpoint: 404 if gone, 409 if disabled."""
    endpoint = get_endpoint(session, tenant_id, endpoint_id)
    if endpoint.status != ENABLED:
        raise Conflict(f"webhook endpoint {endpoint_id} is disabled; enable it first (PATCH)")
    return endpoint


@dataclass(frozen=True, slots=True)
class Receiver:
    """An endpoint that receives deliveries today, and when it was made and last changed."""

    id: str
    tenant_id: str
    event_types: frozenset[str]
    created_at: datetime
    updated_at: datetime


def receivers(*where: sa.ColumnElement[bool]) -> sa.Select[Any]:
    """The query of the endpoints that receive deliveries (and `where`), as `Receiver` columns."""
    return sa.select(
        Endpoint.id,
        Endpoint.tenant_id,
        Endpoint.event_types,
        Endpoint.created_at,
        Endpoint.updated_at,
    ).where(*RECEIVING, *where)


def receiver(row: Any) -> Receiver:
    """A `Receiver` from a row of `receivers()`."""
    return Receiver(
        row.id, row.tenant_id, frozenset(row.event_types or ()), row.created_at, row.updated_at
    )


def must_receive(endpoint: Receiver, event_type: str, event_created_at: datetime) -> bool | None:
    """Must `endpoint` have a delivery of an event made at `event_created_at`? None: unknown.

    Endpoints keep no history, so today's state stands for the state at fan-out only
    when the endpoint was not touched after the event: one created at the event's
    millisecond or later need not have it; one changed then or later (PATCH, rotation,
    disable/enable) may have been different at fan-out, so it cannot be said.
    """
    if not subscribes(endpoint.event_types, event_type):
        return False
    if endpoint.created_at >= event_created_at:
        return False
    if endpoint.updated_at >= event_created_at:
        return None
    return True


def _statements(db: Database) -> dict[str, DriverStatement]:
    return db.attachment(
        "notifier.fanout",
        lambda d: {
            "subscribers": d.driver_statement(_SUBSCRIBERS),
            "insert": d.driver_statement(_INSERT_DELIVERY),
        },
    )
