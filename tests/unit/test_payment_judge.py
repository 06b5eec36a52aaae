"""`payments.judge`: what an in-flight hot-wallet payment's observation means (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from services.core.deposits.payments import REPLACE, Observation, PaymentView, judge
from services.core.deposits.settlement import Credited, Failed, InFlight

PAYMENT = PaymentView(
    id=7,
    deposit_id="dep_1",
    nonce=5,
    tx={},
    raw_tx="0x00",
    tx_hashes=("0xa", "0xb"),
    signed_block=100,
    created_at=datetime(2026, 11, 24, tzinfo=UTC),
    alerted=False,
)


def obs(
    head: int = 101,
    mined: tuple[str, int, int] | None = None,
    nonce_used: bool = False,
    known: bool = True,
) -> Observation:
    return Observation(head, mined, nonce_used, known)


def test_mined_counts_only_at_depth() -> None:
    assert judge(obs(head=102, mined=("0xb", 1, 101)), PAYMENT, 3, 12) == InFlight("payment:7")
    assert judge(obs(head=103, mined=("0xb", 1, 101)), PAYMENT, 3, 12) == Credited("0xb")


def test_a_reverted_receipt_at_depth_fails_the_attempt() -> None:
    verdict = judge(obs(head=110, mined=("0xa", 0, 101)), PAYMENT, 3, 12)
    assert isinstance(verdict, Failed) and not verdict.final and "reverted" in verdict.reason


def test_nonce_used_by_another_transaction_fails_it_only_without_a_receipt_of_ours() -> None:
    verdict = judge(obs(nonce_used=True), PAYMENT, 3, 12)
    assert isinstance(verdict, Failed) and "can no longer be mined" in verdict.reason


def test_unmined_is_in_flight_then_replaced_after_n_blocks() -> None:
    assert judge(obs(head=111), PAYMENT, 3, 12) == InFlight("payment:7")
    assert judge(obs(head=112), PAYMENT, 3, 12) is REPLACE
