"""Detection: transfers to deposit addresses become deposits, follow their transfer through
reorgs, are confirmed once read again at finality, or fail `reorged` once gone for good.

The chain watcher (`watcher.py`) and the sandbox confirmer drive these use cases. The
watcher's are bulk steps in the caller's transaction (a block can hold hundreds of
deposits: one statement per step, not one per deposit).

A transfer's identity is `(chain, transaction, token, recipient, seq)` (`Sighting.key`),
where `seq` numbers the transaction's transfers of that token to that recipient. A reorg
that re-mines the transaction in another block, or behind other transactions, keeps the
identity (the log index does not): the deposit moves with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy.orm import Session

from services.core import outbox
from services.core.amounts import token_units
from services.core.chains import Asset, Chain, ChainRegistry
from services.core.checksums import checksum
from services.core.deposits import detection_store, incidents, payments, states, store, transitions
from services.core.deposits.models import Deposit
from services.core.deposits.pricing import PriceSource, amount_usd
from services.core.deposits.rules import net_usd
from services.core.deposits.serialize import deposit_document
from services.core.deposits.settlement import DIRECT, INVENTORY
from services.core.deposits.store import DepositStore
from services.core.fees import fee_for
from services.core.models import DepositAccount
from shared import events
from shared.db import Database
from shared.ids import new_id
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

#: Incident kind: a confirmed or credited deposit whose block left the canonical chain.
DEEP_REORG = incidents.DEEP_REORG
#: Review reason of a confirmed, unpaid deposit whose block left the canonical chain.
REVIEW_SOURCE_REORGED = states.REVIEW_SOURCE_REORGED
#: Deposits inserted per statement (about 45 parameters each).
INSERT_CHUNK = 500

if TYPE_CHECKING:
    from services.core.evm import TransferLog


Key = tuple[str, str, str, int]


class TransferLike(Protocol):
    """An ERC-20 transfer as the chain reader reports it (evm.TransferLog)."""

    block_number: int
    block_hash: str
    tx_hash: str
    log_index: int
    token_address: str
    from_address: str
    to_address: str
    amount_raw: int


@dataclass(frozen=True, slots=True)
class Sighting:
    """A transfer to a deposit address, with its place among its transaction's transfers."""

    transfer: TransferLike
    seq: int

    @property
    def key(self) -> Key:
        t = self.transfer
        return (t.tx_hash.lower(), t.token_address.lower(), t.to_address.lower(), self.seq)


def number_transfers(logs: Iterable[TransferLog]) -> list[Sighting]:
    """Every log with its `seq` (logs in block order; a transaction's logs are together)."""
    counts: dict[tuple[str, str, str], int] = {}
    out = []
    for t in logs:
        group = (t.tx_hash, t.token_address, t.to_address)
        seq = counts.get(group, 0)
        counts[group] = seq + 1
        out.append(Sighting(t, seq))
    return out


def _key_of(row: Any) -> Key:
    return (
        row.source_tx_hash.lower(),
        row.token_address.lower(),
        row.deposit_address.lower(),
        row.transfer_seq,
    )


def deposit_row(
    chain: Chain,
    account: Any,
    *,
    fee: Decimal,
    asset: str | None,
    token_address: str,
    decimals: int | None,
    amount_raw: int,
    amount_usd_value: Decimal | None,
    source_tx_hash: str,
    log_index: int,
    transfer_seq: int = 0,
    from_address: str | None,
    block_number: int | None,
    block_hash: str | None,
    deposit_address: str,
    confirmations: int,
    now: datetime,
    sandbox: bool = False,
    sandbox_outcome: str | None = None,
) -> dict[str, Any]:
    """The columns of a new deposit in `source_seen`. `account`: a DepositAccount or a row
    with the same fields."""
    return {
        "id": new_id("dep"),
        "tenant_id": account.tenant_id,
        "account_pk": account.pk,
        "account_id": account.id,
        "external_user_id": account.external_user_id,
        "status": states.SOURCE_SEEN,
        "chain_id": chain.chain_id,
        "deposit_address": deposit_address,
        "asset": asset,
        "token_address": token_address,
        "decimals": decimals,
        "amount_raw": str(amount_raw),
        "amount_usd": amount_usd_value,
        # The fee shown before settlement is the live one now (an estimate); settlement
        # records the value it actually skims.
        "fee_usd": fee,
        "net_usd": None if amount_usd_value is None else net_usd(amount_usd_value, fee),
        "source_tx_hash": source_tx_hash,
        "log_index": log_index,
        "transfer_seq": transfer_seq,
        "from_address": from_address,
        "block_number": block_number,
        "block_hash": block_hash,
        "confirmations": min(confirmations, chain.confirmations),
        "required_confirmations": chain.confirmations,
        "dest_chain_id": account.dest_chain_id,
        "dest_address": account.dest_address,
        "dest_token_address": account.dest_token_address,
        "route": None,
        "provider": None,
        "provider_ref": None,
        "settle_phase": None,
        "settle_attempts": 0,
        "next_attempt_at": None,
        "failed_providers": [],
        "credit_amount": None,
        "inventory_reserved": None,
        "credit_tx_hash": None,
        "failure_reason": None,
        "review_reason": None,
        "sandbox": sandbox,
        "sandbox_outcome": sandbox_outcome,
        "ops_by": None,
        "ops_reason": None,
        "ops_at": None,
        "created_at": now,
        "updated_at": now,
        "confirmed_at": None,
        "credited_at": None,
        "source_vanished_at": None,
        "wait_reason": None,
        "waiting_since": None,
    }


def open_deposit(
    session: Session,
    registry: ChainRegistry,
    account: DepositAccount,
    *,
    chain_id: int,
    deposit_address: str,
    asset: str | None,
    token_address: str,
    decimals: int | None,
    amount_raw: int,
    amount_usd_value: Decimal | None,
    source_tx_hash: str,
    log_index: int,
    from_address: str | None,
    block_number: int | None,
    block_hash: str | None,
    confirmations: int,
    now: datetime,
    sandbox: bool = False,
    sandbox_outcome: str | None = None,
) -> Deposit | None:
    """A new deposit in `source_seen` and its event (None: the transfer is recorded already)."""
    chain = registry.get(chain_id)
    assert chain is not None
    row = deposit_row(
        chain,
        account,
        fee=fee_for(session, chain),
        asset=asset,
        token_address=token_address,
        decimals=decimals,
        amount_raw=amount_raw,
        amount_usd_value=amount_usd_value,
        source_tx_hash=source_tx_hash,
        log_index=log_index,
        from_address=from_address,
        block_number=block_number,
        block_hash=block_hash,
        deposit_address=deposit_address,
        confirmations=confirmations,
        now=now,
        sandbox=sandbox,
        sandbox_outcome=sandbox_outcome,
    )
    deposit = Deposit(**row)
    if not detection_store.insert(session, deposit):
        return None  # another watcher recorded the same transfer first
    transitions.emit(session, deposit, states.SOURCE_SEEN, now)
    log.info(
        "deposit %s: source_seen (%s base units of %s on chain %s to %s)",
        deposit.id,
        deposit.amount_raw,
        deposit.asset or deposit.token_address,
        deposit.chain_id,
        deposit.deposit_address,
    )
    return deposit


@dataclass
class Recorded:
    """What `Detection.record` did with a batch of sightings."""

    #: Deposits opened (in `source_seen`).
    new: int = 0
    #: Deposits that followed their transfer to another block.
    moved: int = 0
    #: The live deposit of each sighting's transfer: id and status.
    deposits: dict[Key, tuple[str, str]] | None = None
    #: Those of a token the chain does not support (recorded before the watcher left
    #: such transfers out): ids.
    unsupported: set[str] = field(default_factory=set)


class Detection:
    """Recording transfers, following them through reorgs, confirming them at finality."""

    def __init__(
        self,
        db: Database,
        registry: ChainRegistry,
        prices: PriceSource,
        *,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.registry = registry
        self.prices = prices
        self.clock = clock
        self.store = DepositStore(db)

    # --- the watcher's bulk steps (in the caller's transaction) ---------------------------

    def record(
        self, session: Session, chain: Chain, sightings: Sequence[Sighting], head: int
    ) -> Recorded:
        """Open a deposit for each transfer not recorded yet; move those seen elsewhere.

        Zero-value transfers and tokens the chain does not support are the caller's to
        leave out; a sighting whose address has no account is skipped.
        """
        result = Recorded(deposits={})
        assert result.deposits is not None
        if not sightings:
            return result
        now = self.clock()
        existing = self._live(session, chain.chain_id, {s.transfer.tx_hash for s in sightings})
        fresh: list[Sighting] = []
        for s in sightings:
            key = s.key
            row = existing.get(key)
            if row is None:
                fresh.append(s)
                continue
            result.deposits[key] = (row.id, row.status)
            if row.asset is None:
                result.unsupported.add(row.id)
            if row.block_hash != s.transfer.block_hash or row.log_index != s.transfer.log_index:
                self._move(session, chain, row, s, head, now)
                result.moved += 1
        if fresh:
            opened = self._open(session, chain, fresh, head, now)
            result.new = len(opened)
            for key, deposit_id in opened.items():
                result.deposits[key] = (deposit_id, states.SOURCE_SEEN)
        return result

    def confirm_final(
        self, session: Session, chain: Chain, sightings: Sequence[Sighting], head: int
    ) -> int:
        """Transfers read again at finality: record any the first reading missed, then
        confirm every pending one. Returns how many deposits were confirmed."""
        recorded = self.record(session, chain, sightings, head)
        assert recorded.deposits is not None
        pending = [d for d, status in recorded.deposits.values() if status == states.SOURCE_SEEN]
        if not pending:
            return 0
        now = self.clock()
        confirmed = detection_store.confirm_pending(session, pending, head, now)
        self._emit(session, confirmed, states.SOURCE_CONFIRMED, now)
        if not recorded.unsupported.intersection(pending):
            return len(confirmed)
        # Deposits of unsupported tokens recorded before the watcher left them out.
        for deposit in detection_store.lock_pending_unsupported(session, pending):
            deposit.confirmed_at = now
            transitions.review(session, deposit, now, states.REVIEW_UNSUPPORTED_TOKEN)
        return len(confirmed)

    def record_strays(
        self, session: Session, chain: Chain, sightings: Sequence[Sighting], cap: int
    ) -> int:
        """Keep up to `cap` transfers of unknown tokens for ops (no deposit, no event)."""
        if not sightings or cap <= 0:
            return 0
        now = self.clock()
        rows = [
            {
                "chain_id": chain.chain_id,
                "tx_hash": s.transfer.tx_hash,
                "transfer_seq": s.seq,
                "block_number": s.transfer.block_number,
                "block_hash": s.transfer.block_hash,
                "token_address": checksum(s.transfer.token_address),
                "from_address": checksum(s.transfer.from_address),
                "to_address": checksum(s.transfer.to_address),
                "amount_raw": str(s.transfer.amount_raw),
                "seen_at": now,
            }
            for s in sightings[:cap]
        ]
        kept = detection_store.insert_strays(session, rows)
        if len(sightings) > cap:
            log.info(
                "chain %s: %s transfers of unknown tokens in one range; kept %s",
                chain.chain_id,
                len(sightings),
                cap,
            )
        return kept

    def _live(self, session: Session, chain_id: int, tx_hashes: set[str]) -> dict[Key, Any]:
        return {_key_of(row): row for row in detection_store.live(session, chain_id, tx_hashes)}

    def _move(
        self, session: Session, chain: Chain, row: Any, s: Sighting, head: int, now: datetime
    ) -> None:
        t = s.transfer
        if row.status == states.SOURCE_SEEN:
            log.info(
                "deposit %s follows its transfer: block %s -> %s, log %s -> %s",
                row.id,
                row.block_number,
                t.block_number,
                row.log_index,
                t.log_index,
            )
        else:
            # Confirmed at finality, yet re-mined elsewhere: a reorg deeper than the
            # chain's finality (the incident was raised when the fork was found).
            log.error(
                "deposit %s (%s) was re-mined in block %s (was %s)",
                row.id,
                row.status,
                t.block_number,
                row.block_number,
            )
        values: dict[str, Any] = {
            "block_number": t.block_number,
            "block_hash": t.block_hash,
            "log_index": t.log_index,
        }
        if row.status == states.SOURCE_SEEN:
            values["confirmations"] = max(
                0, min(head - t.block_number + 1, row.required_confirmations)
            )
            values["updated_at"] = now
        detection_store.move(session, row.id, values)

    def _open(
        self, session: Session, chain: Chain, fresh: list[Sighting], head: int, now: datetime
    ) -> dict[Key, str]:
        addresses = sorted({checksum(s.transfer.to_address) for s in fresh})
        accounts = {
            row.address.lower(): row
            for row in detection_store.accounts_of(session, chain.chain_id, addresses)
        }
        fee = fee_for(session, chain)
        prices: dict[str, Decimal | None] = {}
        assets: dict[str, Asset | None] = {}
        rows: list[tuple[Key, dict[str, Any]]] = []
        for s in fresh:
            t = s.transfer
            account = accounts.get(t.to_address.lower())
            asset = assets.get(t.token_address)
            if asset is None and t.token_address not in assets:
                asset = assets[t.token_address] = chain.asset_by_token(t.token_address)
            if account is None or asset is None:
                continue
            if asset.symbol not in prices:
                prices[asset.symbol] = self.prices.usd_price(chain.chain_id, asset.symbol)
            amount = int(t.amount_raw)
            row = deposit_row(
                chain,
                account,
                fee=fee,
                asset=asset.symbol,
                token_address=asset.token_address,
                decimals=asset.decimals,
                amount_raw=amount,
                amount_usd_value=amount_usd(
                    token_units(amount, asset.decimals), prices[asset.symbol]
                ),
                source_tx_hash=t.tx_hash.lower(),
                log_index=t.log_index,
                transfer_seq=s.seq,
                from_address=checksum(t.from_address),
                block_number=t.block_number,
                block_hash=t.block_hash,
                deposit_address=account.address,
                confirmations=head - t.block_number + 1,
                now=now,
            )
            rows.append((s.key, row))
        if not rows:
            return {}
        # Another watcher may record the same transfers at the same time: the identity
        # index lets one of them through.
        inserted = detection_store.insert_new(session, [row for _, row in rows])
        opened = {key: row["id"] for key, row in rows if row["id"] in inserted}
        self._emit(
            session,
            [SimpleNamespace(**row) for _, row in rows if row["id"] in inserted],
            states.SOURCE_SEEN,
            now,
        )
        return opened

    @staticmethod
    def _emit(session: Session, deposits: Sequence[Any], status: str, now: datetime) -> None:
        """The durable events of many status changes (written once each)."""
        event_type = states.EVENT_TYPES[status]
        envelopes = [
            events.envelope(
                event_type,
                d.tenant_id,
                {"deposit": deposit_document(d)},
                event_id=states.event_id(d.id, status),
                created_at=now,
            )
            for d in deposits
        ]
        outbox.emit_many(session, envelopes)

    # --- reorgs -----------------------------------------------------------------------------

    def vanish(self, deposit_id: str, stale_block_hash: str) -> Deposit | None:
        """A pending deposit whose transfer has been gone from the chain for its depth:
        failed, `reorged` (its transfer, if ever mined again, is a new deposit)."""
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id)
            if (
                deposit is None
                or deposit.status != states.SOURCE_SEEN
                or deposit.block_hash != stale_block_hash
            ):
                return None
            now = self.clock()
            transitions.move(
                session,
                deposit,
                states.FAILED,
                now,
                failure_reason=states.REASON_REORGED,
                source_vanished_at=now,
            )
            return deposit

    def pending(self, chain_id: int, limit: int) -> list[Any]:
        """Deposits of a chain (not sandbox) waiting for finality, oldest block first:
        id, block_number, block_hash, confirmations, required_confirmations (rows, not
        ORM objects: the watcher looks at up to a thousand every round)."""
        return detection_store.pending(self.db, chain_id, limit)

    def settled_above(self, chain_id: int, fork_from: int) -> list[Any]:
        """Deposits past `source_seen` recorded at or above a height (id, status, block)."""
        return detection_store.settled_above(self.db, chain_id, fork_from)

    def deep_reorg(
        self, chain_id: int, fork_from: int, canonical: Mapping[int, str], stale: Iterable[Any]
    ) -> int:
        """Deposits past `source_seen` whose block left the canonical chain: an incident
        for ops each; a confirmed one not being paid goes to manual review (it must not
        be paid before a person looks), and one whose hot-wallet payout is in flight has
        that payout cancelled if it is not mined yet (the settlement loop signs the
        cancel: `payments.request_cancel`). Returns the incidents raised."""
        raised = 0
        now = self.clock()
        for row in stale:
            if canonical.get(row.block_number) == row.block_hash:
                continue
            with self.db.transaction() as session:
                deposit = store.lock(session, row.id)
                if deposit is None or deposit.block_hash != row.block_hash:
                    continue
                detail = (
                    f"{deposit.status} deposit {deposit.id}: its block {deposit.block_number} "
                    f"({deposit.block_hash}) left the canonical chain (fork at {fork_from}); "
                    f"transfer {deposit.source_tx_hash}"
                )
                paying = payments.is_payment_ref(deposit.provider_ref)
                if paying:
                    detail += "; its payout, if not mined yet, is cancelled"
                incident = incidents.raise_once(
                    session,
                    chain_id,
                    DEEP_REORG,
                    detail,
                    now,
                    deposit_id=deposit.id,
                    block_number=deposit.block_number,
                )
                if incident is None:
                    continue  # raised when this block left the chain before
                log.critical("chain %s: %s", chain_id, detail)
                if paying:
                    # Its payout may still be unmined: the settlement loop (which has the
                    # hot wallet) signs a cancel with its nonce, and never pays it again.
                    payments.request_cancel(
                        session, deposit.id, f"block {deposit.block_number} left the chain", now
                    )
                elif deposit.status == states.SOURCE_CONFIRMED and (
                    deposit.settle_phase is None or deposit.route in (DIRECT, INVENTORY)
                ):
                    # Not being paid, or its hot-wallet payout being drafted (nothing signed
                    # yet; clearing `settle_phase` drops that draft): a person decides.
                    transitions.review(
                        session,
                        deposit,
                        now,
                        f"{REVIEW_SOURCE_REORGED}: block {deposit.block_number} left the chain",
                        settle_phase=None,
                    )
                raised += 1
        return raised

    # --- single deposits (sandbox, tests) ---------------------------------------------------

    def record_transfer(
        self, session: Session, chain_id: int, transfer: TransferLike, *, confirmations: int
    ) -> Deposit | None:
        """One transfer to a deposit address, recorded as `record` would (in `session`).

        Returns the new deposit, or None (recorded before, or not a deposit).
        """
        chain = self.registry.get(chain_id)
        if chain is None or chain.asset_by_token(transfer.token_address) is None:
            return None
        head = transfer.block_number + confirmations - 1
        recorded = self.record(session, chain, [Sighting(transfer, 0)], head)
        if not recorded.new:
            return None
        assert recorded.deposits is not None
        (deposit_id, _) = next(iter(recorded.deposits.values()))
        return detection_store.get(session, deposit_id)

    def set_confirmations(self, counts: Mapping[str, int]) -> None:
        """Store confirmation counts of deposits still waiting for their depth."""
        if not counts:
            return
        now = self.clock()
        by_count: dict[int, list[str]] = {}
        for deposit_id, count in counts.items():
            by_count.setdefault(count, []).append(deposit_id)
        with self.db.transaction() as session:
            # One statement per count: deposits of a block share theirs.
            for count, ids in by_count.items():
                detection_store.set_confirmations(session, ids, count, now)

    def confirm(
        self,
        deposit_id: str,
        confirmations: int,
        *,
        block_hash: str | None = None,
        skip_locked: bool = False,
    ) -> Deposit | None:
        """`source_seen` -> `source_confirmed` (or manual review for an unsupported token).

        `block_hash`: the canonical hash the caller just read for the deposit's block;
        a deposit recorded in another block is not confirmed.
        """
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id, skip_locked=skip_locked)
            if deposit is None or deposit.status != states.SOURCE_SEEN:
                return None
            if block_hash is not None and deposit.block_hash != block_hash:
                return None
            now = self.clock()
            deposit.confirmations = confirmations
            if deposit.asset is None:
                deposit.confirmed_at = now
                transitions.review(session, deposit, now, states.REVIEW_UNSUPPORTED_TOKEN)
            else:
                transitions.move(session, deposit, states.SOURCE_CONFIRMED, now)
            return deposit
