"""The transactional outbox: events are rows written with the change that caused them.

`emit` adds the row to the caller's transaction; the relay (services/core/relay.py)
publishes committed rows. The relay is woken once the transaction has committed, by a
`NOTIFY settle_outbox` sent outside the writer's transaction
(services/core/outbox_wakeup.py: a NOTIFY inside it would serialise every writer's
commit).
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core import event_sequences
from services.core.models import DEPOSIT_STATUS_EVENT_TYPES, OutboxDurableId, OutboxEvent
from services.core.outbox_wakeup import NOTIFY_CHANNEL, request_wakeup
from shared import events, logs
from shared.db import Database, database_of, execute_json_rows, json_rows_insert
from shared.identity.sandbox import caller_is_sandbox, sandbox_tenants
from shared.timefmt import parse_iso, utcnow

__all__ = ["NOTIFY_CHANNEL", "emit", "emit_many"]

_OUTBOX: sa.Table = OutboxEvent.__table__  # type: ignore[assignment]
#: A Core INSERT built once: no ORM unit of work per event, compiled once and cached.
#: `inline()`: no implicit `RETURNING id` (nothing reads the new row's id).
_INSERT = _OUTBOX.insert().inline()
_COLUMNS = (
    "event_id",
    "event_type",
    "tenant_id",
    "body",
    "created_at",
    "request_id",
    "timeline",
)
_DURABLE: sa.Table = OutboxDurableId.__table__  # type: ignore[assignment]
#: Record a durable event id: a second one is a unique violation (emit).
_INSERT_DURABLE = _DURABLE.insert().inline()
#: Record many, skipping those written before; returns the new ones (emit_many).
_INSERT_NEW_DURABLE = (
    json_rows_insert(_DURABLE, ("event_id", "created_at"))
    .on_conflict_do_nothing(index_elements=["event_id"])
    .returning(_DURABLE.c.event_id)
)
_TIMELINE_TYPES = frozenset(DEPOSIT_STATUS_EVENT_TYPES)


def is_durable(event_id: str) -> bool:
    """A durable deposit event id (written at most once: `outbox_durable_ids`)."""
    return event_id.startswith(events.DURABLE_ID_PREFIX)


def insert_event_after(written: sa.CTE) -> sa.Insert:
    """INSERT one outbox row (a bind parameter per column, named as it) for each row of
    `written`, a data-modifying CTE, returning its event id: the event is stored exactly
    when what it reports was (for statements that write both at once)."""
    values = sa.select(
        *(sa.bindparam(column, type_=_OUTBOX.c[column].type) for column in _COLUMNS)
    ).select_from(written)
    return (
        _OUTBOX.insert()
        .from_select(list(_COLUMNS), values, include_defaults=False)
        .returning(_OUTBOX.c.event_id)
    )


@lru_cache(maxsize=64)
def _stored_time(created_at: str) -> datetime:
    # The envelope's createdAt as stored; a batch of events shares one.
    return parse_iso(created_at)


def event_row(
    event_type: str,
    tenant_id: str,
    data: dict[str, Any],
    *,
    event_id: str | None = None,
    created_at: datetime | None = None,
    sequence: int | None = None,
    livemode: bool | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A new event's envelope and the outbox row (column values) that stores it.

    `sequence`: the account's number for it (`emit` and `emit_many` take it; only the
    writer of an account's first event passes it, event_sequences.FIRST). `livemode`:
    false for a sandbox tenant; when not given, what the request's caller says (true
    outside a request).
    """
    if livemode is None:
        livemode = not caller_is_sandbox(tenant_id)
    envelope = events.envelope(
        event_type,
        tenant_id,
        data,
        event_id=event_id,
        created_at=created_at or utcnow(),
        sequence=sequence,
        livemode=livemode,
    )
    return envelope, row_of(envelope)


def row_of(envelope: dict[str, Any]) -> dict[str, Any]:
    """The outbox row storing `envelope`.

    The row carries the id of the request being served (None outside a request), so
    the request's log lines, the notifier's and each delivery attempt's share it.
    """
    return {
        "event_id": envelope["id"],
        "event_type": envelope["type"],
        "tenant_id": envelope["tenantId"],
        "body": events.encode_text(envelope),
        "created_at": _stored_time(envelope["createdAt"]),
        "request_id": logs.request_id(),
        # A deposit's status event: its timeline, kept longer (retention.py).
        "timeline": envelope["type"] in _TIMELINE_TYPES,
    }


def emit(
    session: Session,
    event_type: str,
    tenant_id: str,
    data: dict[str, Any],
    *,
    event_id: str | None = None,
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """Write an event in the caller's transaction and return its envelope.

    An event about a deposit account takes the account's next `sequence` (its lock is
    held to the commit: event_sequences). A durable event id already present raises
    IntegrityError here: the caller decides (pipeline steps treat it as "already
    emitted"), in a savepoint that gives the number back.
    """
    # The caller's pending ORM changes go first, as they did when the event was an
    # ORM object flushed with them (a no-op check when there are none).
    session.flush()
    created_at = created_at or utcnow()
    if event_id is not None and is_durable(event_id):
        # First, so a duplicate is refused before it takes the account's number.
        session.execute(_INSERT_DURABLE, {"event_id": event_id, "created_at": created_at})
    account = events.account_of(data)
    sequence = None if account is None else event_sequences.take(session, {account: 1})[account]
    envelope, row = event_row(
        event_type,
        tenant_id,
        data,
        event_id=event_id,
        created_at=created_at,
        sequence=sequence,
        livemode=not sandbox_tenants(session, {tenant_id}),
    )
    session.execute(_INSERT, row)
    request_wakeup(session)
    return envelope


#: INSERT_EVENT for many rows in one statement (`shared.db.json_rows_insert`); returns
#: the ids it wrote (emit_many drops durable ids written before, `_new_durable`).
INSERT_NEW_EVENTS = json_rows_insert(_OUTBOX, _COLUMNS).returning(_OUTBOX.c.event_id)


def emit_many(session: Session, envelopes: list[dict[str, Any]]) -> int:
    """Write many new events (`events.envelope`s, without `sequence`) in the caller's
    transaction, in their order.

    Unlike `emit`, an event id already present is skipped, not an error: bulk steps
    (the watcher recording a block's deposits) cannot take a savepoint per row. A
    durable id is skipped race-free (`outbox_durable_ids`); others by a look-up first.
    Events about deposit accounts are numbered: their accounts are locked first (in
    account order), the ids already written are then dropped (no other writer can add
    one of them while the locks are held), and the rest take their numbers; the rows go
    in one statement. Returns how many rows were written.
    """
    if not envelopes:
        return 0
    sandbox = sandbox_tenants(session, {e["tenantId"] for e in envelopes})
    for envelope in envelopes:
        if envelope["tenantId"] in sandbox:
            envelope["livemode"] = False  # in its place: the key exists already
    accounts = [events.account_of(e["data"]) for e in envelopes]
    if any(accounts):
        rows = _numbered_rows(session, envelopes, accounts)
    else:
        written = _written(session, [e["id"] for e in envelopes])
        rows = [row_of(e) for e in envelopes if e["id"] not in written]
    db = database_of(session)
    assert db is not None, "emit_many needs a session of a shared.db.Database"
    rows = _new_durable(session, db, rows)
    if not rows:
        return 0
    statement = db.attachment(
        "outbox.insert_new_events", lambda d: d.driver_statement(INSERT_NEW_EVENTS)
    )
    written = execute_json_rows(session, statement, rows)
    request_wakeup(session)
    return len(written)


def _written(session: Session, event_ids: list[str]) -> set[str]:
    """Those of the ids already in the outbox (`ix_outbox_event_id`)."""
    return set(
        session.scalars(sa.select(_OUTBOX.c.event_id).where(_OUTBOX.c.event_id.in_(event_ids)))
    )


def _new_durable(
    session: Session, db: Database, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The rows without those whose durable id was written before (the ids of the others
    recorded now, in one statement)."""
    durable = [
        {"event_id": r["event_id"], "created_at": r["created_at"]}
        for r in rows
        if is_durable(r["event_id"])
    ]
    if not durable:
        return rows
    statement = db.attachment(
        "outbox.insert_new_durable", lambda d: d.driver_statement(_INSERT_NEW_DURABLE)
    )
    new = {event_id for (event_id,) in execute_json_rows(session, statement, durable)}
    kept = []
    for row in rows:
        if is_durable(row["event_id"]):
            if row["event_id"] not in new:
                continue  # written before, or twice in this batch (the first one goes)
            new.discard(row["event_id"])
        kept.append(row)
    return kept


def _numbered_rows(
    session: Session, envelopes: list[dict[str, Any]], accounts: list[str | None]
) -> list[dict[str, Any]]:
    """The rows of the envelopes not written before, each account's numbered in order."""
    session.flush()
    event_sequences.lock(session, sorted({a for a in accounts if a is not None}))
    written = _written(session, [e["id"] for e in envelopes])
    fresh = [(e, a) for e, a in zip(envelopes, accounts, strict=True) if e["id"] not in written]
    counts: dict[str, int] = {}
    for _, account in fresh:
        if account is not None:
            counts[account] = counts.get(account, 0) + 1
    following = event_sequences.take(session, counts)
    rows = []
    for envelope, account in fresh:
        if account is not None:
            envelope = events.with_sequence(envelope, following[account])
            following[account] += 1
        rows.append(row_of(envelope))
    return rows
