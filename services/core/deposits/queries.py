"""Reading deposits: one by id, pages of a tenant's deposits (newest first), and one
deposit's timeline.

Every query is scoped to the tenant: another tenant's deposit is not found, exactly
as one that does not exist. Rows come back detached, for the schemas to render.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core.deposits import states
from services.core.deposits.models import Deposit
from services.core.models import DEPOSIT_ID_OF_EVENT, IS_DEPOSIT_STATUS_EVENT, OutboxEvent
from shared.api import Page, keyset_page
from shared.db import Database
from shared.errors import NotFound

#: What a deposit id looks like (anything else is not found without a query).
DEPOSIT_ID = re.compile(r"^dep_[0-9A-Z]{26}$")


@dataclass(frozen=True)
class DepositFilters:
    external_user_id: str | None = None
    status: str | None = None
    chain_id: int | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


@dataclass(frozen=True)
class Transition:
    """One status a deposit went through: when, and the event that recorded it."""

    status: str
    at: datetime
    event_id: str
    event_type: str


def timeline_statement(tenant_id: str, deposit_id: str) -> sa.Select[tuple[str, str, datetime]]:
    """The deposit's status events, oldest first, found through `ix_outbox_deposit_id`
    (each timeline partition's copy of it).

    Matched on the event's `data.deposit.id`, never on text in the body: another
    event (an account's metadata, say) may mention the id and is not the deposit's.
    """
    return (
        sa.select(OutboxEvent.event_id, OutboxEvent.event_type, OutboxEvent.created_at)
        .where(sa.text(IS_DEPOSIT_STATUS_EVENT))
        # Only the timeline's partitions are read (the outbox's others never hold one).
        .where(OutboxEvent.timeline == sa.true())
        .where(sa.literal_column(DEPOSIT_ID_OF_EVENT) == deposit_id)
        .where(OutboxEvent.tenant_id == tenant_id)
        .order_by(OutboxEvent.created_at, OutboxEvent.id)
    )


class DepositQueries:
    """The tenant-facing reads."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, tenant_id: str, deposit_id: str) -> Deposit:
        """The tenant's deposit, or `not_found`."""
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        with self.db.reader() as session:
            return _tenants(session, tenant_id, deposit_id)

    def timeline(self, tenant_id: str, deposit_id: str) -> list[Transition]:
        """Each status the tenant's deposit went through, with its time, or `not_found`.

        Read from the deposit's recorded events (the outbox keeps them), so each time is
        the one its event carried to receivers, late manual credits included.
        """
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        with self.db.reader() as session:
            _tenants(session, tenant_id, deposit_id)
            rows = session.execute(timeline_statement(tenant_id, deposit_id)).all()
        return [
            Transition(states.STATUS_OF_EVENT_TYPE[event_type], created_at, event_id, event_type)
            for event_id, event_type, created_at in rows
        ]

    def list_page(
        self, tenant_id: str, filters: DepositFilters, *, limit: int, cursor: str | None
    ) -> Page[Deposit]:
        """A page of the tenant's deposits, newest first."""
        stmt = sa.select(Deposit).where(Deposit.tenant_id == tenant_id)
        if filters.external_user_id is not None:
            stmt = stmt.where(Deposit.external_user_id == filters.external_user_id)
        if filters.status is not None:
            stmt = stmt.where(Deposit.status == filters.status)
        if filters.chain_id is not None:
            stmt = stmt.where(Deposit.chain_id == filters.chain_id)
        if filters.created_after is not None:
            stmt = stmt.where(Deposit.created_at >= filters.created_after)
        if filters.created_before is not None:
            stmt = stmt.where(Deposit.created_at < filters.created_before)
        with self.db.reader() as session:
            return keyset_page(session, stmt, Deposit.id, limit=limit, cursor=cursor)


def _tenants(session: Session, tenant_id: str, deposit_id: str) -> Deposit:
    """The deposit when it is the tenant's; another tenant's is not found, like none."""
    deposit = session.get(Deposit, deposit_id)
    if deposit is None or deposit.tenant_id != tenant_id:
        raise NotFound(f"no deposit {deposit_id}")
    return deposit
