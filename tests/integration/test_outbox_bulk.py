"""outbox.emit_many writes a batch in one statement (rows sent as JSON): every column
comes back exactly as given, and an event id already written is skipped."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from services.core import outbox
from services.core.models import OutboxEvent
from shared import events, logs
from shared.db import Database
from shared.timefmt import utcnow

#: Text a JSON round trip could bend: quotes, backslashes, escapes written out, control
#: characters, non-ASCII (two-byte, three-byte, outside the BMP), line separators.
AWKWARD = [
    'quote " and backslash \\ and slash /',
    "a written-out escape: \\u0000 \\n \\ud83d",
    "control \x01\x1f tab\t newline\n",
    "café 日本 😀 \u2028\u2029",
    "x" * 5000,
]


def test_a_batch_is_stored_exactly_and_ids_written_before_are_skipped(pg_db: Database) -> None:
    tenant = str(uuid.uuid4())
    now = utcnow()
    envelopes = [
        events.envelope(
            events.DEPOSIT_SOURCE_SEEN,
            tenant,
            {"deposit": {"id": f"dep_bulk_{i}", "note": text, "n": i, "f": 0.1 + i}},
            event_id=f"evt_bulk_{tenant}_{i}",
            created_at=now,
        )
        for i, text in enumerate(AWKWARD)
    ]
    with logs.request_scope("req-bulk-1"):
        rows = [outbox.row_of(e) for e in envelopes]  # what should be stored
        with pg_db.transaction() as session:
            assert outbox.emit_many(session, envelopes) == len(rows)
    again = events.envelope(events.WEBHOOK_TEST, tenant, {"message": "new"}, created_at=now)
    with pg_db.transaction() as session:
        # Two written before (skipped, as a redelivered durable event is), one new.
        assert outbox.emit_many(session, [envelopes[0], again, envelopes[1]]) == 1
    again_row = outbox.row_of(again)

    with pg_db.reader() as session:
        stored = {
            e.event_id: e
            for e in session.scalars(sa.select(OutboxEvent).where(OutboxEvent.tenant_id == tenant))
        }
    assert len(stored) == len(rows) + 1
    for row in [*rows, again_row]:
        event = stored[row["event_id"]]
        assert event.body == row["body"]
        assert event.event_type == row["event_type"]
        assert event.created_at == row["created_at"]
        assert event.request_id == row["request_id"]
    assert stored[rows[0]["event_id"]].request_id == "req-bulk-1"
    assert stored[again["id"]].request_id is None
    # Written in the order given (the relay publishes by id).
    ids = [stored[row["event_id"]].id for row in rows]
    assert ids == sorted(ids)
