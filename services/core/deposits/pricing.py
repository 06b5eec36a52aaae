"""USD value of a deposit: token amount x the asset's USD price.

Stablecoins count at 1 by default; `SETTLE_PRICES_USD` adds or overrides prices by
symbol. An asset without a price has no USD value, and its deposit goes to manual
review rather than being settled at a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_DOWN, Decimal
from typing import Protocol

from services.core.amounts import EXACT
from services.core.fees import USD_QUANTUM

#: Dollar stablecoins priced at 1 unless configured otherwise.
STABLECOINS: tuple[str, ...] = (
    "USDC",
    "USDC.e",
    "USDbC",
    "USDT",
    "USDT0",
    "DAI",
    "PYUSD",
    "USDS",
    "FDUSD",
)


class PriceSource(Protocol):
    def usd_price(self, chain_id: int, symbol: str) -> Decimal | None:
        """USD price of one unit of the asset, or None when unknown."""
        ...


class StaticPrices:
    """Prices from configuration: stablecoins at 1 plus overrides."""

    def __init__(self, overrides: Mapping[str, Decimal] | None = None) -> None:
        self._prices: dict[str, Decimal] = dict.fromkeys(STABLECOINS, Decimal(1))
        self._prices.update(overrides or {})

    def usd_price(self, chain_id: int, symbol: str) -> Decimal | None:
        return self._prices.get(symbol)


def amount_usd(amount: Decimal, price: Decimal | None) -> Decimal | None:
    """USD value to the micro-dollar, rounded down (a credit is never overstated)."""
    if price is None:
        return None
    # In EXACT: 28 significant digits (the default) rounded large 18-decimal amounts up.
    return EXACT.multiply(amount, price).quantize(USD_QUANTUM, ROUND_DOWN, EXACT)


def token_amount(usd: Decimal, price: Decimal, decimals: int) -> Decimal:
    """How many tokens `usd` buys, rounded down to the token's decimals."""
    return EXACT.divide(usd, price).quantize(Decimal(1).scaleb(-decimals), ROUND_DOWN, EXACT)
