"""The settlement rules on plain values: no database, no clock, no chain."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from services.core.chains import Asset, Chain
from services.core.deposits import rules, states

USDC = Asset("USDC", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", 6)
EURC = Asset("EURC", "0x60a3E35Cc302bFA44Cb288Bc5a4F316Fdb1adb42", 6)
BASE = Chain(
    chain_id=8453,
    name="Base",
    status="active",
    native_symbol="ETH",
    native_usd=Decimal(3000),
    gas_price_gwei=Decimal("0.02"),
    settlement_gas_units=65000,
    confirmations=3,
    min_deposit_usd=Decimal(1),
    assets=(USDC, EURC),
)
PAYEE = rules.Payee(BASE, USDC, Decimal(1))
FEE = Decimal("0.25")


def facts(
    amount_usd: str | None, asset: str | None = "USDC", sandbox: str | None = None
) -> rules.SettlementFacts:
    return rules.SettlementFacts(
        asset=asset,
        amount_usd=None if amount_usd is None else Decimal(amount_usd),
        sandbox_outcome=sandbox,
    )


def test_a_deposit_above_the_floor_pays_the_net_in_destination_units() -> None:
    # Given 125.50 USD of USDC and a 0.25 fee, paid in USDC
    decision = rules.decide(facts("125.50"), BASE, FEE, PAYEE)
    # Then the net is paid, to the token's decimals
    assert decision == rules.Pay(FEE, Decimal("125.25"), Decimal("125.250000"))


def test_the_destination_price_converts_the_net_rounding_down() -> None:
    # Given a destination token worth 1.08 USD
    payee = rules.Payee(BASE, EURC, Decimal("1.08"))
    decision = rules.decide(facts("10.25"), BASE, FEE, payee)
    # Then 10 USD buys 9.259259 EURC (never a micro-unit more)
    assert isinstance(decision, rules.Pay) and decision.amount == Decimal("9.259259")


def test_below_the_floor_is_dust() -> None:
    decision = rules.decide(facts("0.999999"), BASE, FEE, PAYEE)
    assert isinstance(decision, rules.Fail) and decision.reason == states.REASON_BELOW_MINIMUM
    assert decision.fee_usd == FEE


def test_exactly_the_floor_is_not_dust() -> None:
    assert isinstance(rules.decide(facts("1"), BASE, FEE, PAYEE), rules.Pay)


def test_a_fee_that_eats_the_whole_amount_fails_below_fee() -> None:
    decision = rules.decide(facts("2"), BASE, Decimal("2"), PAYEE)
    assert decision == rules.Fail(states.REASON_BELOW_FEE, Decimal("2"), Decimal(0))


def test_a_net_too_small_for_one_destination_unit_fails_below_fee() -> None:
    payee = rules.Payee(BASE, EURC, Decimal(10**7))  # one unit is worth more than the net
    decision = rules.decide(facts("5"), BASE, FEE, payee)
    assert isinstance(decision, rules.Fail) and decision.reason == states.REASON_BELOW_FEE


@pytest.mark.parametrize(
    ("given", "chain", "payee", "review"),
    [
        (facts("10", asset=None), BASE, PAYEE, states.REVIEW_UNSUPPORTED_TOKEN),
        (facts("10"), None, PAYEE, states.REVIEW_UNSUPPORTED_TOKEN),
        (facts(None), BASE, PAYEE, states.REVIEW_NO_PRICE),
        (facts("10"), BASE, None, states.REVIEW_UNSUPPORTED_DESTINATION),
        (facts("10"), BASE, rules.Payee(BASE, EURC, None), states.REVIEW_UNSUPPORTED_DESTINATION),
        (
            facts("10"),
            BASE,
            rules.Payee(BASE, EURC, Decimal(0)),
            states.REVIEW_UNSUPPORTED_DESTINATION,
        ),
    ],
)
def test_what_a_person_must_look_at(
    given: rules.SettlementFacts,
    chain: Chain | None,
    payee: rules.Payee | None,
    review: str,
) -> None:
    decision = rules.decide(given, chain, FEE, payee)
    assert isinstance(decision, rules.Review) and decision.reason == review


def test_sandbox_outcomes_come_first() -> None:
    assert rules.decide(facts("50", sandbox="failed"), BASE, FEE, PAYEE) == rules.Fail(
        states.REASON_SANDBOX
    )
    assert rules.decide(facts("50", sandbox="manual_review"), BASE, FEE, PAYEE) == rules.Review(
        states.REVIEW_SANDBOX
    )
    assert isinstance(rules.decide(facts("50", sandbox="credited"), BASE, FEE, PAYEE), rules.Pay)


def test_retries_back_off_then_stop() -> None:
    assert rules.retry_delay(1, 3, 5.0) == timedelta(seconds=5)
    assert rules.retry_delay(2, 3, 5.0) == timedelta(seconds=10)
    assert rules.retry_delay(3, 3, 5.0) is None


NOW = datetime(2026, 11, 21, 4, 0, tzinfo=UTC)


def refusal(status: str, *, in_flight: bool = False, quiet_s: float = 3600) -> str | None:
    return rules.ops_refusal(
        "dep_X",
        status,
        payment_in_flight=in_flight,
        updated_at=NOW - timedelta(seconds=quiet_s),
        now=NOW,
        stuck_after_s=1800,
    )


def test_ops_may_resolve_manual_review_at_once() -> None:
    assert refusal(states.MANUAL_REVIEW_REQUIRED, quiet_s=0) is None


def test_ops_may_not_resolve_a_final_deposit() -> None:
    assert refusal(states.CREDITED) == "deposit dep_X is already credited"


def test_ops_wait_for_a_stuck_deposit_with_nothing_in_flight() -> None:
    assert refusal(states.SOURCE_CONFIRMED, quiet_s=60) is not None
    assert refusal(states.SOURCE_CONFIRMED, quiet_s=3600) is None
    assert refusal(states.SOURCE_CONFIRMED, quiet_s=3600, in_flight=True) is not None


BAND = Decimal("0.02")


def test_dust_shows_no_net() -> None:
    decision = rules.decide(facts("0.999999"), BASE, FEE, PAYEE)
    assert isinstance(decision, rules.Fail) and decision.net_usd is None


@pytest.mark.parametrize(
    ("price", "reason"),
    [(Decimal("0.97"), "off_peg: USDC at 0.97 USD (band 2 %)"), (None, states.REVIEW_NO_PRICE)],
)
def test_a_stablecoin_off_its_peg_or_without_a_price_goes_to_review(
    price: Decimal | None, reason: str
) -> None:
    decision = rules.decide(facts("100"), BASE, FEE, PAYEE, rules.PegCheck(price, BAND))
    assert decision == rules.Review(reason)


def test_the_guard_looks_at_the_destination_too_and_lets_the_band_through() -> None:
    depegged = rules.Payee(BASE, USDC, Decimal("1.03"))
    decision = rules.decide(facts("100"), BASE, FEE, depegged, rules.PegCheck(Decimal(1), BAND))
    assert isinstance(decision, rules.Review) and decision.reason.startswith("off_peg: USDC")
    within = rules.decide(facts("100"), BASE, FEE, PAYEE, rules.PegCheck(Decimal("0.99"), BAND))
    assert isinstance(within, rules.Pay)
    # A non-dollar asset has no peg to guard
    eurc = rules.decide(
        facts("100", "EURC"), BASE, FEE, PAYEE, rules.PegCheck(Decimal("1.08"), BAND)
    )
    assert isinstance(eurc, rules.Pay)
