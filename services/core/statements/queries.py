"""The SQL of a statement: the period's totals per chain and token, and its deposits.

Both run in one read-only REPEATABLE READ transaction (`snapshot`), so the totals and
the listed deposits come from the same instant and always agree. The deposits are
read through a server-side cursor in batches (never all at once), in the order of
`ix_deposits_tenant_credited` (core_0009), which also covers every column the totals
sum: the opening totals over a tenant's whole history are an index-only scan.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from services.core.deposits.models import Deposit
from services.core.statements.period import Period
from shared.db import Database

#: Rows fetched per round trip from the server-side cursor.
BATCH_ROWS = 1000
#: A statement's transaction ends within this, whatever the database's load.
STATEMENT_TIMEOUT_MS = 120_000

_ZERO = Decimal(0)


@dataclass(frozen=True)
class Figures:
    """Sums over some credited deposits of one token (None USD figures count as 0)."""

    deposits: int = 0
    amount_raw: int = 0
    amount_usd: Decimal = _ZERO
    fee_usd: Decimal = _ZERO
    net_usd: Decimal = _ZERO

    def __add__(self, other: Figures) -> Figures:
        return Figures(
            self.deposits + other.deposits,
            self.amount_raw + other.amount_raw,
            self.amount_usd + other.amount_usd,
            self.fee_usd + other.fee_usd,
            self.net_usd + other.net_usd,
        )

    @classmethod
    def of(cls, deposit: Any) -> Figures:
        """One deposit's figures."""
        return cls(
            1,
            int(deposit.amount_raw),
            deposit.amount_usd or _ZERO,
            deposit.fee_usd or _ZERO,
            deposit.net_usd or _ZERO,
        )


@dataclass(frozen=True)
class TokenTotals:
    """A token's totals: before the period (opening), in it, and through it (closing)."""

    chain_id: int
    token_address: str
    asset: str | None
    decimals: int | None
    opening: Figures
    period: Figures

    @property
    def closing(self) -> Figures:
        return self.opening + self.period

    @property
    def key(self) -> tuple[int, str]:
        return (self.chain_id, self.token_address)


@contextmanager
def snapshot(db: Database) -> Iterator[sa.Connection]:
    """A read-only transaction that sees one instant, bounded in time."""
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        with conn.begin():
            conn.execute(sa.text(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}"))
            yield conn


def _credited(tenant_id: str, sandbox: bool, end: Any) -> list[sa.ColumnElement[bool]]:
    """The tenant's credited deposits (live or sandbox) credited before `end`."""
    return [
        Deposit.tenant_id == tenant_id,
        Deposit.sandbox.is_(sandbox),
        Deposit.credited_at.is_not(None),
        Deposit.credited_at < end,
    ]


def _sums(condition: sa.ColumnElement[bool]) -> list[Any]:
    raw = sa.cast(Deposit.amount_raw, sa.Numeric)
    return [
        sa.func.count().filter(condition),
        sa.func.sum(raw).filter(condition),
        sa.func.sum(Deposit.amount_usd).filter(condition),
        sa.func.sum(Deposit.fee_usd).filter(condition),
        sa.func.sum(Deposit.net_usd).filter(condition),
    ]


def _figures(values: tuple[Any, ...]) -> Figures:
    count, raw, usd, fee, net = values
    return Figures(int(count), int(raw or 0), usd or _ZERO, fee or _ZERO, net or _ZERO)


def totals_statement(tenant_id: str, sandbox: bool, period: Period) -> sa.Select[Any]:
    """Per chain and token: asset, decimals, then the opening and the period's sums."""
    before = Deposit.credited_at < period.start
    within = Deposit.credited_at >= period.start
    return (
        sa.select(
            Deposit.chain_id,
            Deposit.token_address,
            sa.func.max(Deposit.asset),
            sa.func.max(Deposit.decimals),
            *_sums(before),
            *_sums(within),
        )
        .where(*_credited(tenant_id, sandbox, period.end))
        .group_by(Deposit.chain_id, Deposit.token_address)
        .order_by(Deposit.chain_id, Deposit.token_address)
    )


def totals(conn: sa.Connection, tenant_id: str, sandbox: bool, period: Period) -> list[TokenTotals]:
    """Per chain and token, ordered so: the opening and the period's figures."""
    out = []
    for row in conn.execute(totals_statement(tenant_id, sandbox, period)):
        chain_id, token_address, asset, decimals, *sums = row
        opening, inside = _figures(tuple(sums[:5])), _figures(tuple(sums[5:]))
        out.append(TokenTotals(int(chain_id), token_address, asset, decimals, opening, inside))
    return out


#: What a statement shows of each deposit.
DEPOSIT_COLUMNS = (
    Deposit.id,
    Deposit.account_id,
    Deposit.external_user_id,
    Deposit.chain_id,
    Deposit.deposit_address,
    Deposit.asset,
    Deposit.token_address,
    Deposit.decimals,
    Deposit.amount_raw,
    Deposit.amount_usd,
    Deposit.fee_usd,
    Deposit.net_usd,
    Deposit.dest_chain_id,
    Deposit.dest_address,
    Deposit.dest_token_address,
    Deposit.credit_amount,
    Deposit.route,
    Deposit.source_tx_hash,
    Deposit.block_number,
    Deposit.block_hash,
    Deposit.log_index,
    Deposit.credit_tx_hash,
    Deposit.created_at,
    Deposit.credited_at,
)


def deposits(conn: sa.Connection, tenant_id: str, sandbox: bool, period: Period) -> Iterator[Any]:
    """The period's deposits, oldest credit first, fetched `BATCH_ROWS` at a time."""
    stmt = (
        sa.select(*DEPOSIT_COLUMNS)
        .where(*_credited(tenant_id, sandbox, period.end), Deposit.credited_at >= period.start)
        .order_by(Deposit.credited_at, Deposit.id)
        .execution_options(yield_per=BATCH_ROWS)
    )
    result = conn.execute(stmt)
    try:
        yield from result
    finally:
        result.close()
