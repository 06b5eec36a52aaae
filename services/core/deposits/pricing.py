"""USD value of a deposit: token amount x the asset's USD price, and the peg guard.

The source is a setting (`SETTLE_PRICE_SOURCE`): `static` (the default, for dev) is a
fixed table, stablecoins at 1 plus `SETTLE_PRICES_USD`; a URL is a JSON document of
prices (`{"prices": {"USDC": "0.9998", ...}}` or the bare mapping) that the worker
fetches every `SETTLE_PRICE_REFRESH_S` and trusts for `SETTLE_PRICE_MAX_AGE_S`.
An asset without a (fresh) price has no USD value, and its deposit goes to manual
review rather than being settled at a guess; so does a stablecoin priced more than
`SETTLE_PEG_BAND` away from 1 (`off_peg`, rules.decide), on either side of the credit.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Protocol

from services.core.amounts import EXACT
from services.core.fees import USD_QUANTUM

if TYPE_CHECKING:
    from services.core.deposits.settings import PipelineSettings

log = logging.getLogger(__name__)

#: `SETTLE_PRICE_SOURCE` naming the fixed table.
STATIC = "static"
#: Largest price document read (a price list is small; a huge answer is an error).
MAX_DOCUMENT_BYTES = 1_000_000

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


class PriceFeed:
    """Prices from a JSON document over HTTP(S), fetched by `refresh` (the worker calls
    it between rounds, never inside a database transaction); `usd_price` only reads
    what the last good fetch kept, and nothing once it is older than `max_age_s`."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        max_age_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.clock = clock
        self._lock = threading.Lock()
        self._prices: dict[str, Decimal] = {}
        self._fetched_at: float | None = None

    def refresh(self) -> bool:
        """Fetch the document; False (and the last good prices kept) when it fails."""
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:  # noqa: S310 - an operator's setting
                body = response.read(MAX_DOCUMENT_BYTES + 1)
            if len(body) > MAX_DOCUMENT_BYTES:
                raise ValueError("price document too large")
            prices = parse_document(json.loads(body))
        except Exception as exc:  # any failure: keep what we had until it is too old
            log.warning("price source %s: %s: %s", self.url, type(exc).__name__, exc)
            return False
        with self._lock:
            self._prices = prices
            self._fetched_at = self.clock()
        return True

    def usd_price(self, chain_id: int, symbol: str) -> Decimal | None:
        with self._lock:
            if self._fetched_at is None or self.clock() - self._fetched_at > self.max_age_s:
                return None
            return self._prices.get(symbol)


def parse_document(document: Any) -> dict[str, Decimal]:
    """`{"prices": {SYMBOL: price}}` or `{SYMBOL: price}`; prices finite and > 0."""
    if isinstance(document, dict) and isinstance(document.get("prices"), dict):
        document = document["prices"]
    if not isinstance(document, dict):
        raise ValueError("a price document is an object of SYMBOL: price")
    prices: dict[str, Decimal] = {}
    for symbol, value in document.items():
        try:
            price = Decimal(str(value))
        except InvalidOperation:
            raise ValueError(f"price of {symbol!r} is not a number") from None
        if not price.is_finite() or price <= 0:
            raise ValueError(f"price of {symbol!r} must be a positive number")
        prices[str(symbol)] = price
    return prices


def build_prices(settings: PipelineSettings) -> StaticPrices | PriceFeed:
    """The configured price source."""
    if settings.price_source == STATIC:
        return StaticPrices(settings.prices_usd)
    return PriceFeed(
        settings.price_source, timeout_s=settings.rpc_timeout_s, max_age_s=settings.price_max_age_s
    )


def off_peg(symbol: str, price: Decimal, band: Decimal) -> bool:
    """A dollar stablecoin priced more than `band` (a fraction) away from 1."""
    return symbol in STABLECOINS and abs(price - 1) > band


def amount_usd(amount: Decimal, price: Decimal | None) -> Decimal | None:
    """USD value to the micro-dollar, rounded down (a credit is never overstated)."""
    if price is None:
        return None
    # In EXACT: 28 significant digits (the default) rounded large 18-decimal amounts up.
    return EXACT.multiply(amount, price).quantize(USD_QUANTUM, ROUND_DOWN, EXACT)


def token_amount(usd: Decimal, price: Decimal, decimals: int) -> Decimal:
    """How many tokens `usd` buys, rounded down to the token's decimals."""
    return EXACT.divide(usd, price).quantize(Decimal(1).scaleb(-decimals), ROUND_DOWN, EXACT)
