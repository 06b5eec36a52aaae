"""Reading deposits: one by id, and pages of a tenant's deposits (newest first).

Every query is scoped to the tenant: another tenant's deposit is not found, exactly
as one that does not exist. Rows come back detached, for the schemas to render.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from services.core.deposits.models import Deposit
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


class DepositQueries:
    """The tenant-facing reads."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, tenant_id: str, deposit_id: str) -> Deposit:
        """The tenant's deposit, or `not_found`."""
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        with self.db.reader() as session:
            deposit = session.get(Deposit, deposit_id)
            if deposit is None or deposit.tenant_id != tenant_id:
                raise NotFound(f"no deposit {deposit_id}")
            return deposit

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
