"""The chains file: what ops may change, checked when it loads."""

from decimal import Decimal

import pytest

from services.core.chains import ChainsFileError, load_chains, parse_chains
from shared.errors import UnsupportedChain


def test_shipped_file_has_the_three_active_chains_and_a_declared_one() -> None:
    registry = load_chains()
    assert [c.chain_id for c in registry.active()] == [1, 137, 8453]
    arbitrum = registry.get(42161)
    assert arbitrum is not None and arbitrum.status == "declared"
    assert arbitrum.assets == () and arbitrum.min_deposit_usd is None


def test_canonical_token_addresses_and_decimals() -> None:
    registry = load_chains()
    usdc_eth = registry.get(1).asset_by_symbol("USDC")  # type: ignore[union-attr]
    assert usdc_eth.token_address == "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"  # type: ignore[union-attr]
    assert usdc_eth.decimals == 6  # type: ignore[union-attr]
    base = registry.get(8453)
    assert base is not None
    assert base.asset_by_token("0x833589fcd6edb6e08f4c7c32d4f71b54bda02913").symbol == "USDC"  # type: ignore[union-attr]
    assert {a.symbol for a in registry.get(137).assets} >= {"USDC", "USDT"}  # type: ignore[union-attr]


@pytest.mark.parametrize("chain_id", [42161, 999999, 0])
def test_require_active_refuses_declared_and_unknown(chain_id: int) -> None:
    with pytest.raises(UnsupportedChain) as err:
        load_chains().require_active(chain_id)
    assert err.value.body()["error"].startswith("unsupported_chain")


def test_default_venue_is_an_active_chain_asset() -> None:
    registry = load_chains()
    assert (registry.default_venue_chain_id, registry.default_venue_asset) == (8453, "USDC")


BASE = """
[default_settlement_venue]
chain_id = 1
asset = "USDC"
[[chains]]
chain_id = 1
name = "Ethereum"
status = "%s"
native_symbol = "ETH"
native_usd = 3000
gas_price_gwei = 10
settlement_gas_units = 65000
confirmations = %s
min_deposit_usd = 5
  [[chains.assets]]
  symbol = "USDC"
  token_address = "%s"
  decimals = 6
"""
GOOD_TOKEN = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"


def test_a_good_file_parses() -> None:
    chain = parse_chains(BASE % ("active", 3, GOOD_TOKEN)).get(1)
    assert chain is not None
    assert chain.confirmations == 3 and chain.min_deposit_usd == Decimal(5)


@pytest.mark.parametrize(
    "status, depth, token, message",
    [
        ("paused", 3, GOOD_TOKEN, "status"),
        ("active", 0, GOOD_TOKEN, "confirmations"),
        ("active", 3, GOOD_TOKEN.lower().replace("0xa0b8", "0xA0B8"), "checksummed"),
    ],
)
def test_bad_files_say_where(status: str, depth: int, token: str, message: str) -> None:
    with pytest.raises(ChainsFileError, match=message):
        parse_chains(BASE % (status, depth, token))


def test_each_shipped_chain_links_its_block_explorer_and_a_bad_link_is_refused() -> None:
    # The portal links tx hashes to these (issue 23): https, with the hash's place
    for chain in load_chains().chains:
        assert chain.explorer_tx_url is not None, chain.name
        assert chain.explorer_tx_url.startswith("https://") and "{txHash}" in chain.explorer_tx_url
    text = BASE % ("active", 3, GOOD_TOKEN)
    for bad in ('"http://etherscan.io/tx/{txHash}"', '"https://etherscan.io/tx/"', "7"):
        with pytest.raises(ChainsFileError, match="explorer_tx_url"):
            parse_chains(
                text.replace("min_deposit_usd = 5", f"min_deposit_usd = 5\nexplorer_tx_url = {bad}")
            )
