"""Hot-wallet payments, idempotent by nonce: what is stored before anything is broadcast,
and how an in-flight payment is judged and priced.

The rules (docs/DEPOSITS.md, "Paying exactly once"):

- The nonce is Settle's, allocated per (chain, wallet) under a row lock
  (`allocate_nonce`), never read from a node at send time. A node whose count for the
  wallet is ahead of Settle's has transactions Settle has no record of (a database
  restored from a backup, the key used elsewhere): `NonceGap`, and the chain's payments
  pause until a person resolves the incident (`acknowledge_gap`).
- A payment is signed first; its nonce, bytes and hash are stored with the deposit in
  the transaction that marks the payment started; it is broadcast only after that
  commit. From then on every error means "unknown": the payment is polled, and the same
  bytes are broadcast again when the node does not know them; a new payment is never
  signed while this one may still be mined.
- It has failed only on a receipt with status 0, or when the wallet's nonce at the
  chain's finality has passed it and the transaction that used the nonce is not ours
  (searched from the block its first transaction was signed at, never a replacement's).
- Not mined `replace_after_blocks` after it was signed, it is replaced (same nonce and
  calldata) only when the market asks more than it offers, at the market's price
  (`reprice`): never its own price bumped again and again; never past the chain's cap
  or the most replacements allowed (it then waits, stalled, and ops are alerted).
- It counts as paid only when its transaction is at the destination chain's finality
  (its receipt's block canonical there) and the token's `Transfer` log moved the whole
  amount from the wallet to the destination: a receipt's status alone is not a payment.
- A payout whose deposit's transfer left the chain is cancelled (`request_cancel`): a
  zero-value transfer to the wallet itself with its nonce, never replaced by the
  payout again.

The use case steps that call these live in `settling.py` (and `ops.py` for ops).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from services.core.deposits import states
from services.core.deposits.models import (
    PAYMENT_REF,
    ChainIncident,
    Deposit,
    HotWalletNonce,
    HotWalletPayment,
)
from services.core.deposits.outcomes import Credited, Failed, InFlight, NeedsReview
from services.core.erc20 import transfer_args

log = logging.getLogger(__name__)

#: `HotWalletPayment.outcome` values.
MINED = "mined"
FAILED = "failed"
OPS = "ops"
#: Its cancel (same nonce, zero value, to the wallet itself) was mined instead.
CANCELLED = "cancelled"


@dataclass(frozen=True)
class Draft:
    """An unsigned payment (node calls done) and the node's pending nonce and head."""

    tx: dict[str, Any]
    pending_nonce: int
    head: int


@dataclass(frozen=True)
class PaymentView:
    """A payment's stored facts, read in one transaction and used outside it."""

    id: int
    deposit_id: str
    nonce: int
    tx: dict[str, Any]
    raw_tx: str
    tx_hashes: tuple[str, ...]
    signed_block: int
    first_signed_block: int
    created_at: datetime
    alerted: bool
    stalled: str | None
    cancel_reason: str | None
    cancel_raw_tx: str | None
    cancel_tx_hash: str | None

    @classmethod
    def of(cls, row: HotWalletPayment) -> PaymentView:
        return cls(
            row.id,
            row.deposit_id,
            row.nonce,
            dict(row.tx),
            row.raw_tx,
            tuple(row.tx_hashes),
            row.signed_block,
            row.first_signed_block,
            row.created_at,
            row.alerted,
            row.stalled,
            row.cancel_reason,
            row.cancel_raw_tx,
            row.cancel_tx_hash,
        )

    @property
    def ref(self) -> str:
        return f"{PAYMENT_REF}{self.id}"

    @property
    def candidates(self) -> tuple[str, ...]:
        """Every transaction that may be mined with the nonce: the payout's, its cancel."""
        return self.tx_hashes + ((self.cancel_tx_hash,) if self.cancel_tx_hash else ())

    @property
    def replacements(self) -> int:
        return len(self.tx_hashes) - 1

    def transfer(self) -> tuple[str, str, int]:
        """(token, destination, amount in base units) the payout moves."""
        to, amount = transfer_args(self.tx["data"])
        return str(self.tx["to"]), to, amount


@dataclass(frozen=True)
class Mined:
    """A transaction of the payment's nonce, mined on the canonical chain."""

    tx_hash: str
    status: int
    block_number: int
    #: At or under the chain's finality (its depth, and its finalized/safe block).
    final: bool
    #: What its `Transfer` logs moved from the wallet to the destination (base units),
    #: asked only once it is final and succeeded; None: not asked, or not answered.
    transferred: int | None = None


@dataclass(frozen=True)
class Observation:
    """What the destination chain says about a payment (read in this order: head, the
    wallet's nonce at finality, receipts, logs)."""

    head: int
    #: The mined transaction of ours on the canonical chain.
    mined: Mined | None
    #: The wallet's nonce at finality has passed ours and none of ours is mined.
    nonce_used: bool
    #: The node knows the latest transaction (pooled or mined).
    known: bool

    def confirmations(self) -> int:
        return 0 if self.mined is None else self.head - self.mined.block_number + 1


class Replace:
    """The payment is due for a replacement (same nonce and calldata; `reprice` decides
    whether the market asks for one, and at what price)."""


REPLACE = Replace()


@dataclass(frozen=True)
class Cancelled:
    """Its cancel was mined: the payout never happened."""

    tx_hash: str


Verdict = Credited | Failed | InFlight | Replace | NeedsReview | Cancelled


def judge(observation: Observation, payment: PaymentView, replace_after_blocks: int) -> Verdict:
    """What to do with an in-flight payment, from what the chain says (pure)."""
    mined = observation.mined
    if mined is not None:
        if not mined.final:
            return InFlight(payment.ref)
        if mined.tx_hash == payment.cancel_tx_hash:
            return Cancelled(mined.tx_hash)
        if mined.status != 1:
            return Failed(f"credit transfer {mined.tx_hash} reverted")
        if mined.transferred is None:
            return InFlight(payment.ref)  # its logs not answered yet: ask again
        token, to, amount = payment.transfer()
        if mined.transferred != amount:
            return NeedsReview(
                f"{states.REVIEW_PAYOUT_NOT_TRANSFERRED}: {mined.tx_hash} succeeded but its "
                f"Transfer logs moved {mined.transferred} of {amount} base units of {token} "
                f"to {to}"
            )
        return Credited(mined.tx_hash)
    if observation.nonce_used:
        return Failed(
            f"nonce {payment.nonce} of the hot wallet was used by another transaction; "
            "this payment can no longer be mined"
        )
    if payment.cancel_reason is not None:
        return InFlight(payment.ref)  # being cancelled: never replaced by the payout again
    if observation.head - payment.signed_block >= replace_after_blocks:
        return REPLACE
    return InFlight(payment.ref)


# --- storage --------------------------------------------------------------------------


class NonceGap(Exception):
    """The node's count of the wallet's transactions is ahead of Settle's: transactions
    Settle has no record of. Nothing may be signed on that chain until a person looks."""

    def __init__(self, chain_id: int, wallet: str, settle_next: int, chain_nonce: int) -> None:
        super().__init__(
            f"the hot wallet {wallet} has sent {chain_nonce} transactions on chain {chain_id}, "
            f"Settle knows of {settle_next}: nonces {settle_next} to {chain_nonce - 1} were "
            "used by transactions Settle has no record of"
        )
        self.chain_id = chain_id
        self.wallet = wallet
        self.settle_next = settle_next
        self.chain_nonce = chain_nonce


def allocate_nonce(
    session: Session, chain_id: int, wallet: str, pending_nonce: int, now: datetime
) -> int:
    """The next nonce of (chain, wallet), under its row lock until the caller commits.

    Settle's own count, never below a payment of ours the node dropped (it keeps its
    nonce: it is broadcast again, not given away). A node whose pending count is ahead
    of ours is a `NonceGap` (also on a wallet Settle never paid from that has sent
    before: a database restored from before its first payout looks the same).
    """
    session.execute(
        insert(HotWalletNonce)
        .values(chain_id=chain_id, wallet=wallet, next_nonce=0, updated_at=now)
        .on_conflict_do_nothing()
    )
    row = session.scalars(
        sa.select(HotWalletNonce)
        .where(HotWalletNonce.chain_id == chain_id, HotWalletNonce.wallet == wallet)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    if pending_nonce > row.next_nonce:
        raise NonceGap(chain_id, wallet, row.next_nonce, pending_nonce)
    nonce = row.next_nonce
    row.next_nonce = nonce + 1
    row.updated_at = now
    return nonce


def gap_facts(session: Session, gap: NonceGap, head: int) -> dict[str, Any]:
    """What a nonce gap incident records: the numbers, and the block to search its
    payouts from (where Settle's newest recorded payment of the wallet was signed)."""
    scan_from = session.scalar(
        sa.select(sa.func.max(HotWalletPayment.first_signed_block)).where(
            HotWalletPayment.chain_id == gap.chain_id, HotWalletPayment.wallet == gap.wallet
        )
    )
    return {
        "wallet": gap.wallet,
        "settleNextNonce": gap.settle_next,
        "chainNonce": gap.chain_nonce,
        "head": head,
        "scanFrom": int(scan_from or 0),
    }


def acknowledge_gap(session: Session, incident: ChainIncident, now: datetime) -> None:
    """A person resolved a nonce gap: Settle's count moves to the chain's count the
    incident named (the next gap, if the chain moved on since, is a new incident)."""
    facts = incident.facts or {}
    wallet, chain_nonce = str(facts["wallet"]), int(facts["chainNonce"])
    row = session.scalars(
        sa.select(HotWalletNonce)
        .where(HotWalletNonce.chain_id == incident.chain_id, HotWalletNonce.wallet == wallet)
        .with_for_update()
    ).first()
    if row is None:
        session.add(
            HotWalletNonce(
                chain_id=incident.chain_id, wallet=wallet, next_nonce=chain_nonce, updated_at=now
            )
        )
        return
    if chain_nonce > row.next_nonce:
        log.warning(
            "chain %s: Settle's next nonce of %s moves from %s to %s (nonce gap resolved)",
            incident.chain_id,
            wallet,
            row.next_nonce,
            chain_nonce,
        )
        row.next_nonce = chain_nonce
        row.updated_at = now


def record(
    session: Session,
    deposit: Deposit,
    chain_id: int,
    wallet: str,
    nonce: int,
    tx: dict[str, Any],
    raw_tx: str,
    tx_hash: str,
    head: int,
    now: datetime,
) -> HotWalletPayment:
    """Store a signed payment (before it is broadcast)."""
    payment = HotWalletPayment(
        deposit_id=deposit.id,
        chain_id=chain_id,
        wallet=wallet,
        nonce=nonce,
        tx=tx,
        raw_tx=raw_tx,
        tx_hashes=[tx_hash],
        signed_block=head,
        first_signed_block=head,
        outcome=None,
        alerted=False,
        created_at=now,
        updated_at=now,
    )
    session.add(payment)
    session.flush()
    return payment


def is_payment_ref(ref: str | None) -> bool:
    return ref is not None and ref.startswith(PAYMENT_REF)


def open_payment(session: Session, deposit_id: str) -> HotWalletPayment | None:
    """The deposit's unresolved payment, if any (the caller holds the deposit's lock)."""
    return session.scalars(
        sa.select(HotWalletPayment)
        .where(HotWalletPayment.deposit_id == deposit_id, HotWalletPayment.resolved_at.is_(None))
        .order_by(HotWalletPayment.id.desc())
        .execution_options(populate_existing=True)
    ).first()


def replaced(
    session: Session,
    payment_id: int,
    tx: dict[str, Any],
    raw_tx: str,
    tx_hash: str,
    head: int,
    now: datetime,
) -> None:
    """Store a replacement (before it is broadcast); earlier hashes stay candidates."""
    payment = session.get(HotWalletPayment, payment_id, with_for_update=True)
    assert payment is not None
    payment.tx = tx
    payment.raw_tx = raw_tx
    payment.tx_hashes = [*payment.tx_hashes, tx_hash]
    payment.signed_block = head
    payment.stalled = None
    payment.stalled_since = None
    payment.updated_at = now


def mark_stalled(session: Session, payment_id: int, reason: str | None, now: datetime) -> bool:
    """Record why a due replacement is held back (None: it no longer is); True when that
    changed (the caller alerts once per stall)."""
    payment = session.get(HotWalletPayment, payment_id, with_for_update=True)
    if payment is None or payment.resolved_at is not None or payment.stalled == reason:
        return False
    payment.stalled = reason
    payment.stalled_since = None if reason is None else now
    payment.updated_at = now
    return True


def request_cancel(session: Session, deposit_id: str, reason: str, now: datetime) -> bool:
    """Mark the deposit's open payment for cancelling (the poll signs the cancel); False
    when it has none."""
    payment = open_payment(session, deposit_id)
    if payment is None:
        return False
    if payment.cancel_reason is None:
        payment.cancel_reason = reason[:300]
        payment.updated_at = now
    return True


def cancel_signed(
    session: Session, payment_id: int, raw_tx: str, tx_hash: str, now: datetime
) -> bool:
    """Store the signed cancel (before it is broadcast); False when one was stored first."""
    payment = session.get(HotWalletPayment, payment_id, with_for_update=True)
    if payment is None or payment.resolved_at is not None or payment.cancel_tx_hash:
        return False
    payment.cancel_raw_tx = raw_tx
    payment.cancel_tx_hash = tx_hash
    payment.updated_at = now
    return True


def resolve(session: Session, deposit_id: str, outcome: str, now: datetime) -> None:
    """Close the deposit's open payment (no-op when it has none)."""
    payment = open_payment(session, deposit_id)
    if payment is None:
        return
    payment.outcome = outcome
    payment.resolved_at = now
    payment.updated_at = now


def mark_alerted(session: Session, payment_id: int, now: datetime) -> None:
    payment = session.get(HotWalletPayment, payment_id)
    if payment is not None:
        payment.alerted = True
        payment.updated_at = now
