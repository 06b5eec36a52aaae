"""Token amounts as tenants write them (services/core/amounts.py): one rule everywhere."""

from __future__ import annotations

from decimal import Decimal

import pytest

from services.core import amounts
from services.core.chains import Asset, ChainsFileError, load_chains, parse_chains
from services.core.deposits.pricing import amount_usd, token_amount

USDC = Asset("USDC", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", 6)
DAI = Asset("DAI", "0x50c5725949A6F0c72E6C4a641F24049A917DB0Cb", 18)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("125.50", Decimal("125.50")),
        ("1", Decimal(1)),
        ("007.5", Decimal("7.5")),
        ("0.000001", Decimal("0.000001")),
        ("9" * 15, Decimal("9" * 15)),
        ("1." + "0" * 35 + "1", Decimal("1." + "0" * 35 + "1")),
    ],
)
def test_decimal_strings_are_read_exactly(text: str, value: Decimal) -> None:
    parsed = amounts.parse_amount(text)
    assert parsed == value
    assert amounts.decimals_of(parsed) == len(text.partition(".")[2])


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0",
        "0.000",
        "-1",
        "+1",
        "1e3",
        "1E3",
        ".5",
        "5.",
        "1,5",
        "1_000",
        " 5",
        "5 ",
        "125.50\n",  # `$` in a regex matches before a final newline: this once passed
        "125.50\r",
        "\n125.50",
        "NaN",
        "Infinity",
        "\uff15",  # fullwidth 5
        "\u0665",  # Arabic-Indic 5
        "1\u00b75",
        "1" + "0" * 15,  # 10^15: beyond the sane magnitude
        "1" + "0" * 22,  # 10^22: once a 500 (the USD arithmetic overflowed)
        "1." + "0" * 37,
        5,
        1.5,
        None,
        True,
    ],
)
def test_anything_else_is_refused(text: object) -> None:
    with pytest.raises(amounts.AmountError):
        amounts.parse_amount(text)


def test_decimals_count_as_written_and_must_fit_the_token() -> None:
    assert amounts.fits(Decimal("1.000001"), USDC)
    assert not amounts.fits(Decimal("1.0000010"), USDC)
    assert amounts.fits(Decimal("1.0000010"), DAI)


def test_conversions_are_exact_at_the_largest_amounts() -> None:
    # 33 significant digits: the default context (28) rounded these, silently
    top = Decimal("999999999999999.999999999999999999")
    raw = amounts.base_units(top, 18)
    assert raw == 10**33 - 1
    assert amounts.token_units(raw, 18) == top
    assert amounts.base_units(amounts.token_units(2**256 - 1, 6), 6) == 2**256 - 1
    assert amount_usd(top, Decimal(1)) == Decimal("999999999999999.999999")
    assert token_amount(Decimal("999999999999999.999999"), Decimal(1), 18) == Decimal(
        "999999999999999.999999"
    )


def test_amounts_are_written_one_way() -> None:
    assert amounts.format_amount(Decimal("125.5")) == "125.50"
    assert amounts.format_amount(Decimal("125.500000")) == "125.50"
    assert amounts.format_amount(Decimal("1000")) == "1000.00"
    assert amounts.format_amount(Decimal("0.000001")) == "0.000001"
    # Every digit, however many: the default context's 28 significant digits once rounded
    # a uint256 amount (and a statement's totals) to 1157920892373161954235709850000...
    huge = amounts.token_units(2**256 - 1, 18)
    assert amounts.format_amount(huge) == f"{huge:f}"
    assert amounts.format_amount(Decimal("12345678901.1234567890123456789")) == (
        "12345678901.1234567890123456789"
    )


def test_symbols_match_case_insensitively_and_a_chains_file_keeps_them_apart() -> None:
    registry = load_chains()
    base = registry.get(8453)
    assert base is not None
    assert base.asset_by_symbol("usdc") is base.asset_by_symbol("USDC") is not None
    assert base.asset_by_symbol("USDT") is None
    text = """
    default_settlement_venue = { chain_id = 1, asset = "USDC" }
    [[chains]]
    chain_id = 1
    name = "Ethereum"
    status = "active"
    native_symbol = "ETH"
    native_usd = 3000
    gas_price_gwei = 10
    settlement_gas_units = 65000
    confirmations = 12
    min_deposit_usd = 1
    [[chains.assets]]
    symbol = "USDC"
    token_address = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"
    decimals = 6
    [[chains.assets]]
    symbol = "usdc"
    token_address = "0xdAC17F958D2ee523a2206206994597C13D831ec7"
    decimals = 6
    """
    with pytest.raises(ChainsFileError, match="any case"):
        parse_chains(text)
