"""Chains files for the address backfill tests: a chain X that is declared, then active."""

from __future__ import annotations

from pathlib import Path

from services.core.chains import DEFAULT_CHAINS_FILE, ChainRegistry, parse_chains

#: Arbitrum One's USDC (checksummed): any real token will do for the new chain.
NEW_CHAIN_TOKEN = "0xaf88d065e77c8cC2239327C5EDb3A432268e5831"


def chain_block(chain_id: int, status: str, *, name: str = "New chain") -> str:
    """A [[chains]] entry; an active one has one asset (USDC)."""
    block = f"""
[[chains]]
chain_id = {chain_id}
name = "{name}"
status = "{status}"
native_symbol = "ETH"
native_usd = 3000.0
gas_price_gwei = 0.01
settlement_gas_units = 65000
confirmations = 3
min_deposit_usd = 1.0
"""
    if status == "active":
        block += f"""
  [[chains.assets]]
  symbol = "USDC"
  token_address = "{NEW_CHAIN_TOKEN}"
  decimals = 6
"""
    return block


def shipped_with(chain_id: int, status: str) -> str:
    """The shipped chains file with chain `chain_id` between Ethereum and Polygon.

    In the middle, so list order (the chains file's) differs from insertion order.
    """
    text = DEFAULT_CHAINS_FILE.read_text(encoding="utf-8")
    marker = "[[chains]]\nchain_id = 137\n"
    assert marker in text
    return text.replace(marker, chain_block(chain_id, status) + "\n" + marker, 1)


def own_chains(venue_id: int, new_id: int, status: str) -> str:
    """Only chains no other test uses: an active venue chain and chain `new_id`.

    For full passes over the shared test database: they add addresses on these two
    chains only, which no other test reads.
    """
    return (
        f'[default_settlement_venue]\nchain_id = {venue_id}\nasset = "USDC"\n'
        + chain_block(venue_id, "active", name="Venue chain")
        + chain_block(new_id, status)
    )


def write_chains(folder: Path, name: str, text: str) -> tuple[Path, ChainRegistry]:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path, parse_chains(text)
