"""Deposit accounts: create (inheriting the policy at creation time), read, list, re-point.

Each write and its outbox event commit in one transaction (the caller's session).
An account's `address_index` is the BIP32 index of its deposit addresses: a number
of the accounts' sequence, never reused, so no two accounts (of any tenants) share an
address. Its `pk` is the sequence's value at insert: lists walk it in creation order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from services.core import account_store, deposit_keys, event_sequences, outbox
from services.core.account_store import ACTIVE, Writer
from services.core.chains import ChainRegistry
from services.core.destinations import Destination, validate_destination
from services.core.models import DepositAccount
from services.core.outbox_wakeup import wake_relay
from shared import events
from shared.api import Page
from shared.audit.log import Change, Recorder
from shared.db import Database
from shared.errors import AccountExists, DestinationPolicyMissing, NotFound
from shared.ids import new_id
from shared.timefmt import iso_ms, utcnow

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
    creations cannot both win). One statement writes the account, its addresses and
    the outbox row (`account_store.creating`). Its addresses' BIP32 index comes from
    this process's block of account numbers. A policy this process has read before is
    written as the statement finds it or not at all: when the row has changed since,
    nothing is written and the creation reads the policy again and writes with it. So
    the usual creation is one round trip after the key's.
    """
    if new.destination is not None:
        validate_destination(registry, new.destination)
    key = deposit_keys.recorded(db, deriver.xpub, deriver.scheme)
    try:
        with account_store.creating(db, registry.active_positions, key.id) as writer:
            index = writer.take_index()
            derived = deriver.addresses(index, (c.chain_id for c in registry.active()))
            draft = _AccountDraft.new(tenant_id, new, api_key_id, now, derived, index)
            if new.destination is not None:
                document = draft.write(writer, new.destination, registry, if_policy_is=False)
            else:
                document = _write_with_policy(writer, registry, draft)
    except account_store.ExternalUserIdTaken:
        raise AccountExists(
            f"an account with externalUserId {new.external_user_id!r} already exists"
        ) from None
    if document is None:  # an unconditional write returns its row or raises
        raise RuntimeError("the account's write returned no row")
    wake_relay(db)
    return document


def _write_with_policy(
    writer: Writer, registry: ChainRegistry, draft: _AccountDraft
) -> dict[str, Any] | None:
    """Write `draft` with the tenant's policy as its destination, as the policy is now."""
    tenant_id = draft.tenant_id
    known = writer.policies.get(tenant_id)
    if known is not None:
        registry.require_active(known.chain_id)  # a chain may have been retired since
        document = draft.write(writer, known, registry, if_policy_is=True)
        if document is not None:
            return document
    # Not read yet in this process, or changed since: read it, then write what was read.
    policy = writer.read_policy(tenant_id)
    if policy is None:
        writer.policies.forget(tenant_id)
        raise DestinationPolicyMissing(
            "give a destination or configure the destination policy "
            "(PUT /v1/destination-policy) first"
        )
    # The policy was checked when written; its chain may have been retired since.
    registry.require_active(policy.chain_id)
    writer.policies.put(tenant_id, policy)
    return draft.write(writer, policy, registry, if_policy_is=False)


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
        writer: Writer,
        destination: Destination,
        registry: ChainRegistry,
        *,
        if_policy_is: bool,
    ) -> dict[str, Any] | None:
        """Write the account with `destination`: its document, or None when the policy
        no longer holds it (`if_policy_is`) and nothing was written."""
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
        written = writer.write(
            event=event,
            account_id=self.account_id,
            external_user_id=self.external_user_id,
            destination=destination,
            set_by_key_id=self.api_key_id,
            metadata=self.metadata,
            created_at=self.created_at,
            address_index=self.address_index,
            addresses=[address for _, address in self.derived],
            if_policy_is=if_policy_is,
        )
        return document if written else None


def find_account(
    session: Session, tenant_id: str, external_user_id: str, *, lock: bool = False
) -> DepositAccount | None:
    """The tenant's account with this externalUserId (row-locked when `lock`)."""
    if external_user_id_problem(external_user_id) is not None:
        return None  # could never have been stored; also keeps NULs away from the database
    return account_store.find(session, tenant_id, external_user_id, lock=lock)


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
    page = account_store.page(
        session, tenant_id, limit=limit, cursor=cursor, deposit_address=deposit_address
    )
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
