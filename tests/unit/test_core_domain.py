"""Pure rules of destinations, account input, account documents and fee quotes (no I/O)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from services.core import quotes
from services.core.accounts import (
    deposit_addresses_document,
    external_user_id_problem,
    metadata_problems,
)
from services.core.chains import ChainRegistry, load_chains
from services.core.destinations import Destination, validate_destination
from shared.errors import InvalidRequest, UnsupportedChain

USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
USDC_ETH = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"
WALLET = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"


@pytest.fixture(scope="module")
def registry() -> ChainRegistry:
    return load_chains()


def test_a_good_destination_returns_its_chain(registry: ChainRegistry) -> None:
    chain = validate_destination(registry, Destination(8453, WALLET, USDC_BASE))
    assert chain.chain_id == 8453
    # Token matching ignores case (schemas checksum before this, but the rule must not care)
    assert validate_destination(registry, Destination(8453, WALLET, USDC_BASE.lower()))


@pytest.mark.parametrize("chain_id", [42161, 999_999, 0, -1])
def test_inactive_or_unknown_chains_are_unsupported(registry: ChainRegistry, chain_id: int) -> None:
    with pytest.raises(UnsupportedChain):
        validate_destination(registry, Destination(chain_id, WALLET, USDC_BASE))


@pytest.mark.parametrize(
    ("destination", "field"),
    [
        (Destination(8453, WALLET, USDC_ETH), "destination.tokenAddress"),
        (Destination(8453, "0x" + "0" * 40, USDC_BASE), "destination.address"),
        (Destination(8453, USDC_BASE, USDC_BASE), "destination.address"),
    ],
)
def test_destination_errors_name_the_field(
    registry: ChainRegistry, destination: Destination, field: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validate_destination(registry, destination)
    assert caught.value.details == {"fields": {field: caught.value.details["fields"][field]}}  # type: ignore[index]
    assert caught.value.message.startswith(field)


def test_destination_document_is_camel_case() -> None:
    assert Destination(1, WALLET, USDC_ETH).document() == {
        "chainId": 1,
        "address": WALLET,
        "tokenAddress": USDC_ETH,
    }


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("a", True),
        ("user@example.com", True),
        ("ünïcødé 用户 🙂", True),
        ("x" * 255, True),
        ("", False),
        ("x" * 256, False),
        ("   ", False),
        ("a\tb", False),
        ("a\x00b", False),
        ("\ud800", False),
        ("a\u200bb", False),  # zero-width space: a format character, not printable
    ],
)
def test_external_user_ids(value: str, ok: bool) -> None:
    assert (external_user_id_problem(value) is None) is ok


def test_metadata_rules() -> None:
    assert metadata_problems({}) == {}
    assert metadata_problems({"s": "x" * 500, "n": 1, "f": 1.5, "b": False, "z": None}) == {}
    assert set(metadata_problems({"nested": {"a": 1}, "list": [], "ok": 1})) == {"nested", "list"}
    assert set(metadata_problems({"s": "x" * 501})) == {"s"}
    assert set(metadata_problems({"k" * 41: 1, "": 2})) == {"k" * 41, ""}
    assert set(metadata_problems({"nan": float("nan"), "inf": float("inf")})) == {"nan", "inf"}
    assert set(metadata_problems({"nul": "a\x00", "sur": "\udc00"})) == {"nul", "sur"}
    assert metadata_problems({f"k{i}": i for i in range(50)}) == {}
    assert set(metadata_problems({f"k{i}": i for i in range(51)})) == {"_schema"}


def test_deposit_addresses_follow_the_registry_and_skip_inactive_chains(
    registry: ChainRegistry,
) -> None:
    stored = [(8453, "0xB"), (42161, "0xD"), (1, "0xA"), (137, "0xC")]
    document = deposit_addresses_document(registry, stored)
    assert [(d["chainId"], d["address"]) for d in document] == [
        (1, "0xA"),
        (137, "0xC"),
        (8453, "0xB"),
    ]
    assert document[2]["assets"] == ["USDC", "DAI"]


def _fee(chain: object) -> Decimal:
    return Decimal("0.5")


def test_quotes_net_floor_and_dust(registry: ChainRegistry) -> None:
    (quote,) = quotes.preview(registry, _fee, amount=Decimal("125.5"), chain_id=8453, symbol="usdc")
    assert quote == quotes.Quote(
        chain_id=8453,
        asset="USDC",
        token_address=USDC_BASE,
        amount="125.50",
        amount_usd=Decimal("125.5"),
        settlement_gas_fee_usd=Decimal("0.5"),
        net_amount_usd=Decimal("125.0"),
        min_deposit_usd=Decimal(1),
        below_minimum=False,
    )
    (tiny,) = quotes.preview(registry, _fee, amount=Decimal("0.25"), chain_id=8453, symbol="USDC")
    assert tiny.net_amount_usd == 0 and tiny.below_minimum is True
    # Written as the deposit object writes amounts: no leading zeros, no exponent
    (odd,) = quotes.preview(registry, _fee, amount=Decimal("007.0000001"), chain_id=1, symbol="DAI")
    assert odd.amount == "7.0000001"


def test_amount_finer_than_the_asset_is_refused(registry: ChainRegistry) -> None:
    with pytest.raises(InvalidRequest, match="USDC"):
        quotes.preview(registry, _fee, amount=Decimal("1.0000001"), chain_id=1)
    assert len(quotes.preview(registry, _fee, amount=Decimal("1.0000001"), symbol="DAI")) == 2
    # Decimals count as written: trailing zeros too
    with pytest.raises(InvalidRequest, match="7 decimal places"):
        quotes.preview(registry, _fee, amount=Decimal("1.0000000"), chain_id=1, symbol="USDC")


def test_filters(registry: ChainRegistry) -> None:
    with pytest.raises(UnsupportedChain):
        quotes.preview(registry, _fee, amount=Decimal("1"), chain_id=42161)
    with pytest.raises(InvalidRequest, match="asset"):
        quotes.preview(registry, _fee, amount=Decimal("1"), chain_id=8453, symbol="USDT")
    pairs = quotes.matching_assets(registry, None, None)
    assert len(pairs) == sum(len(c.assets) for c in registry.active())
    assert quotes.matching_assets(registry, 137, "usdc.E") == [
        (registry.get(137), registry.get(137).asset_by_symbol("USDC.e"))  # type: ignore[union-attr]
    ]
