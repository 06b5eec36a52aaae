"""Deposit address backfill: give existing accounts an address on chains activated later.

An account gets one address per *active* chain when it is created. When ops turn a
chain from `declared` to `active`, accounts created before have none on it; this pass
finds them (an anti-join on `deposit_addresses` by (account_pk, chain_id)) and inserts
the address creation would have derived at the account's `address_index` (or its pk
where that is NULL) with the deposit key configured now (its scheme decides the path:
services/core/addresses.py), at the chain's position in the chains file. Each row
records that key (`key_id`): after a rotation, an old account's new address is the new
key's.

It is safe to run at any time, any number of times, from several processes at once,
while accounts are being created: each insert is `ON CONFLICT (account_pk, chain_id)
DO NOTHING`, so an address someone else stored first is kept, never rewritten. No
event is emitted (the interface has no event type for it; see DECISIONS.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from services.core import deposit_keys
from services.core.accounts import Deriver
from services.core.chains import ChainRegistry
from services.core.context import CoreContext
from services.core.models import DepositAccount, DepositAddress
from shared.db import Database

log = logging.getLogger(__name__)

#: Accounts examined per transaction.
DEFAULT_BATCH = 500
#: Address rows per INSERT statement.
INSERT_CHUNK = 1000


@dataclass(frozen=True)
class BackfillResult:
    #: Accounts examined (any status), whether or not they lacked an address.
    accounts_scanned: int = 0
    #: Addresses this run inserted (rows another runner stored first are not counted).
    addresses_added: int = 0
    #: Accounts that got at least one address from this run.
    accounts_changed: int = 0
    #: The highest account pk examined (the `after_pk` given when none was).
    watermark: int = 0
    #: False when `stop` interrupted the pass before the last account.
    complete: bool = True

    def document(self) -> dict[str, object]:
        return {
            "accountsScanned": self.accounts_scanned,
            "addressesAdded": self.addresses_added,
            "accountsChanged": self.accounts_changed,
            "watermark": self.watermark,
            "complete": self.complete,
        }


def _chain_ids(chain_ids: Sequence[int]) -> sa.Subquery:
    """The active chain ids as a one-column derived table (portable: no VALUES alias)."""
    selects = [sa.select(sa.literal(cid, sa.Integer).label("chain_id")) for cid in chain_ids]
    union = selects[0] if len(selects) == 1 else sa.union_all(*selects)
    return union.subquery("active_chains")


def _missing(
    session: Session, chain_ids: Sequence[int], low: int, high: int
) -> list[tuple[int, int, int]]:
    """(account pk, its address index, chain id) with no address, for accounts with
    low < pk <= high."""
    chains = _chain_ids(chain_ids)
    accounts = DepositAccount.__table__
    addresses = DepositAddress.__table__
    has_address = (
        sa.select(sa.literal(1))
        .where(addresses.c.account_pk == accounts.c.pk, addresses.c.chain_id == chains.c.chain_id)
        .exists()
    )
    query = (
        sa.select(
            accounts.c.pk,
            # DepositAccount.derivation_index: NULL means the pk.
            sa.func.coalesce(accounts.c.address_index, accounts.c.pk),
            chains.c.chain_id,
        )
        .select_from(accounts.join(chains, sa.true()))
        .where(accounts.c.pk > low, accounts.c.pk <= high, ~has_address)
        .order_by(accounts.c.pk, chains.c.chain_id)
    )
    return [(int(pk), int(index), int(chain_id)) for pk, index, chain_id in session.execute(query)]


def _insert_ignoring_conflicts(session: Session, rows: list[dict[str, object]]) -> list[int]:
    """Insert address rows, skipping those already stored.

    Returns the account pk of each row inserted.

    Every unique key is an arbiter (no conflict target): with only (account_pk,
    chain_id), two runners inserting the same row at once could meet on the address's
    unique key instead, which ON CONFLICT then does not cover (a UniqueViolation, seen
    under load). The address is derived from (chain, pk), so a clash on it is the same
    row; an account left without an address would show in `all_accounts_complete`.
    """
    statement = (
        postgresql.insert(DepositAddress)
        .on_conflict_do_nothing()
        .returning(DepositAddress.account_pk)
    )
    inserted: list[int] = []
    # Chunked: a statement's bound parameters are limited (PostgreSQL: 65535).
    for start in range(0, len(rows), INSERT_CHUNK):
        # RETURNING lists only the rows actually inserted: exact counts even when a
        # concurrent runner won some of them.
        chunk = statement.values(rows[start : start + INSERT_CHUNK])
        inserted.extend(int(pk) for pk in session.scalars(chunk))
    return inserted


def backfill_batch(
    session: Session,
    registry: ChainRegistry,
    deriver: Deriver,
    *,
    key_id: int,
    after_pk: int,
    batch: int = DEFAULT_BATCH,
) -> tuple[int, int, int, int]:
    """One batch in the caller's transaction: the next `batch` accounts after `after_pk`,
    their new addresses derived by `deriver`, whose recorded key is `key_id`.

    Returns (accounts scanned, addresses added, accounts changed, highest pk scanned;
    `after_pk` when there were no accounts).
    """
    chain_ids = [c.chain_id for c in registry.active()]
    window = (
        sa.select(DepositAccount.pk)
        .where(DepositAccount.pk > after_pk)
        .order_by(DepositAccount.pk)
        .limit(batch)
        .subquery()
    )
    count, high = session.execute(sa.select(sa.func.count(), sa.func.max(window.c.pk))).one()
    if not count:
        return 0, 0, 0, after_pk
    high = int(high)
    missing = _missing(session, chain_ids, after_pk, high) if chain_ids else []
    if not missing:
        return int(count), 0, 0, high
    rows: list[dict[str, object]] = [
        {
            "account_pk": pk,
            "chain_id": chain_id,
            # The same derivation as creation's, at the account's own index.
            "address": deriver.derive(chain_id, index),
            "position": registry.position(chain_id),
            "key_id": key_id,
        }
        for pk, index, chain_id in missing
    ]
    inserted = _insert_ignoring_conflicts(session, rows)
    return int(count), len(inserted), len(set(inserted)), high


def backfill_addresses(
    db: Database,
    registry: ChainRegistry,
    deriver: Deriver,
    *,
    after_pk: int = 0,
    batch: int = DEFAULT_BATCH,
    stop: threading.Event | None = None,
) -> BackfillResult:
    """Give every account with pk > `after_pk` an address on each active chain it lacks.

    Accounts are walked in pk order, `batch` at a time, each batch in its own
    transaction (a failure loses at most one batch, which the next run redoes).
    `stop` ends the pass between batches (`complete` is then False).
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    key = deposit_keys.recorded(db, deriver.xpub, deriver.scheme)
    scanned = added = changed = 0
    cursor = after_pk
    while True:
        if stop is not None and stop.is_set():
            return BackfillResult(scanned, added, changed, cursor, complete=False)
        with db.transaction() as session:
            n, batch_added, batch_changed, high = backfill_batch(
                session, registry, deriver, key_id=key.id, after_pk=cursor, batch=batch
            )
        scanned += n
        added += batch_added
        changed += batch_changed
        cursor = high
        if n < batch:
            return BackfillResult(scanned, added, changed, cursor)


def all_accounts_complete(db: Database, registry: ChainRegistry) -> bool:
    """True when every account has an address on every active chain (one cheap query).

    Addresses are never deleted and (account_pk, chain_id) is unique, so a chain whose
    address count equals the account count covers every account. One statement reads
    one snapshot, and creation commits an account with its addresses, so the counts
    agree with each other.
    """
    chain_ids = [c.chain_id for c in registry.active()]
    if not chain_ids:
        return True
    accounts = sa.select(sa.func.count()).select_from(DepositAccount).scalar_subquery()
    per_chain = [
        sa.select(sa.func.count())
        .select_from(DepositAddress)
        .where(DepositAddress.chain_id == cid)
        .scalar_subquery()
        for cid in chain_ids
    ]
    with db.reader() as session:
        total, *counts = session.execute(sa.select(accounts, *per_chain)).one()
    return all(count == total for count in counts)


#: Incremental passes re-read this many pks below the watermark: an account whose pk was
#: allocated before the last pass but committed after it (a slow transaction) is not missed.
WATERMARK_MARGIN = 1000
#: One pass in this many re-checks every account (cheap when nothing is missing).
FULL_CHECK_EVERY = 12


def run_address_backfill(ctx: CoreContext, stop: threading.Event) -> None:
    """A full pass at start, then every `address_backfill_interval_s` the accounts above
    the watermark (minus a margin), and every FULL_CHECK_EVERY-th time all of them,
    until stopped.

    Repeating matters during a rolling deploy: an API process still on the old chains
    file keeps creating accounts without the new chain. A failed pass is logged and
    retried next interval (a failed full pass is redone in full).
    """
    interval = ctx.config.address_backfill_interval_s
    watermark: int | None = None  # None until a full pass has completed
    passes = 0
    while not stop.is_set():
        # Every FULL_CHECK_EVERY passes, the whole table is checked again: an account
        # whose creation committed long after its pk was drawn (more than the margin
        # behind the watermark) is not left without its address until a restart.
        full = watermark is None or passes % FULL_CHECK_EVERY == 0
        passes += 1
        try:
            if full and all_accounts_complete(ctx.db, ctx.registry):
                # The common restart: nothing to add, so no need to walk every account.
                result = BackfillResult(watermark=_max_pk(ctx.db))
            else:
                after = 0 if full or watermark is None else max(0, watermark - WATERMARK_MARGIN)
                result = backfill_addresses(
                    ctx.db, ctx.registry, ctx.deriver, after_pk=after, stop=stop
                )
        except Exception:
            log.exception("address backfill failed; retrying in %ss", interval)
        else:
            if result.complete:
                watermark = max(watermark or 0, result.watermark)
            if result.addresses_added:
                log.info(
                    "address backfill (%s pass): added %s addresses to %s accounts "
                    "(%s scanned, up to pk %s)",
                    "full" if full else "incremental",
                    result.addresses_added,
                    result.accounts_changed,
                    result.accounts_scanned,
                    result.watermark,
                )
            else:
                log.debug("address backfill: nothing to add (%s)", result.document())
        stop.wait(interval)


def _max_pk(db: Database) -> int:
    with db.reader() as session:
        return int(session.scalar(sa.select(sa.func.max(DepositAccount.pk))) or 0)
