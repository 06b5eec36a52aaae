"""Hot-wallet payments, idempotent by nonce: what is stored before anything is broadcast,
and how an in-flight payment is judged.

The rules (docs/DEPOSITS.md, "Paying exactly once"):

- The nonce is Settle's, allocated per (chain, wallet) under a row lock
  (`allocate_nonce`), never read from a node at send time.
- A payment is signed first; its nonce, bytes and hash are stored with the deposit in
  the transaction that marks the payment started; it is broadcast only after that
  commit. From then on every error means "unknown": the payment is polled, and the same
  bytes are broadcast again when the node does not know them; a new payment is never
  signed while this one may still be mined.
- It has failed only on a receipt with status 0, or when the wallet's nonce at the
  chain's depth has passed it with no receipt of ours (`judge`).
- Not mined `replace_after_blocks` after it was signed, it is replaced: same nonce and
  calldata, higher fees. Every hash is kept; whichever is mined wins.
- It counts as paid only at the destination chain's depth, its receipt's block hash
  checked against the canonical block at that height.

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

from services.core.deposits.models import (
    PAYMENT_REF,
    Deposit,
    HotWalletNonce,
    HotWalletPayment,
)
from services.core.deposits.settlement import Credited, Failed, InFlight

log = logging.getLogger(__name__)

#: `HotWalletPayment.outcome` values.
MINED = "mined"
FAILED = "failed"
OPS = "ops"


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
    created_at: datetime
    alerted: bool

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
            row.created_at,
            row.alerted,
        )

    @property
    def ref(self) -> str:
        return f"{PAYMENT_REF}{self.id}"


@dataclass(frozen=True)
class Observation:
    """What the destination chain says about a payment (read in this order: head, the
    wallet's nonce at depth, receipts)."""

    head: int
    #: The mined transaction of ours on the canonical chain: (hash, status, block number).
    mined: tuple[str, int, int] | None
    #: The wallet's nonce at the chain's depth has passed ours and none of ours is mined.
    nonce_used: bool
    #: The node knows the latest transaction (pooled or mined).
    known: bool

    def confirmations(self) -> int:
        return 0 if self.mined is None else self.head - self.mined[2] + 1


class Replace:
    """The payment should be replaced (same nonce and calldata, higher fees)."""


REPLACE = Replace()

Verdict = Credited | Failed | InFlight | Replace


def judge(
    observation: Observation, payment: PaymentView, depth: int, replace_after_blocks: int
) -> Verdict:
    """What to do with an in-flight payment, from what the chain says (pure)."""
    if observation.mined is not None:
        tx_hash, status, _block = observation.mined
        if observation.confirmations() < depth:
            return InFlight(payment.ref)
        if status != 1:
            return Failed(f"credit transfer {tx_hash} reverted")
        return Credited(tx_hash)
    if observation.nonce_used:
        return Failed(
            f"nonce {payment.nonce} of the hot wallet was used by another transaction; "
            "this payment can no longer be mined"
        )
    if observation.head - payment.signed_block >= replace_after_blocks:
        return REPLACE
    return InFlight(payment.ref)


# --- storage --------------------------------------------------------------------------


def allocate_nonce(
    session: Session, chain_id: int, wallet: str, pending_nonce: int, now: datetime
) -> int:
    """The next nonce of (chain, wallet), under its row lock until the caller commits.

    At least the node's pending nonce (transactions sent from the wallet by anyone else
    move it forward), never below Settle's own count (a payment of ours the node dropped
    keeps its nonce: it is broadcast again, not given away).
    """
    session.execute(
        insert(HotWalletNonce)
        .values(chain_id=chain_id, wallet=wallet, next_nonce=pending_nonce, updated_at=now)
        .on_conflict_do_nothing()
    )
    row = session.scalars(
        sa.select(HotWalletNonce)
        .where(HotWalletNonce.chain_id == chain_id, HotWalletNonce.wallet == wallet)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    nonce = max(row.next_nonce, pending_nonce)
    row.next_nonce = nonce + 1
    row.updated_at = now
    return nonce


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
    payment.updated_at = now


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
