"""Knobs of the deposit pipeline: a frozen object that CoreConfig carries (`deposits`).

Read from the environment once, by `CoreConfig.from_env`; the node URLs are
CoreConfig.rpc_urls (`SETTLE_RPC_URL_<chainId>`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from services.core.chains import Chain
from shared.settings import SettingsError, env_bool, env_float, env_int, env_str

#: The key of a setting given for every chain (no chain has id 0).
ALL_CHAINS = 0
#: `chainId:SYMBOL=balance[@threshold]`, comma-separated.
_INVENTORY_ITEM = re.compile(r"^\s*(\d+):([A-Za-z0-9._-]+)=([0-9.]+)(?:@([0-9.]+))?\s*$")


@dataclass(frozen=True)
class InventorySeed:
    chain_id: int
    asset: str
    balance: Decimal
    low_threshold: Decimal


@dataclass(frozen=True)
class BalanceMinimum:
    """A hot wallet balance below which ops want an alert (token units)."""

    chain_id: int
    asset: str
    amount: Decimal


@dataclass(frozen=True)
class PipelineSettings:
    #: Seconds per simulated block of sandbox deposits (0: confirmed at once).
    sandbox_block_s: float = 0.05
    #: Blocks the watcher stays behind the node's head when scanning.
    watcher_lag_blocks: int = 1
    #: Most blocks per eth_getLogs call.
    watcher_max_range: int = 500
    #: Keep transfers of unknown tokens to deposit addresses for ops (one more
    #: eth_getLogs per range read at finality, for every token's Transfer logs).
    watcher_stray_tokens: bool = True
    #: Seconds between watcher rounds when caught up.
    watcher_poll_s: float = 2.0
    #: JSON-RPC timeout of the watchers' nodes.
    rpc_timeout_s: float = 10.0
    #: Seconds between settlement rounds when idle.
    poll_s: float = 0.5
    #: Deposits per settlement round and step.
    batch_size: int = 100
    #: Settlement attempts (providers and retries together) before manual review.
    max_settle_attempts: int = 5
    #: Seconds before a failed settlement attempt is retried (doubles each time).
    retry_base_s: float = 5.0
    #: Consecutive failures (health checks or routes) that mark a provider degraded.
    provider_max_failures: int = 3
    #: Seconds between provider health checks.
    health_check_s: float = 30.0
    #: Seconds an in-flight payment may stay unresolved before manual review.
    stuck_payment_s: float = 300.0
    #: Blocks a hot-wallet payment may stay unmined before it is replaced (same nonce
    #: and calldata, higher fees).
    payment_replace_blocks: int = 12
    #: Highest fee per gas (gwei) a payment may offer, by chain id (ALL_CHAINS: every
    #: chain), over the chains file's `payment_max_fee_gwei`. A payout the market prices
    #: over it waits, alerting, rather than bid up (`fee_cap_gwei`).
    payment_max_fee_gwei: Mapping[int, Decimal] = field(default_factory=dict)
    #: Replacements a hot-wallet payment may have; past it, it waits (alerting).
    payment_max_replacements: int = 5
    #: Seconds a deposit may wait for a hot wallet short of its token or of gas before a
    #: person is asked (manual review, `hot_wallet_insufficient_balance`).
    hot_wallet_wait_s: float = 21600.0
    #: Seconds between tries of a waiting deposit (`waitReason`).
    wait_retry_s: float = 30.0
    #: Seconds after which an in-flight hot-wallet payment is logged (once) as old;
    #: `settle_hot_wallet_payment_oldest_seconds` shows it all along.
    payment_alert_s: float = 600.0
    #: Seconds without progress after which ops may resolve a non-review deposit.
    ops_stuck_after_s: float = 1800.0
    #: Simulated payer and route provider for non-sandbox deposits (dev and demos).
    simulated_settlement: bool = True
    #: Seconds the simulated route provider takes to bridge.
    simulated_bridge_s: float = 1.0
    #: Hex private key of the hot wallet that pays direct and inventory credits on chain.
    hot_wallet_key: str | None = None
    #: USD prices by asset symbol, over the built-in stablecoins at 1 (the fixed table).
    prices_usd: Mapping[str, Decimal] = field(default_factory=dict)
    #: `static` (the fixed table) or the http(s) URL of a JSON price document.
    price_source: str = "static"
    #: Seconds between fetches of a URL price source (by the worker).
    price_refresh_s: float = 60.0
    #: Seconds a fetched price stays usable; older, the asset has no price (review).
    price_max_age_s: float = 300.0
    #: How far (a fraction) a dollar stablecoin may trade from 1 and still be settled.
    peg_band: Decimal = Decimal("0.02")
    #: Inventory balances to start from (rows already tracked are not overwritten).
    inventory: tuple[InventorySeed, ...] = ()
    #: Hot wallet balances under which `settle_hot_wallet_balance` alerts.
    hot_wallet_minimums: tuple[BalanceMinimum, ...] = ()

    def fee_cap_gwei(self, chain: Chain | None) -> Decimal | None:
        """The chain's cap on a payment's fee per gas: the setting for the chain, else the
        setting for every chain, else the chains file's (None: no cap)."""
        if chain is None:
            return self.payment_max_fee_gwei.get(ALL_CHAINS)
        caps = self.payment_max_fee_gwei
        return caps.get(chain.chain_id, caps.get(ALL_CHAINS, chain.payment_max_fee_gwei))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PipelineSettings:
        """The settings in `env` (CoreConfig.from_env's part; nothing else reads them)."""
        dev = (env_str(env, "SETTLE_ENV", "dev") or "dev") == "dev"
        return cls(
            sandbox_block_s=_non_negative(env, "SETTLE_SANDBOX_BLOCK_S", 0.05),
            watcher_lag_blocks=env_int(env, "SETTLE_WATCHER_LAG_BLOCKS", 1),
            watcher_max_range=max(1, env_int(env, "SETTLE_WATCHER_MAX_RANGE", 500)),
            watcher_stray_tokens=env_bool(env, "SETTLE_WATCHER_STRAY_TOKENS", True),
            watcher_poll_s=_non_negative(env, "SETTLE_WATCHER_POLL_S", 2.0),
            rpc_timeout_s=_non_negative(env, "SETTLE_RPC_TIMEOUT_S", 10.0),
            poll_s=_non_negative(env, "SETTLE_PIPELINE_POLL_S", 0.5),
            batch_size=max(1, env_int(env, "SETTLE_PIPELINE_BATCH", 100)),
            max_settle_attempts=max(1, env_int(env, "SETTLE_SETTLE_MAX_ATTEMPTS", 5)),
            retry_base_s=_non_negative(env, "SETTLE_SETTLE_RETRY_S", 5.0),
            provider_max_failures=max(1, env_int(env, "SETTLE_PROVIDER_MAX_FAILURES", 3)),
            health_check_s=_non_negative(env, "SETTLE_PROVIDER_HEALTH_S", 30.0),
            stuck_payment_s=_non_negative(env, "SETTLE_STUCK_PAYMENT_S", 300.0),
            payment_replace_blocks=max(1, env_int(env, "SETTLE_PAYMENT_REPLACE_BLOCKS", 12)),
            payment_alert_s=_non_negative(env, "SETTLE_PAYMENT_ALERT_S", 600.0),
            payment_max_fee_gwei=parse_fee_caps(
                env_str(env, "SETTLE_PAYMENT_MAX_FEE_GWEI", "") or ""
            ),
            payment_max_replacements=max(0, env_int(env, "SETTLE_PAYMENT_MAX_REPLACEMENTS", 5)),
            hot_wallet_wait_s=_non_negative(env, "SETTLE_HOT_WALLET_WAIT_S", 21600.0),
            wait_retry_s=_non_negative(env, "SETTLE_WAIT_RETRY_S", 30.0),
            ops_stuck_after_s=_non_negative(env, "SETTLE_OPS_STUCK_AFTER_S", 1800.0),
            simulated_settlement=env_bool(env, "SETTLE_SIMULATED_SETTLEMENT", dev),
            simulated_bridge_s=_non_negative(env, "SETTLE_SIMULATED_BRIDGE_S", 1.0),
            hot_wallet_key=env_str(env, "SETTLE_HOT_WALLET_KEY"),
            prices_usd=parse_prices(env_str(env, "SETTLE_PRICES_USD", "") or ""),
            price_source=parse_price_source(env_str(env, "SETTLE_PRICE_SOURCE", "") or "static"),
            price_refresh_s=_non_negative(env, "SETTLE_PRICE_REFRESH_S", 60.0),
            price_max_age_s=_non_negative(env, "SETTLE_PRICE_MAX_AGE_S", 300.0),
            peg_band=_decimal(env_str(env, "SETTLE_PEG_BAND", "0.02") or "0.02", "SETTLE_PEG_BAND"),
            inventory=parse_inventory(env_str(env, "SETTLE_INVENTORY", "") or ""),
            hot_wallet_minimums=parse_minimums(
                env_str(env, "SETTLE_HOT_WALLET_MIN_BALANCE", "") or ""
            ),
        )


def _non_negative(env: Mapping[str, str], name: str, default: float) -> float:
    value = env_float(env, name, default)
    if value < 0:
        raise SettingsError(f"{name} must not be negative")
    return value


def _decimal(text: str, name: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise SettingsError(f"{name}: {text!r} is not a number") from None
    if not value.is_finite() or value < 0:
        raise SettingsError(f"{name}: {text!r} must be a non-negative number")
    return value


def parse_prices(text: str) -> dict[str, Decimal]:
    """`WETH=3000,EURC=1.08` -> {"WETH": Decimal("3000"), ...}."""
    prices: dict[str, Decimal] = {}
    for item in (p for p in text.split(",") if p.strip()):
        symbol, sep, value = item.partition("=")
        if not sep or not symbol.strip():
            raise SettingsError(f"SETTLE_PRICES_USD: {item!r} is not SYMBOL=price")
        prices[symbol.strip()] = _decimal(value.strip(), "SETTLE_PRICES_USD")
    return prices


def parse_fee_caps(text: str) -> dict[int, Decimal]:
    """`200` (every chain) or `1=200,137=3000` (by chain id), or both: gwei per gas."""
    caps: dict[int, Decimal] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        chain, sep, value = item.rpartition("=")
        if sep and not chain.strip().isdigit():
            raise SettingsError(f"SETTLE_PAYMENT_MAX_FEE_GWEI: {item!r} is not [chainId=]gwei")
        caps[int(chain) if sep else ALL_CHAINS] = _decimal(
            value.strip(), "SETTLE_PAYMENT_MAX_FEE_GWEI"
        )
    return caps


def parse_price_source(text: str) -> str:
    """`static`, or an http(s) URL."""
    text = text.strip()
    if text == "static" or text.startswith(("http://", "https://")):
        return text
    raise SettingsError(f"SETTLE_PRICE_SOURCE: {text!r} is neither 'static' nor an http(s) URL")


def parse_inventory(text: str) -> tuple[InventorySeed, ...]:
    """`8453:USDC=250000@10000,1:USDC=50000` (threshold defaults to 10 % of the balance)."""
    seeds = []
    for item in (p for p in text.split(",") if p.strip()):
        match = _INVENTORY_ITEM.match(item)
        if not match:
            raise SettingsError(
                f"SETTLE_INVENTORY: {item!r} is not chainId:SYMBOL=balance[@threshold]"
            )
        balance = _decimal(match.group(3), "SETTLE_INVENTORY")
        threshold = _decimal(match.group(4), "SETTLE_INVENTORY") if match.group(4) else balance / 10
        seeds.append(InventorySeed(int(match.group(1)), match.group(2), balance, threshold))
    return tuple(seeds)


def parse_minimums(text: str) -> tuple[BalanceMinimum, ...]:
    """SETTLE_HOT_WALLET_MIN_BALANCE: `8453:USDC=5000,8453:ETH=0.05` (token units; the
    chain's native symbol for its gas)."""
    found = []
    for item in (part for part in text.split(",") if part.strip()):
        match = _INVENTORY_ITEM.match(item)
        if not match or match.group(4):
            raise SettingsError(
                f"SETTLE_HOT_WALLET_MIN_BALANCE: {item!r} is not chainId:SYMBOL=amount"
            )
        amount = _decimal(match.group(3), "SETTLE_HOT_WALLET_MIN_BALANCE")
        found.append(BalanceMinimum(int(match.group(1)), match.group(2), amount))
    return tuple(found)
