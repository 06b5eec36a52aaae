"""Deposit accounts: create (inheriting the policy at creation time), read, list, re-point.

Each write and its outbox event commit in one transaction (the caller's session).
An account's `pk` is the BIP32 index of its deposit addresses: a sequence value,
never reused, so no two accounts (of any tenants) share an address.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import psycopg
import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.orm import Session

from services.core import outbox
from services.core.chains import ChainRegistry
from services.core.destinations import Destination, validate_destination
from services.core.models import DepositAccount, DepositAddress, DestinationPolicy
from services.core.outbox_wakeup import wake_relay
from shared import events
from shared.api import Page, keyset_page
from shared.db import Database, DriverStatement
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
    """Derives the deposit address of an account index on a chain."""

    def derive(self, chain_id: int, index: int) -> str: ...


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
    creations cannot both win). Two round trips on the fast executor
    (`Database.driver_autocommit`): one draws the account's sequence value (its BIP32
    index) and reads the policy; the addresses are derived from it; then one statement
    writes the account, its addresses and the outbox row, atomic on its own (no
    BEGIN/COMMIT round trips).
    """
    active = registry.active()
    statements = _driver_statements(db, registry.active_positions)
    values = _new_account_values(registry, tenant_id, new, api_key_id, now)
    try:
        with db.driver_autocommit() as conn:
            start = statements.start
            pk, *policy = conn.execute(start.sql, {"tenant_id": tenant_id}).fetchone()
            destination = new.destination or _policy_destination(registry, policy)
            derived = [(chain.chain_id, deriver.derive(chain.chain_id, pk)) for chain in active]
            document = _created_document(values, destination, registry, derived)
            _, event = outbox.event_row(
                events.ACCOUNT_CREATED, tenant_id, {"depositAccount": document}
            )
            params = _write_params(pk, values, destination, derived, event)
            conn.execute(statements.write.sql, params)
    except psycopg.errors.UniqueViolation as exc:
        raise _account_exists(exc, new) from None
    wake_relay(db)
    return document


def _policy_destination(registry: ChainRegistry, policy: list[Any]) -> Destination:
    """The tenant's policy as a destination; 422 when there is none."""
    chain_id, address, token_address = policy
    if chain_id is None:
        raise DestinationPolicyMissing(
            "give a destination or configure the destination policy "
            "(PUT /v1/destination-policy) first"
        )
    # The policy was checked when written; its chain may have been retired since.
    registry.require_active(chain_id)
    return Destination(chain_id, address, token_address)


def _new_account_values(
    registry: ChainRegistry,
    tenant_id: str,
    new: NewAccount,
    api_key_id: str | None,
    now: datetime | None,
) -> dict[str, Any]:
    """The account row's own columns (the destination's come from it or the policy)."""
    if new.destination is not None:
        validate_destination(registry, new.destination)
    now = now or utcnow()
    if now.tzinfo is None:
        raise ValueError("naive datetime given for an account's timestamps")
    return {
        "id": new_id("acc"),
        "tenant_id": tenant_id,
        "external_user_id": new.external_user_id,
        "status": ACTIVE,
        "dest_set_by_key_id": api_key_id,
        "metadata": new.metadata,
        "created_at": now,
        "updated_at": now,
    }


#: The unique key that makes a taken externalUserId a 409.
_TENANT_USER_KEY = "uq_account_tenant_user"


def _account_exists(exc: psycopg.errors.UniqueViolation, new: NewAccount) -> AccountExists:
    """409 for a taken externalUserId; any other database error is re-raised."""
    # Only this key means "taken" (an address collision would be a bug, not a 409).
    if exc.diag.constraint_name != _TENANT_USER_KEY:
        raise exc
    return AccountExists(f"an account with externalUserId {new.external_user_id!r} already exists")


def _created_document(
    values: dict[str, Any],
    destination: Destination,
    registry: ChainRegistry,
    derived: list[tuple[int, str]],
) -> dict[str, Any]:
    return _document(
        account_id=values["id"],
        external_user_id=values["external_user_id"],
        status=ACTIVE,
        destination=destination,
        deposit_addresses=deposit_addresses_document(registry, derived),
        metadata=values["metadata"],
        created_at=values["created_at"],
        updated_at=values["updated_at"],
    )


def _table(model: type[Any]) -> sa.Table:
    table: sa.Table = model.__table__
    return table


# The hot path's statements, built once and compiled once per database (see
# `_driver_statements`).
_ACCOUNTS = _table(DepositAccount)
_POLICIES = _table(DestinationPolicy)
_ADDRESSES = _table(DepositAddress)
#: Binds of the account row that are not their column's name prefixed with `account_`:
#: the tenant is the outbox row's (`tenant_id`, one value for both), and a new account's
#: `updated_at` is its `created_at`.
_ACCOUNT_BINDS = {"tenant_id": "tenant_id", "updated_at": "account_created_at"}
_ACCOUNT_COLUMNS = (
    "pk",
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
)


@dataclass(frozen=True)
class _DriverStatements:
    """The create statements compiled for the driver (`Database.driver_statement`)."""

    #: Draws the account's pk and reads the policy.
    start: DriverStatement
    #: The account (binds `account_<column>`, see `_ACCOUNT_BINDS`), its addresses
    #: (`address_<n>`) and the outbox row (binds named as its columns), in one statement.
    write: DriverStatement


def _driver_statements(db: Database, chains: tuple[tuple[int, int], ...]) -> _DriverStatements:
    """The statements compiled for `db`'s driver, once per database and set of
    (chain id, position) of the active chains."""
    return db.attachment(
        f"core.accounts.create.{chains}", lambda d: _compile_driver_statements(d, chains)
    )


def _compile_driver_statements(
    db: Database, chains: tuple[tuple[int, int], ...]
) -> _DriverStatements:
    """The two statements, with what is fixed for this process written into their text.

    Each parameter costs the client a dump per request, so what never changes is SQL
    text: the account sequence's name (looked up once here, where `pg_get_serial_sequence`
    in the statement cost a catalog lookup per creation), the status, and each address
    row's chain id and position (fixed by the chains file for the process's life).
    """
    with db.driver_autocommit() as conn:
        row = conn.execute(
            "SELECT pg_get_serial_sequence(%s, %s)", (_ACCOUNTS.name, _ACCOUNTS.c.pk.name)
        ).fetchone()
    start = sa.select(
        sa.func.nextval(sa.literal_column(_sql_text(row[0]))),
        _POLICIES.c.chain_id,
        _POLICIES.c.address,
        _POLICIES.c.token_address,
    ).select_from(
        sa.select(sa.literal_column("1").label("one"))
        .subquery("one")
        .outerjoin(_POLICIES, _POLICIES.c.tenant_id == sa.bindparam("tenant_id"))
    )
    account = _ACCOUNTS.insert().values(
        {
            column: sa.bindparam(
                _ACCOUNT_BINDS.get(column, f"account_{column}"), type_=_ACCOUNTS.c[column].type
            )
            for column in _ACCOUNT_COLUMNS
        }
        | {"status": sa.literal_column(_sql_text(ACTIVE))}
    )
    ctes = [account.cte("new_account")]
    if chains:  # no active chain (a chains file could say so): no empty VALUES
        addresses = _ADDRESSES.insert().values(
            [
                {
                    "account_pk": sa.bindparam("account_pk", type_=_ADDRESSES.c.account_pk.type),
                    "chain_id": sa.literal_column(str(int(chain_id))),
                    "address": sa.bindparam(f"address_{n}", type_=_ADDRESSES.c.address.type),
                    "position": sa.literal_column(str(int(position))),
                }
                for n, (chain_id, position) in enumerate(chains)
            ]
        )
        ctes.append(addresses.cte("new_addresses"))
    statements = _DriverStatements(
        start=db.driver_statement(start),
        write=db.driver_statement(outbox.INSERT_EVENT.add_cte(*ctes)),
    )
    if statements.start.fixed or statements.write.fixed:
        # create_account passes its parameters as they are, without DriverStatement.bind.
        raise ValueError("account creation's statements must take every value as a parameter")
    return statements


def _sql_text(value: str) -> str:
    """`value` as an SQL string literal (for names and constants we write, not input)."""
    return "'" + value.replace("'", "''") + "'"


def _write_params(
    pk: int,
    values: dict[str, Any],
    destination: Destination,
    derived: list[tuple[int, str]],
    event: dict[str, Any],
) -> dict[str, Any]:
    """The write statement's parameters, in one dict (JSON wrapped for psycopg)."""
    params = {
        **event,
        "account_pk": pk,
        "account_id": values["id"],
        "account_external_user_id": values["external_user_id"],
        "account_dest_chain_id": destination.chain_id,
        "account_dest_address": destination.address,
        "account_dest_token_address": destination.token_address,
        "account_dest_set_by_key_id": values["dest_set_by_key_id"],
        "account_metadata": Jsonb(values["metadata"]),
        "account_created_at": values["created_at"],
    }
    for n, (_, address) in enumerate(derived):
        params[f"address_{n}"] = address
    return params


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
) -> dict[str, Any]:
    """Re-point an account and emit `deposit.account.destination_updated`; the document.

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
    return document
