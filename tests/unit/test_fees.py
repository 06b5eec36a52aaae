"""The flat settlement fee: gas units x gas price x native USD price, rounded up."""

from decimal import Decimal

from services.core.chains import load_chains
from services.core.fees import configured_gas_price, fee_for_missing, settlement_fee_usd


def test_fee_is_gas_units_times_price_times_native_usd() -> None:
    # 65,000 gas at 12 gwei with ETH at $3,000 = 0.00078 ETH = $2.34
    assert settlement_fee_usd(65_000, 12 * 10**9, Decimal(3000)) == Decimal("2.340000")


def test_fee_rounds_up_to_the_micro_dollar() -> None:
    # 65,000 gas at 1 wei and $1: 6.5e-14 USD -> 0.000001, never 0
    assert settlement_fee_usd(65_000, 1, Decimal(1)) == Decimal("0.000001")


def test_declared_chain_fee_is_zero_and_active_fee_comes_from_the_file() -> None:
    registry = load_chains()
    assert fee_for_missing(registry.get(42161)) == 0  # type: ignore[arg-type]
    polygon = registry.get(137)
    assert polygon is not None
    assert configured_gas_price(polygon) == 40 * 10**9
    assert fee_for_missing(polygon) == settlement_fee_usd(65_000, 40 * 10**9, Decimal("0.25"))
