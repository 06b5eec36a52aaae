"""`payments.judge`: what an in-flight hot-wallet payment's observation means (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from services.core.deposits import states
from services.core.deposits.outcomes import Credited, Failed, InFlight, NeedsReview
from services.core.deposits.payments import (
    REPLACE,
    Cancelled,
    Mined,
    Observation,
    PaymentView,
    judge,
)
from services.core.deposits.payout_tag import PayoutTag, decode
from services.core.erc20 import transfer_args, transfer_calldata

TOKEN = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DESTINATION = "0x1111111111111111111111111111111111111111"
AMOUNT = 99_500_000
PAYMENT = PaymentView(
    id=7,
    deposit_id="dep_1",
    nonce=5,
    tx={"to": TOKEN, "data": "0x" + transfer_calldata(DESTINATION, AMOUNT).hex()},
    raw_tx="0x00",
    tx_hashes=("0xa", "0xb"),
    signed_block=100,
    first_signed_block=90,
    created_at=datetime(2026, 11, 24, tzinfo=UTC),
    alerted=False,
    stalled=None,
    cancel_reason=None,
    cancel_raw_tx=None,
    cancel_tx_hash=None,
)


def obs(
    head: int = 101, mined: Mined | None = None, nonce_used: bool = False, known: bool = True
) -> Observation:
    return Observation(head, mined, nonce_used, known)


def test_mined_counts_only_at_finality_and_only_for_the_whole_transfer() -> None:
    not_final = Mined("0xb", 1, 101, final=False)
    assert judge(obs(head=102, mined=not_final), PAYMENT, 12) == InFlight("payment:7")
    paid = Mined("0xb", 1, 101, final=True, transferred=AMOUNT)
    assert judge(obs(head=103, mined=paid), PAYMENT, 12) == Credited("0xb")


def test_a_successful_receipt_without_the_transfer_is_for_a_person() -> None:
    # A token that answers `false` (status 1, no Transfer log), or one that moved less
    for moved in (0, AMOUNT - 1):
        verdict = judge(obs(mined=Mined("0xb", 1, 101, True, moved)), PAYMENT, 12)
        assert isinstance(verdict, NeedsReview)
        assert verdict.reason.startswith(states.REVIEW_PAYOUT_NOT_TRANSFERRED)
    # Logs not answered yet: ask again, judge nothing
    assert judge(obs(mined=Mined("0xb", 1, 101, True, None)), PAYMENT, 12) == InFlight("payment:7")


def test_a_reverted_receipt_at_finality_fails_the_attempt() -> None:
    verdict = judge(obs(head=110, mined=Mined("0xa", 0, 101, True)), PAYMENT, 12)
    assert isinstance(verdict, Failed) and not verdict.final and "reverted" in verdict.reason


def test_nonce_used_by_another_transaction_fails_it_only_without_a_receipt_of_ours() -> None:
    verdict = judge(obs(nonce_used=True), PAYMENT, 12)
    assert isinstance(verdict, Failed) and "can no longer be mined" in verdict.reason


def test_unmined_is_in_flight_then_replaced_after_n_blocks() -> None:
    assert judge(obs(head=111), PAYMENT, 12) == InFlight("payment:7")
    assert judge(obs(head=112), PAYMENT, 12) is REPLACE


def test_a_payment_being_cancelled_is_never_replaced_and_its_mined_cancel_ends_it() -> None:
    cancelling = replace(PAYMENT, cancel_reason="block 7 left the chain", cancel_tx_hash="0xc")
    assert judge(obs(head=500), cancelling, 12) == InFlight("payment:7")
    mined = obs(mined=Mined("0xc", 1, 101, final=True))
    assert judge(mined, cancelling, 12) == Cancelled("0xc")
    assert cancelling.candidates == ("0xa", "0xb", "0xc")


def test_the_tag_round_trips_through_the_calldata() -> None:
    tag = PayoutTag("dep_01M8HA2ZRKSZHPX5KWFGFCD0T9", bytes(range(12)))
    data = transfer_calldata(DESTINATION, AMOUNT, tag.encode())
    assert len(data) == 4 + 64 + 32 and tag.encode().startswith(b"STL\x01")
    assert decode(data) == tag
    assert transfer_args(data) == (DESTINATION, AMOUNT)
    assert decode(transfer_calldata(DESTINATION, AMOUNT)) is None
