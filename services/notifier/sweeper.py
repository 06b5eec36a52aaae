"""The sweeper: enqueues again every delivery that is due and has no job in flight (and
deletes ephemeral endpoints whose time ran out: webhook_endpoints.expire_endpoints).

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
from collections.abc import Callable
from datetime import datetime, timedelta

import sqlalchemy as sa

from services.notifier import ordering, webhook_endpoints
from services.notifier.metrics import NotifierMetrics
from services.notifier.models import PENDING, RETRYING, Delivery
from shared.db import Database
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

#: PostgreSQL advisory lock key: one sweeper at a time across consumer processes.
SWEEP_LOCK_KEY = 0x5E77_1E5E


def due_deliveries(
    db: Database, *, grace_s: float, batch: int, now: datetime | None = None
) -> list[tuple[str, str, str]]:
    """(id, endpoint id, tenant id) of deliveries overdue by more than `grace_s` with no
    live lease, oldest first."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=grace_s)
    with db.transaction() as session:
        locked = session.scalar(
            sa.text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": SWEEP_LOCK_KEY}
        )
        if not locked:
            return []  # another consumer's sweeper is on it
        # Every unfinished delivery has a next_attempt_at (made due now), so the
        # (status, next_attempt_at) index serves this query.
        due_at = Delivery.next_attempt_at
        rows = session.execute(
            sa.select(Delivery.id, Delivery.endpoint_id, Delivery.tenant_id)
            .where(
                Delivery.status.in_((PENDING, RETRYING)),
                due_at <= cutoff,
                sa.or_(Delivery.lease_until.is_(None), Delivery.lease_until < now),
                # Not one held back by its ordered predecessor: that one's end sends it.
                sa.or_(Delivery.order_key.is_(None), ~ordering.held_by_earlier()),
            )
            .order_by(due_at)
            .limit(batch)
        )
        return [
            (delivery_id, endpoint_id, tenant_id) for delivery_id, endpoint_id, tenant_id in rows
        ]


class Sweeper:
    """Finds due deliveries with no job in flight and hands them to `enqueue`."""

    def __init__(
        self,
        db: Database,
        enqueue: Callable[..., None],
        metrics: NotifierMetrics,
        *,
        interval_s: float,
        grace_s: float,
        batch: int,
    ) -> None:
        self.db = db
        self.enqueue = enqueue
        self.metrics = metrics
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.batch = batch

    def sweep_once(self, now: datetime | None = None) -> list[str]:
        """One round: find and enqueue; returns the ids enqueued.

        Each job carries its delivery's route (endpoint, tenant), as the consumer's do:
        a delivery that waits in a worker for a slot of its tenant is due in the
        database with no lease (losing that memory must lose nothing), so the sweeper
        finds it too; with the route, a worker whose tenant is still full drops the
        repeat without a claim instead of claiming and putting back each one (a tenant
        held full by hanging endpoints had 500 claims every 5 s). A tenant's swept
        deliveries are one group (see broker.DeliveryQueues.enqueue).
        """
        with self.db.transaction() as session:
            expired = webhook_endpoints.expire_endpoints(session, now)
        if expired:
            log.info("sweeper: %d ephemeral endpoints expired; deleted", len(expired))
        found = due_deliveries(self.db, grace_s=self.grace_s, batch=self.batch, now=now)
        ids = [delivery_id for delivery_id, _, _ in found]
        if ids:
            log.info("sweeper: %d due deliveries had no job in flight; enqueued", len(ids))
            by_tenant: dict[str, list[str]] = {}
            for delivery_id, _, tenant_id in found:
                by_tenant.setdefault(tenant_id, []).append(delivery_id)
            self.enqueue(
                ids,
                {d: (endpoint_id, tenant_id) for d, endpoint_id, tenant_id in found},
                groups=list(by_tenant.values()),
            )
            self.metrics.swept.inc(len(ids))
        return ids

    def run(self, stop: threading.Event) -> None:
        """Sweep every `interval_s` until `stop`; errors are logged, never fatal."""
        while not stop.wait(self.interval_s):
            try:
                self.sweep_once()
            except Exception:
                log.exception("sweep failed; trying again in %.1fs", self.interval_s)
