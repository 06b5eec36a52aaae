"""The chain watcher's statements over deposits (`detection.py` decides what they do).

Bulk steps run in the caller's transaction on its driver connection, each compiled once
per database (`DriverStatement`): a block can hold hundreds of deposits, so a step is one
statement, not one per deposit, and array parameters keep its text the same whatever the
number of values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.core.deposits import states
from services.core.deposits.models import LIVE_SOURCE, TRANSFER_IDENTITY, Deposit, StrayTransfer
from services.core.models import DepositAccount, DepositAddress
from shared.db import (
    Database,
    DriverStatement,
    database_of,
    driver_connection,
    driver_rows,
    execute_json_rows,
    is_unique_violation,
    json_rows_insert,
)

_DEPOSITS: sa.Table = Deposit.__table__  # type: ignore[assignment]


def _insert_new_deposits(columns: Sequence[str]) -> sa.Insert:
    """New deposits (given column-wise), skipping transfers recorded already; returns the
    ids written."""
    return (
        json_rows_insert(_DEPOSITS, columns)
        .on_conflict_do_nothing(
            index_elements=list(TRANSFER_IDENTITY), index_where=sa.text(LIVE_SOURCE)
        )
        .returning(_DEPOSITS.c.id)
    )


#: What a deposit event's document reads (`deposit_document`), and the tenant.
_DOCUMENT_COLUMNS = (
    "id",
    "tenant_id",
    "account_id",
    "external_user_id",
    "status",
    "chain_id",
    "deposit_address",
    "asset",
    "token_address",
    "decimals",
    "amount_raw",
    "amount_usd",
    "fee_usd",
    "net_usd",
    "source_tx_hash",
    "log_index",
    "from_address",
    "block_number",
    "block_hash",
    "confirmations",
    "required_confirmations",
    "dest_chain_id",
    "dest_address",
    "dest_token_address",
    "route",
    "credit_tx_hash",
    "failure_reason",
    "review_reason",
    "wait_reason",
    "sandbox",
    "created_at",
    "updated_at",
    "confirmed_at",
    "credited_at",
)


def _array(name: str) -> sa.BindParameter[list[str]]:
    return sa.bindparam(name, type_=ARRAY(sa.String()))


#: Live deposits of some transactions (`Detection._live`).
_LIVE = sa.select(
    *[
        _DEPOSITS.c[c]
        for c in (
            "id",
            "status",
            "asset",
            "source_tx_hash",
            "token_address",
            "deposit_address",
            "transfer_seq",
            "block_number",
            "block_hash",
            "log_index",
            "required_confirmations",
        )
    ]
).where(
    _DEPOSITS.c.chain_id == sa.bindparam("chain_id"),
    _DEPOSITS.c.source_tx_hash == sa.any_(_array("tx_hashes")),
    _DEPOSITS.c.source_vanished_at.is_(None),
)

#: Accounts of deposit addresses (`Detection._open`).
_ACCOUNTS = (
    sa.select(
        DepositAddress.address,
        DepositAccount.pk,
        DepositAccount.id,
        DepositAccount.tenant_id,
        DepositAccount.external_user_id,
        DepositAccount.dest_chain_id,
        DepositAccount.dest_address,
        DepositAccount.dest_token_address,
    )
    .join(DepositAccount, DepositAccount.pk == DepositAddress.account_pk)
    .where(
        DepositAddress.chain_id == sa.bindparam("chain_id"),
        DepositAddress.address == sa.any_(_array("addresses")),
    )
)

#: Pending deposits of a supported token confirmed at finality; their documents.
_CONFIRM = (
    sa.update(_DEPOSITS)
    .where(
        _DEPOSITS.c.id == sa.any_(_array("ids")),
        _DEPOSITS.c.status == states.SOURCE_SEEN,
        _DEPOSITS.c.asset.is_not(None),
    )
    .values(
        status=states.SOURCE_CONFIRMED,
        confirmations=sa.bindparam("head", type_=sa.BigInteger()) - _DEPOSITS.c.block_number + 1,
        confirmed_at=sa.bindparam("now", type_=_DEPOSITS.c.confirmed_at.type),
        updated_at=sa.bindparam("now", type_=_DEPOSITS.c.updated_at.type),
    )
    .returning(*[_DEPOSITS.c[c] for c in _DOCUMENT_COLUMNS])
)


#: Deposits waiting for finality (`Detection.pending`).
_PENDING = (
    sa.select(
        _DEPOSITS.c.id,
        _DEPOSITS.c.block_number,
        _DEPOSITS.c.block_hash,
        _DEPOSITS.c.confirmations,
        _DEPOSITS.c.required_confirmations,
    )
    .where(
        _DEPOSITS.c.status == states.SOURCE_SEEN,
        _DEPOSITS.c.chain_id == sa.bindparam("chain_id"),
        _DEPOSITS.c.sandbox.is_(False),
    )
    .order_by(_DEPOSITS.c.block_number, _DEPOSITS.c.id)
    .limit(sa.bindparam("limit", type_=sa.Integer()))
)


def _statement(session: Session, name: str, statement: sa.Executable) -> DriverStatement:
    """`statement` compiled once for the session's database (see DriverStatement)."""
    db = database_of(session)
    assert db is not None
    return db.attachment(f"deposits.{name}", lambda d: d.driver_statement(statement))


def _any(values: Iterable[str]) -> sa.BindParameter[list[str]]:
    """One array parameter (`= ANY(...)`): the statement text stays the same whatever the
    number of values, so the driver parses it once."""
    return sa.bindparam(None, list(values), type_=ARRAY(sa.String()))


# --- the watcher's bulk steps (in the caller's transaction) -------------------------------


def live(session: Session, chain_id: int, tx_hashes: Iterable[str]) -> list[Any]:
    """The live deposits of these transactions (rows: `_LIVE`'s columns)."""
    return driver_rows(
        driver_connection(session),
        _statement(session, "live", _LIVE),
        {"chain_id": chain_id, "tx_hashes": sorted(tx_hashes)},
    )


def accounts_of(session: Session, chain_id: int, addresses: Sequence[str]) -> list[Any]:
    """The accounts of these deposit addresses (EIP-55), with each address (rows)."""
    return driver_rows(
        driver_connection(session),
        _statement(session, "accounts", _ACCOUNTS),
        {"chain_id": chain_id, "addresses": list(addresses)},
    )


def insert_new(session: Session, rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """New deposits (dicts keyed by column, all with the same columns), skipping
    transfers recorded already (another watcher may record the same ones at the same
    time: the identity index lets one through); the ids written."""
    if not rows:
        return set()
    columns = tuple(rows[0])
    statement = _statement(
        session, f"insert_new_many:{','.join(columns)}", _insert_new_deposits(columns)
    )
    return {returned[0] for returned in execute_json_rows(session, statement, rows)}


def move(session: Session, deposit_id: str, values: Mapping[str, Any]) -> None:
    """Set a deposit's columns (its transfer was found in another block)."""
    session.execute(sa.update(Deposit).where(Deposit.id == deposit_id).values(**values))


def confirm_pending(
    session: Session, deposit_ids: Sequence[str], head: int, now: datetime
) -> list[Any]:
    """`source_seen` deposits of a supported token -> `source_confirmed`, confirmations
    as of `head`; the rows of those confirmed (`_DOCUMENT_COLUMNS`)."""
    return driver_rows(
        driver_connection(session),
        _statement(session, "confirm", _CONFIRM),
        {"ids": list(deposit_ids), "head": head, "now": now},
    )


def lock_pending_unsupported(session: Session, deposit_ids: Sequence[str]) -> list[Deposit]:
    """Of these deposits, the `source_seen` ones of a token the chain does not support,
    locked for this transaction."""
    return list(
        session.scalars(
            sa.select(Deposit)
            .where(
                Deposit.id == sa.any_(_any(deposit_ids)),
                Deposit.status == states.SOURCE_SEEN,
                Deposit.asset.is_(None),
            )
            .with_for_update()
        )
    )


def insert_strays(session: Session, rows: Sequence[Mapping[str, Any]]) -> int:
    """Transfers of unknown tokens kept for ops (each once); how many were new."""
    result = session.execute(
        pg_insert(StrayTransfer.__table__)
        .values(list(rows))
        .on_conflict_do_nothing(constraint="uq_stray_transfer")
    )
    return max(result.rowcount, 0)  # type: ignore[attr-defined]


def set_confirmations(
    session: Session, deposit_ids: Sequence[str], count: int, now: datetime
) -> None:
    """The confirmation count of deposits still `source_seen` (one statement)."""
    session.execute(
        sa.update(_DEPOSITS)
        .where(
            _DEPOSITS.c.id == sa.any_(_any(deposit_ids)), _DEPOSITS.c.status == states.SOURCE_SEEN
        )
        .values(confirmations=count, updated_at=now)
    )


# --- reads of their own ----------------------------------------------------------------------


def pending(db: Database, chain_id: int, limit: int) -> list[Any]:
    """Deposits of a chain (not sandbox) waiting for finality, oldest block first (rows:
    `_PENDING`'s columns)."""
    statement = db.attachment("deposits.pending", lambda d: d.driver_statement(_PENDING))
    with db.driver_autocommit(writes=False) as conn:
        return driver_rows(conn, statement, {"chain_id": chain_id, "limit": limit})


def settled_above(db: Database, chain_id: int, fork_from: int) -> list[Any]:
    """Deposits past `source_seen` recorded at or above a height (id, status, block)."""
    with db.reader() as session:
        return list(
            session.execute(
                sa.select(
                    Deposit.id, Deposit.status, Deposit.block_number, Deposit.block_hash
                ).where(
                    Deposit.chain_id == chain_id,
                    Deposit.sandbox.is_(False),
                    Deposit.block_number >= fork_from,
                    Deposit.status != states.SOURCE_SEEN,
                    Deposit.source_vanished_at.is_(None),
                )
            )
        )


# --- single deposits (sandbox, tests) ------------------------------------------------------


def account_at(
    session: Session, chain_id: int, address: str, *, tenant_id: str | None = None
) -> DepositAccount | None:
    """The account a deposit address belongs to (only the tenant's, when given)."""
    stmt = (
        sa.select(DepositAccount)
        .join(DepositAddress, DepositAccount.pk == DepositAddress.account_pk)
        .where(DepositAddress.chain_id == chain_id, DepositAddress.address == address)
    )
    if tenant_id is not None:
        stmt = stmt.where(DepositAccount.tenant_id == tenant_id)
    return session.scalars(stmt).first()


def insert(session: Session, deposit: Deposit) -> bool:
    """Write one new deposit; False when its transfer is recorded already (another
    watcher recorded it first: the identity index)."""
    try:
        with session.begin_nested():
            session.add(deposit)
            session.flush()
    except IntegrityError as exc:
        if not is_unique_violation(exc):
            raise
        return False
    return True


def get(session: Session, deposit_id: str) -> Deposit | None:
    return session.get(Deposit, deposit_id)
