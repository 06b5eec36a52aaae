"""The transactional outbox: events are rows written with the change that caused them.

`emit` adds the row to the caller's session; the relay (services/core/relay.py)
publishes committed rows. On PostgreSQL, `NOTIFY settle_outbox` in the same
transaction wakes the relay the moment the transaction commits.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core.models import OutboxEvent
from shared import events
from shared.timefmt import parse_iso, utcnow

#: PostgreSQL channel the relay LISTENs on.
NOTIFY_CHANNEL = "settle_outbox"
#: Session.info flag: the session wrote outbox rows (for the in-process wake-up).
WROTE_OUTBOX = "settle.wrote_outbox"


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

    A durable event id already present raises IntegrityError at flush: the caller
    decides (pipeline steps treat it as "already emitted").
    """
    created_at = created_at or utcnow()
    envelope = events.envelope(
        event_type, tenant_id, data, event_id=event_id, created_at=created_at
    )
    session.add(
        OutboxEvent(
            event_id=envelope["id"],
            event_type=event_type,
            tenant_id=tenant_id,
            body=events.encode(envelope).decode("utf-8"),
            created_at=parse_iso(envelope["createdAt"]),
        )
    )
    session.flush()
    session.info[WROTE_OUTBOX] = True
    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.text(f"NOTIFY {NOTIFY_CHANNEL}"))
    return envelope
