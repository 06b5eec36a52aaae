"""Deposit accounts: create (inheriting the policy at creation time), read, list, re-point.

Each write and its outbox event commit in one transaction (the caller's session).
An account's `address_index` is the BIP32 index of its deposit addresses: a number
of the accounts' sequence, never reused, so no two accounts (of any tenants) share an
address. Its `pk` is the sequence's value at insert: lists walk it in creation order.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import psycopg
import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.orm import Session

from services.core import deposit_keys, event_sequences, outbox
from services.core.chains import ChainRegistry
from services.core.destinations import Destination, validate_destination
from services.core.models import (
    ACCOUNT_SEQUENCE,
    DepositAccount,
    DepositAddress,
    DestinationPolicy,
)
from services.core.outbox_wakeup import wake_relay
from shared import events
from shared.api import Page, keyset_page
from shared.audit.log import Change, Recorder
from shared.db import Database, DriverStatement, after_fork_in_child
from shared.errors import AccountExists, DestinationPolicyMissing, NotFound
from shared.ids import new_id
from shared.timefmt import iso_ms, utcnow

ACTIVE = "active"

#: DESIGN.md limits.
EXTERNAL_USER_ID_MAX = 255
METADATA_MAX_KEYS = 50
METADATA_KEY_MAX = 40
METADATA_STRING_MAX = 500


class Deriver(Protocol):
    """Derives the deposit addresses of an account index (services/core/addresses.py)."""

    #: The key derived from, and its scheme: recorded with every address written.
    xpub: str
    scheme: str

    def derive(self, chain_id: int, index: int) -> str: ...

    def addresses(self, index: int, chain_ids: Iterable[int]) -> list[tuple[int, str]]: ...


@dataclass(frozen=True)
class NewAccount:
    """What POST /v1/deposit-accounts asks for, already shape-checked."""

    external_user_id: str
    destination: Destination | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


# --- input rules (pure) -------------------------------------------------------------


def _storable(text: str) -> bool:
    """PostgreSQL refuses NUL characters and lone surrogates: refuse them up front."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def external_user_id_problem(value: str) -> str | None:
    """Why `value` cannot be an externalUserId, or None when it can."""
    if not 1 <= len(value) <= EXTERNAL_USER_ID_MAX:
        return f"must be 1..{EXTERNAL_USER_ID_MAX} characters"
    if not value.isprintable() or not _storable(value):
        return "must contain only printable characters"
    if not value.strip():
        return "must not be only spaces"
    return None


def metadata_problems(value: dict[str, Any]) -> dict[str, list[str]]:
    """Problems of a metadata object by key ({} when it is fine).

    Values are flat: string (<= 500 chars), number, boolean or null. Nested objects
    and arrays are refused so metadata stays a simple, indexable key-value map.
    """
    problems: dict[str, list[str]] = {}
    if len(value) > METADATA_MAX_KEYS:
        problems["_schema"] = [f"at most {METADATA_MAX_KEYS} keys"]
    for key, item in value.items():
        if not 1 <= len(key) <= METADATA_KEY_MAX or not _storable(key):
            problems[key[:60]] = [f"keys must be 1..{METADATA_KEY_MAX} characters"]
        elif isinstance(item, str):
            if len(item) > METADATA_STRING_MAX:
                problems[key] = [f"string values are at most {METADATA_STRING_MAX} characters"]
            elif not _storable(item):
                problems[key] = ["string values must not contain NUL or unpaired surrogates"]
        elif isinstance(item, float) and not math.isfinite(item):
            problems[key] = ["numbers must be finite"]
        elif item is not None and not isinstance(item, bool | int | float):
            problems[key] = ["values must be a string, number, boolean or null (not nested)"]
    return problems


# --- rendering ----------------------------------------------------------------------


def deposit_addresses_document(
    registry: ChainRegistry, addresses: Iterable[tuple[int, str]]
) -> list[dict[str, Any]]:
    """`[{chainId, address, assets}]` for the addresses on active chains, in registry order."""
    by_chain = dict(addresses)
    out = []
    for chain in registry.chains:
        address = by_chain.get(chain.chain_id)
        if address is not None and chain.is_active:
            out.append(
                {
                    "chainId": chain.chain_id,
                    "address": address,
                    "assets": [a.symbol for a in chain.assets],
                }
            )
    return out


def _document(
    *,
    account_id: str,
    external_user_id: str,
    status: str,
    destination: Destination,
    deposit_addresses: list[dict[str, Any]],
    metadata: dict[str, Any],
    created_at: datetime,
    updated_at: datetime,
) -> dict[str, Any]:
    return {
        "id": account_id,
        "externalUserId": external_user_id,
        "status": status,
        "destination": destination.document(),
        "depositAddresses": deposit_addresses,
        "metadata": metadata,
        "createdAt": iso_ms(created_at),
        "updatedAt": iso_ms(updated_at),
    }


def account_destination(account: DepositAccount) -> Destination:
    return Destination(account.dest_chain_id, account.dest_address, account.dest_token_address)


def account_document(account: DepositAccount, registry: ChainRegistry) -> dict[str, Any]:
    """The wire form of a stored account (GET, events)."""
    return _document(
        account_id=account.id,
        external_user_id=account.external_user_id,
        status=account.status,
        destination=account_destination(account),
        deposit_addresses=deposit_addresses_document(
            registry, ((a.chain_id, a.address) for a in account.addresses)
        ),
        metadata=dict(account.metadata_ or {}),
        created_at=account.created_at,
        updated_at=account.updated_at,
    )


# --- use cases ----------------------------------------------------------------------


def create_account(
    db: Database,
    registry: ChainRegistry,
    deriver: Deriver,
    tenant_id: str,
    new: NewAccount,
    *,
    api_key_id: str | None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Create an account, its deposit addresses and `deposit.account.created`; the document.

    Without a destination the tenant's policy is copied as it is now. A taken
    externalUserId is 409 `account_exists` (the unique key decides, so concurrent
    creations cannot both win). On the fast executor (`Database.driver_autocommit`),
    one statement writes the account, its addresses and the outbox row, atomic on its
    own (no BEGIN/COMMIT round trips). Its addresses' BIP32 index comes from this
    process's block of account numbers (`_IndexBlock`). A policy this process has read
    before is written as the statement finds it or not at all: when the row has changed
    since, nothing is written and the creation reads the policy again and writes
    with it (`_PolicyCopies`). So the usual creation is one round trip after the key's.
    """
    if new.destination is not None:
        validate_destination(registry, new.destination)
    key = deposit_keys.recorded(db, deriver.xpub, deriver.scheme)
    creation = _creation(db, registry.active_positions, key.id)
    try:
        with db.driver_autocommit() as conn:
            index = creation.indices.take(conn)
            derived = deriver.addresses(index, (c.chain_id for c in registry.active()))
            draft = _AccountDraft.new(tenant_id, new, api_key_id, now, derived, index)
            if new.destination is not None:
                document = draft.write(conn, creation.write, new.destination, registry)
            else:
                document = _write_with_policy(conn, creation, registry, draft)
    except psycopg.errors.UniqueViolation as exc:
        raise _account_exists(exc, new) from None
    wake_relay(db)
    return document


def _write_with_policy(
    conn: psycopg.Connection[Any],
    creation: _Creation,
    registry: ChainRegistry,
    draft: _AccountDraft,
) -> dict[str, Any]:
    """Write `draft` with the tenant's policy as its destination, as the policy is now."""
    tenant_id = draft.tenant_id
    known = creation.policies.get(tenant_id)
    if known is not None:
        registry.require_active(known.chain_id)  # a chain may have been retired since
        document = draft.write(conn, creation.write_if_policy_is, known, registry)
        if document is not None:
            return document
    # Not read yet in this process, or changed since: read it, then write what was read.
    row = conn.execute(creation.read_policy.sql, {"tenant_id": tenant_id}).fetchone()
    if row is None:
        creation.policies.forget(tenant_id)
    policy = _policy_destination(registry, row)
    creation.policies.put(tenant_id, policy)
    document = draft.write(conn, creation.write, policy, registry)
    if document is None:  # an unconditional write returns its row or raises
        raise RuntimeError("the account's write returned no row")
    return document


def _policy_destination(registry: ChainRegistry, policy: tuple[Any, ...] | None) -> Destination:
    """The tenant's policy as a destination; 422 when there is none."""
    if policy is None:
        raise DestinationPolicyMissing(
            "give a destination or configure the destination policy "
            "(PUT /v1/destination-policy) first"
        )
    chain_id, address, token_address = policy
    # The policy was checked when written; its chain may have been retired since.
    registry.require_active(chain_id)
    return Destination(chain_id, address, token_address)


@dataclass(frozen=True)
class _AccountDraft:
    """A new account's own values; its destination is given at `write`."""

    tenant_id: str
    account_id: str
    external_user_id: str
    api_key_id: str | None
    metadata: dict[str, Any]
    created_at: datetime
    #: (chain id, address) per active chain, in the chains file's order.
    derived: list[tuple[int, str]]
    #: The BIP32 index the addresses were derived at.
    address_index: int

    @classmethod
    def new(
        cls,
        tenant_id: str,
        new: NewAccount,
        api_key_id: str | None,
        now: datetime | None,
        derived: list[tuple[int, str]],
        address_index: int,
    ) -> _AccountDraft:
        now = now or utcnow()
        if now.tzinfo is None:
            raise ValueError("naive datetime given for an account's timestamps")
        return cls(
            tenant_id=tenant_id,
            account_id=new_id("acc"),
            external_user_id=new.external_user_id,
            api_key_id=api_key_id,
            metadata=new.metadata,
            created_at=now,
            derived=derived,
            address_index=address_index,
        )

    def write(
        self,
        conn: psycopg.Connection[Any],
        statement: DriverStatement,
        destination: Destination,
        registry: ChainRegistry,
    ) -> dict[str, Any] | None:
        """Run one of the write statements with `destination`: the account's document, or
        None when the statement's condition held back the write."""
        document = _document(
            account_id=self.account_id,
            external_user_id=self.external_user_id,
            status=ACTIVE,
            destination=destination,
            deposit_addresses=deposit_addresses_document(registry, self.derived),
            metadata=self.metadata,
            created_at=self.created_at,
            updated_at=self.created_at,
        )
        _, event = outbox.event_row(
            events.ACCOUNT_CREATED,
            self.tenant_id,
            {"depositAccount": document},
            sequence=event_sequences.FIRST,
        )
        params = {
            **event,
            "account_id": self.account_id,
            "account_external_user_id": self.external_user_id,
            "account_dest_chain_id": destination.chain_id,
            "account_dest_address": destination.address,
            "account_dest_token_address": destination.token_address,
            "account_dest_set_by_key_id": self.api_key_id,
            "account_metadata": Jsonb(self.metadata),
            "account_created_at": self.created_at,
            "account_address_index": self.address_index,
        }
        for n, (_, address) in enumerate(self.derived):
            params[f"address_{n}"] = address
        if conn.execute(statement.sql, params).fetchone() is None:
            return None
        return document


#: The unique key that makes a taken externalUserId a 409.
_TENANT_USER_KEY = "uq_account_tenant_user"


def _account_exists(exc: psycopg.errors.UniqueViolation, new: NewAccount) -> AccountExists:
    """409 for a taken externalUserId; any other database error is re-raised."""
    # Only this key means "taken" (an address collision would be a bug, not a 409).
    if exc.diag.constraint_name != _TENANT_USER_KEY:
        raise exc
    return AccountExists(f"an account with externalUserId {new.external_user_id!r} already exists")


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


def _account_query(tenant_id: str) -> sa.Select[tuple[DepositAccount]]:
    return sa.select(DepositAccount).where(DepositAccount.tenant_id == tenant_id)


def find_account(
    session: Session, tenant_id: str, external_user_id: str, *, lock: bool = False
) -> DepositAccount | None:
    """The tenant's account with this externalUserId (row-locked when `lock`)."""
    if external_user_id_problem(external_user_id) is not None:
        return None  # could never have been stored; also keeps NULs away from the database
    query = _account_query(tenant_id).where(DepositAccount.external_user_id == external_user_id)
    if lock:
        query = query.with_for_update()
    return session.scalars(query).one_or_none()


def get_account(
    session: Session, registry: ChainRegistry, tenant_id: str, external_user_id: str
) -> dict[str, Any]:
    """The account document, or 404 (also for another tenant's account)."""
    account = find_account(session, tenant_id, external_user_id)
    if account is None:
        raise NotFound(f"no deposit account with externalUserId {external_user_id!r}")
    return account_document(account, registry)


def list_accounts(
    session: Session,
    registry: ChainRegistry,
    tenant_id: str,
    *,
    limit: int,
    cursor: str | None,
    deposit_address: str | None = None,
) -> Page[dict[str, Any]]:
    """Newest first, keyset on pk: pages neither skip nor repeat while accounts are added.

    `deposit_address` (EIP-55, as stored): only the account owning it, through the
    addresses' unique index; another tenant's address finds nothing.
    """
    query = _account_query(tenant_id)
    if deposit_address is not None:
        owner = sa.select(DepositAddress.account_pk).where(
            DepositAddress.address == deposit_address
        )
        query = query.where(DepositAccount.pk.in_(owner))
    page = keyset_page(session, query, DepositAccount.pk, limit=limit, cursor=cursor)
    return Page([account_document(a, registry) for a in page.items], page.next_cursor)


def update_destination(
    session: Session,
    registry: ChainRegistry,
    tenant_id: str,
    external_user_id: str,
    destination: Destination,
    *,
    api_key_id: str | None,
    member_id: str | None = None,
    now: datetime | None = None,
    audit: Recorder | None = None,
) -> dict[str, Any]:
    """Re-point an account and emit `deposit.account.destination_updated`; the document.

    With `audit`, the change is recorded too (the destination before and after).

    The event names who acted: `apiKeyId` for a key; for a portal member `apiKeyId`
    is null and `memberId` names the member.

    The row is locked first, so of two concurrent changes the second reports the
    first's destination as its prior one. The same destination again is still a
    recorded change (and an event): the interface says the PATCH emits, unconditionally.
    """
    validate_destination(registry, destination)
    account = find_account(session, tenant_id, external_user_id, lock=True)
    if account is None:
        raise NotFound(f"no deposit account with externalUserId {external_user_id!r}")
    prior = account_destination(account)
    account.dest_chain_id = destination.chain_id
    account.dest_address = destination.address
    account.dest_token_address = destination.token_address
    account.dest_set_by_key_id = api_key_id
    account.updated_at = now or utcnow()
    document = account_document(account, registry)
    data: dict[str, Any] = {
        "depositAccount": document,
        "priorDestination": prior.document(),
        "apiKeyId": api_key_id,
    }
    if member_id is not None:
        data["memberId"] = member_id
    outbox.emit(session, events.ACCOUNT_DESTINATION_UPDATED, tenant_id, data)
    if audit is not None:
        audit(
            session,
            Change(
                "deposit_account.destination_updated",
                "deposit_account",
                account.id,
                before={
                    "externalUserId": account.external_user_id,
                    "destination": prior.document(),
                },
                after={
                    "externalUserId": account.external_user_id,
                    "destination": destination.document(),
                },
            ),
        )
    return document
