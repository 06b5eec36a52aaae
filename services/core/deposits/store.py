"""Where deposits are kept: the row lock every step takes, and the worker's queues.

Queue queries return ids (each step then locks its row with `FOR UPDATE SKIP LOCKED`
and re-checks it) or detached rows (read, then used outside the session).
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core.deposits import states
from services.core.deposits.models import OPEN_DEPOSITS, Deposit
from shared.db import Database


def lock(session: Session, deposit_id: str, *, skip_locked: bool = False) -> Deposit | None:
    """The deposit, locked for this transaction (None: absent, or held by another worker
    with `skip_locked`)."""
    stmt = (
        sa.select(Deposit)
        .where(Deposit.id == deposit_id)
        .with_for_update(skip_locked=skip_locked)
        .execution_options(populate_existing=True)
    )
    return session.scalars(stmt).first()


#: A queued deposit with no due time is due at once.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _due(now: datetime) -> sa.ColumnElement[bool]:
    return sa.or_(Deposit.next_attempt_at.is_(None), Deposit.next_attempt_at <= now)


class DepositStore:
    """The worker's queue queries over one database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _ids(self, stmt: sa.Select[tuple[str]]) -> list[str]:
        with self.db.reader() as session:
            return list(session.scalars(stmt))

    def _detached(self, stmt: sa.Select[tuple[Deposit]]) -> list[Deposit]:
        """Rows read and detached (a reader's rollback would expire them)."""
        with self.db.reader() as session:
            rows = list(session.scalars(stmt))
            session.expunge_all()
            return rows

    def due_for_settlement(self, now: datetime, limit: int) -> list[str]:
        """Confirmed deposits to settle, and routed ones waiting for another route."""
        return self._ids(
            sa.select(Deposit.id)
            .where(
                Deposit.status.in_((states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED)),
                Deposit.provider_ref.is_(None),
                Deposit.settle_phase.is_(None),
                _due(now),
            )
            .order_by(Deposit.id)
            .limit(limit)
        )

    def due_for_poll(self, now: datetime, limit: int) -> list[str]:
        """In-flight credits whose route should be asked again (a hot-wallet payment in
        flight is `source_confirmed` with its `provider_ref`)."""
        return self._ids(
            sa.select(Deposit.id)
            .where(
                Deposit.status.in_((states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED)),
                Deposit.provider_ref.is_not(None),
                Deposit.settle_phase.is_(None),
                _due(now),
            )
            .order_by(Deposit.id)
            .limit(limit)
        )

    def interrupted(self, cutoff: datetime, limit: int) -> list[str]:
        """Deposits marked mid-call since before `cutoff` (the call never came back)."""
        return self._ids(
            sa.select(Deposit.id)
            .where(
                Deposit.status.in_((states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED)),
                Deposit.settle_phase.is_not(None),
                Deposit.updated_at <= cutoff,
            )
            .order_by(Deposit.id)
            .limit(limit)
        )

    def pending_sandbox(self, limit: int) -> list[Deposit]:
        """Sandbox deposits waiting for their simulated confirmations."""
        return self._detached(
            sa.select(Deposit)
            .where(Deposit.status == states.SOURCE_SEEN, Deposit.sandbox.is_(True))
            .order_by(Deposit.id)
            .limit(limit)
        )

    def next_work(self) -> tuple[datetime | None, datetime | None, bool]:
        """What the settlement loop has ahead without a new commit, in one read: the
        earliest due time of a queued deposit (settlement or poll; NULL counts as due at
        the epoch), the earliest mark of a deposit mid-call (it is interrupted
        `stuck_payment_s` later), and whether sandbox deposits wait for confirmations."""
        open_ = Deposit.status.in_((states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED))
        queued = sa.func.min(sa.func.coalesce(Deposit.next_attempt_at, _EPOCH)).filter(
            open_, Deposit.settle_phase.is_(None)
        )
        marked = sa.func.min(Deposit.updated_at).filter(open_, Deposit.settle_phase.is_not(None))
        sandbox = sa.func.count().filter(
            Deposit.status == states.SOURCE_SEEN, Deposit.sandbox.is_(True)
        )
        with self.db.reader() as session:
            due, mark, waiting = session.execute(
                sa.select(queued, marked, sandbox).where(
                    sa.text(OPEN_DEPOSITS),  # the open deposits' partial index
                    Deposit.status.in_(
                        (states.SOURCE_SEEN, states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED)
                    ),
                )
            ).one()
        return due, mark, bool(waiting)
