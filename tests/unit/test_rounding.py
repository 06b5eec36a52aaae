"""Rounding of money: credits and payouts round down, fees round up. The numbers are
chosen so that rounding half-up (the usual slip) gives another answer than the rule."""

from __future__ import annotations

from decimal import Decimal

from services.core.deposits.pricing import amount_usd, token_amount
from services.core.fees import settlement_fee_usd


def test_a_deposits_usd_value_rounds_down_not_half_up() -> None:
    # 3 x 0.33333353 = 1.00000059: half-up would credit 1.000001
    assert amount_usd(Decimal("3"), Decimal("0.33333353")) == Decimal("1.000000")
    # 18-decimal amounts too: 0.999999999999999999 x 1 = 0.999999|999...
    assert amount_usd(Decimal("0.999999999999999999"), Decimal("1")) == Decimal("0.999999")


def test_the_tokens_a_usd_amount_buys_round_down_not_half_up() -> None:
    # 2 / 3 = 0.666666|67: half-up would pay 0.666667
    assert token_amount(Decimal("2"), Decimal("3"), 6) == Decimal("0.666666")
    assert token_amount(Decimal("2"), Decimal("3"), 18) == Decimal("0.666666666666666666")


def test_a_settlement_fee_rounds_up_not_half_up() -> None:
    # 1 gas at 10^12 wei (10^-6 of the native coin) at 0.1 USD = 0.0000001 USD:
    # half-up (and down) would charge nothing
    assert settlement_fee_usd(1, 10**12, Decimal("0.1")) == Decimal("0.000001")
    # 65,000 gas at 0.01 gwei at 3,000 USD = 0.00195 USD exactly: no rounding at all
    assert settlement_fee_usd(65_000, 10**7, Decimal("3000")) == Decimal("0.001950")
