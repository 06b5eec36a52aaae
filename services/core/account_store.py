"""Where deposit accounts are kept: account creation's statements and their state, and
the queries that find and list accounts.

Creation (`accounts.create_account` decides) runs on the fast executor
(`Database.driver_autocommit`): one statement writes the account, its addresses and the
outbox row, atomic on its own (no BEGIN/COMMIT round trips), compiled once per database
with what is fixed for the process written into its text. The addresses' BIP32 index
comes from this process's block of account numbers (`_IndexBlock`); the tenant's policy
as this process last read it is kept (`_PolicyCopies`) and only ever written on the
condition that the row still holds it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.orm import Session

from services.core import event_sequences, outbox
from services.core.destinations import Destination
from services.core.models import (
    ACCOUNT_SEQUENCE,
    DepositAccount,
    DepositAddress,
    DestinationPolicy,
)
from shared.api import Page, keyset_page
from shared.db import Database, DriverStatement, after_fork_in_child

ACTIVE = "active"

#: The unique key that makes a taken externalUserId a 409.
_TENANT_USER_KEY = "uq_account_tenant_user"


class ExternalUserIdTaken(Exception):
    """The tenant has an account with this externalUserId (its unique key said so)."""


def _table(model: type[Any]) -> sa.Table:
    table: sa.Table = model.__table__
    return table


# The hot path's statements, built once and compiled once per database (see `_creation`).
_ACCOUNTS = _table(DepositAccount)
_POLICIES = _table(DestinationPolicy)
_ADDRESSES = _table(DepositAddress)
#: Binds of the account row that are not their column's name prefixed with `account_`:
#: the tenant is the outbox row's (`tenant_id`, one value for both), and a new account's
#: `updated_at` is its `created_at`.
_ACCOUNT_BINDS = {"tenant_id": "tenant_id", "updated_at": "account_created_at"}
#: The account columns the write statement binds (`pk` is the sequence's, at insert).
_ACCOUNT_COLUMNS = (
    "id",
    "tenant_id",
    "external_user_id",
    "dest_chain_id",
    "dest_address",
    "dest_token_address",
    "dest_set_by_key_id",
    "metadata",
    "created_at",
    "updated_at",
    "address_index",
)
#: Account numbers a process draws from the sequence at once, for its addresses' indices.
INDEX_BLOCK = 64
#: Tenants' policies a process keeps a copy of (all are forgotten when it would keep more).
POLICY_COPIES_MAX = 10_000


class _IndexBlock:
    """This process's next BIP32 indices: account numbers drawn `INDEX_BLOCK` at a time.

    The account sequence hands out each number once, either as a pk (at insert) or as
    an index (here), so no two accounts share an index, older accounts (whose index is
    their pk) included. Numbers a process drew and did not use are a gap, never reused.
    A forked child draws its own, never its parent's (`after_fork_in_child`).
    """

    def __init__(self, sql: str) -> None:
        self._sql = sql
        self._free: deque[int] = deque()
        self._lock = threading.Lock()
        after_fork_in_child(self._forked)

    def _forked(self) -> None:
        # The parent's numbers are the parent's; its refill lock may be held.
        self._free, self._lock = deque(), threading.Lock()

    def take(self, conn: psycopg.Connection[Any]) -> int:
        """The next index; draws a block on `conn` when this process has none left."""
        while True:
            try:
                return self._free.popleft()
            except IndexError:
                with self._lock:
                    if not self._free:
                        self._free.extend(row[0] for row in conn.execute(self._sql))


class _PolicyCopies:
    """The destination policy this process last read, per tenant.

    A copy is only ever written on the condition that the policy row still holds
    exactly its values (`_Creation.write_if_policy_is`), so a stale copy costs two more
    round trips (the read and the write after the one that wrote nothing), never a
    wrong destination: a policy change applies to the very next creation, in every
    process.
    """

    def __init__(self) -> None:
        self._by_tenant: dict[str, Destination] = {}

    def get(self, tenant_id: str) -> Destination | None:
        return self._by_tenant.get(tenant_id)

    def forget(self, tenant_id: str) -> None:
        self._by_tenant.pop(tenant_id, None)

    def put(self, tenant_id: str, policy: Destination) -> None:
        if len(self._by_tenant) >= POLICY_COPIES_MAX:
            self._by_tenant = {}  # a bound, not a ranking: a forgotten copy costs one read
        self._by_tenant[tenant_id] = policy


@dataclass(frozen=True)
class _Creation:
    """A database's account-creation statements (`Database.driver_statement`) and state."""

    #: Reads the tenant's policy (no row when there is none).
    read_policy: DriverStatement
    #: The account (binds `account_<column>`, see `_ACCOUNT_BINDS`), its addresses
    #: (`address_<n>`) and the outbox row (binds named as its columns), in one statement.
    write: DriverStatement
    #: `write`, writing nothing (and returning no row) unless the tenant's policy row
    #: holds the account's destination.
    write_if_policy_is: DriverStatement
    indices: _IndexBlock
    policies: _PolicyCopies


def _creation(db: Database, chains: tuple[tuple[int, int], ...], key_id: int) -> _Creation:
    """Creation's statements and state for `db`, once per database, set of (chain id,
    position) of the active chains and deposit key."""
    return db.attachment(
        f"core.accounts.create.{chains}.{key_id}",
        lambda d: _compile_creation(d, chains, key_id),
    )


def _compile_creation(db: Database, chains: tuple[tuple[int, int], ...], key_id: int) -> _Creation:
    """The statements, with what is fixed for this process written into their text.

    Each parameter costs the client a dump per request, so what never changes is SQL
    text: the account sequence's name, the status, and each address row's chain id,
    position (fixed by the chains file for the process's life) and deposit key.
    """
    draw = sa.select(sa.func.nextval(sa.literal_column(_sql_text(ACCOUNT_SEQUENCE)))).select_from(
        sa.func.generate_series(sa.literal_column("1"), sa.literal_column(str(INDEX_BLOCK)))
    )
    read_policy = sa.select(
        _POLICIES.c.chain_id, _POLICIES.c.address, _POLICIES.c.token_address
    ).where(_POLICIES.c.tenant_id == sa.bindparam("tenant_id"))
    policy_holds = (
        sa.select(sa.literal_column("1"))
        .select_from(_POLICIES)
        .where(
            _POLICIES.c.tenant_id == sa.bindparam("tenant_id"),
            _POLICIES.c.chain_id == sa.bindparam("account_dest_chain_id"),
            _POLICIES.c.address == sa.bindparam("account_dest_address"),
            _POLICIES.c.token_address == sa.bindparam("account_dest_token_address"),
        )
        .exists()
    )
    creation = _Creation(
        read_policy=db.driver_statement(read_policy),
        write=db.driver_statement(_write_statement(chains, key_id, None)),
        write_if_policy_is=db.driver_statement(_write_statement(chains, key_id, policy_holds)),
        indices=_IndexBlock(db.driver_statement(draw).sql),
        policies=_PolicyCopies(),
    )
    for statement in (creation.read_policy, creation.write, creation.write_if_policy_is):
        if statement.fixed:
            # create_account passes its parameters as they are, without DriverStatement.bind.
            raise ValueError("account creation's statements must take every value as a parameter")
    return creation


def _sql_text(value: str) -> str:
    """`value` as an SQL string literal (for names and constants we write, not input)."""
    return "'" + value.replace("'", "''") + "'"


def _write_statement(
    chains: tuple[tuple[int, int], ...], key_id: int, condition: sa.ColumnElement[bool] | None
) -> sa.Executable:
    """INSERT the account (only when `condition` holds), then its addresses and the outbox
    row from what it inserted; returns the event id, or no row when nothing was written."""
    values = sa.select(
        *(
            sa.bindparam(_ACCOUNT_BINDS.get(c, f"account_{c}"), type_=_ACCOUNTS.c[c].type)
            for c in _ACCOUNT_COLUMNS
        ),
        sa.literal_column(_sql_text(ACTIVE)),
    )
    if condition is not None:
        values = values.where(condition)
    account = (
        _ACCOUNTS.insert()
        .from_select([*_ACCOUNT_COLUMNS, "status"], values, include_defaults=False)
        .returning(_ACCOUNTS.c.pk)
        .cte("new_account")
    )
    ctes: list[sa.CTE] = [account]
    if chains:  # no active chain (a chains file could say so): no address rows
        rows = [
            sa.select(
                account.c.pk,
                sa.literal_column(str(int(chain_id))),
                sa.bindparam(f"address_{n}", type_=_ADDRESSES.c.address.type),
                sa.literal_column(str(int(position))),
                sa.literal_column(str(int(key_id))),
            )
            for n, (chain_id, position) in enumerate(chains)
        ]
        addresses = _ADDRESSES.insert().from_select(
            ["account_pk", "chain_id", "address", "position", "key_id"],
            rows[0] if len(rows) == 1 else sa.union_all(*rows),
            include_defaults=False,
        )
        ctes.append(addresses.cte("new_addresses"))
    # Its first event is numbered FIRST: the account's numbering starts with it.
    ctes.append(event_sequences.first_after(account).cte("new_sequence"))
    return outbox.insert_event_after(account).add_cte(*ctes)


# --- creating ----------------------------------------------------------------------------


class Writer:
    """One creation's statements on one autocommit connection: each is atomic alone."""

    def __init__(self, conn: psycopg.Connection[Any], creation: _Creation) -> None:
        self._conn = conn
        self._creation = creation
        #: The tenants' policies as this process last read them.
        self.policies = creation.policies

    def take_index(self) -> int:
        """The next BIP32 index of this process's block of account numbers."""
        return self._creation.indices.take(self._conn)

    def read_policy(self, tenant_id: str) -> Destination | None:
        """The tenant's destination policy as it is now (None: it has none)."""
        row = self._conn.execute(self._creation.read_policy.sql, {"tenant_id": tenant_id})
        found = row.fetchone()
        if found is None:
            return None
        chain_id, address, token_address = found
        return Destination(chain_id, address, token_address)

    def write(
        self,
        *,
        event: Mapping[str, Any],
        account_id: str,
        external_user_id: str,
        destination: Destination,
        set_by_key_id: str | None,
        metadata: Mapping[str, Any],
        created_at: datetime,
        address_index: int,
        addresses: Sequence[str],
        if_policy_is: bool,
    ) -> bool:
        """Write the account, its addresses (the active chains', in order) and its event
        row (`outbox.event_row`, whose tenant is the account's); with `if_policy_is`,
        only when the tenant's policy row holds `destination` (False: nothing written).
        ExternalUserIdTaken when the tenant has that externalUserId already."""
        params: dict[str, Any] = {
            **event,
            "account_id": account_id,
            "account_external_user_id": external_user_id,
            "account_dest_chain_id": destination.chain_id,
            "account_dest_address": destination.address,
            "account_dest_token_address": destination.token_address,
            "account_dest_set_by_key_id": set_by_key_id,
            "account_metadata": Jsonb(dict(metadata)),
            "account_created_at": created_at,
            "account_address_index": address_index,
        }
        for n, address in enumerate(addresses):
            params[f"address_{n}"] = address
        creation = self._creation
        statement = creation.write_if_policy_is if if_policy_is else creation.write
        try:
            return self._conn.execute(statement.sql, params).fetchone() is not None
        except psycopg.errors.UniqueViolation as exc:
            # Only this key means "taken" (an address collision would be a bug, not a 409).
            if exc.diag.constraint_name != _TENANT_USER_KEY:
                raise
            raise ExternalUserIdTaken(external_user_id) from None


@contextmanager
def creating(db: Database, chains: tuple[tuple[int, int], ...], key_id: int) -> Iterator[Writer]:
    """A Writer for one creation, with the active chains' (chain id, position) and the
    deposit key its addresses are derived from."""
    creation = _creation(db, chains, key_id)
    with db.driver_autocommit() as conn:
        yield Writer(conn, creation)


# --- reading -----------------------------------------------------------------------------


def _account_query(tenant_id: str) -> sa.Select[tuple[DepositAccount]]:
    return sa.select(DepositAccount).where(DepositAccount.tenant_id == tenant_id)


def find(
    session: Session, tenant_id: str, external_user_id: str, *, lock: bool = False
) -> DepositAccount | None:
    """The tenant's account with this externalUserId (row-locked when `lock`)."""
    query = _account_query(tenant_id).where(DepositAccount.external_user_id == external_user_id)
    if lock:
        query = query.with_for_update()
    return session.scalars(query).one_or_none()


def page(
    session: Session,
    tenant_id: str,
    *,
    limit: int,
    cursor: str | None,
    deposit_address: str | None = None,
) -> Page[DepositAccount]:
    """Newest first, keyset on pk; only the account owning `deposit_address` (through
    the addresses' unique index) when given."""
    query = _account_query(tenant_id)
    if deposit_address is not None:
        owner = sa.select(DepositAddress.account_pk).where(
            DepositAddress.address == deposit_address
        )
        query = query.where(DepositAccount.pk.in_(owner))
    return keyset_page(session, query, DepositAccount.pk, limit=limit, cursor=cursor)
