"""The sweeper: enqueues again every delivery that is due and has no job in flight.

A delivery can be due with nobody working on it when the consumer died between
its commit and the enqueue, when a delayed retry message was lost with a worker,
or when a worker died mid-attempt (its lease lapses). Every `sweep_interval_s` the
sweeper finds deliveries overdue by more than `sweep_grace_s` whose lease is empty
or lapsed and enqueues them (a bounded batch, oldest first). A stale or duplicate
message is harmless: the actor's claim lets only one attempt run.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa

from services.notifier.models import PENDING, RETRYING, Delivery
from shared.db import Database
from shared.timefmt import utcnow

if TYPE_CHECKING:
    from services.notifier.engine import Engine

log = logging.getLogger(__name__)

#: PostgreSQL advisory lock key: one sweeper at a time across consumer processes.
SWEEP_LOCK_KEY = 0x5E77_1E5E


def due_deliveries(
    db: Database, *, grace_s: float, batch: int, now: datetime | None = None
) -> list[str]:
    """Ids of deliveries overdue by more than `grace_s` with no live lease, oldest first."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=grace_s)
    with db.transaction() as session:
        if session.get_bind().dialect.name == "postgresql":
            locked = session.scalar(
                sa.text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": SWEEP_LOCK_KEY}
            )
            if not locked:
                return []  # another consumer's sweeper is on it
        # Every unfinished delivery has a next_attempt_at (made due now), so the
        # (status, next_attempt_at) index serves this query.
        due_at = Delivery.next_attempt_at
        return list(
            session.scalars(
                sa.select(Delivery.id)
                .where(
                    Delivery.status.in_((PENDING, RETRYING)),
                    due_at <= cutoff,
                    sa.or_(Delivery.lease_until.is_(None), Delivery.lease_until < now),
                )
                .order_by(due_at)
                .limit(batch)
            )
        )


def sweep_once(engine: Engine, now: datetime | None = None) -> list[str]:
    """One round: find and enqueue; returns the ids enqueued."""
    settings = engine.settings
    ids = due_deliveries(
        engine.ctx.db, grace_s=settings.sweep_grace_s, batch=settings.sweep_batch, now=now
    )
    if ids:
        log.info("sweeper: %d due deliveries had no job in flight; enqueued", len(ids))
        engine.enqueue(ids)
        engine.metrics.swept.inc(len(ids))
    return ids


def run_sweeper(engine: Engine, stop: threading.Event) -> None:
    """Sweep every `sweep_interval_s` until `stop`; errors are logged, never fatal."""
    interval = engine.settings.sweep_interval_s
    while not stop.wait(interval):
        try:
            sweep_once(engine)
        except Exception:
            log.exception("sweep failed; trying again in %.1fs", interval)
