"""Chains and their assets, read from a data file ops can change (chains.toml).

The registry is immutable and loaded once per process; the live fee is not here
(it changes) but in the `chain_fees` table, written by the fee oracle.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from eth_utils import is_checksum_address

from shared.errors import UnsupportedChain

#: The file shipped with Settle; SETTLE_CHAINS_FILE points elsewhere.
DEFAULT_CHAINS_FILE = Path(__file__).with_name("chains.toml")

ACTIVE = "active"
DECLARED = "declared"

#: Block tags a chain's deposits may be confirmed at (JSON-RPC `eth_getBlockByNumber`).
FINALITY_TAGS = ("finalized", "safe")


@dataclass(frozen=True)
class Asset:
    symbol: str
    token_address: str
    decimals: int


@dataclass(frozen=True)
class Chain:
    chain_id: int
    name: str
    status: str
    native_symbol: str
    native_usd: Decimal
    gas_price_gwei: Decimal
    settlement_gas_units: int
    confirmations: int
    min_deposit_usd: Decimal | None
    assets: tuple[Asset, ...] = ()
    #: The node's tag a deposit's block must be under before it counts (`finalized`,
    #: `safe`), on top of `confirmations`; None: depth alone.
    finality_tag: str | None = None
    #: Depth that stands in for the tag when the node does not offer it: beyond the
    #: chain's known reorgs (0: `confirmations`).
    reorg_depth: int = 0
    #: Most a hot-wallet payout may offer per gas, gwei (SETTLE_PAYMENT_MAX_FEE_GWEI
    #: overrides it); None: no cap.
    payment_max_fee_gwei: Decimal | None = None
    #: A transaction's page on the chain's block explorer, `{txHash}` standing for the
    #: hash (the portal links each tx hash to it); None: no link.
    explorer_tx_url: str | None = None

    @property
    def final_depth(self) -> int:
        """Blocks a deposit needs on top when no finality tag can be read."""
        return max(self.confirmations, self.reorg_depth)

    def final_height(self, head: int, tagged: int | None) -> int:
        """The highest block that counts as final with the node at `head`: under the
        chain's confirmations and at or under its finality tag's block (`tagged`, None
        when the node does not offer the tag: then `final_depth` deep)."""
        if self.finality_tag and tagged is not None:
            return min(tagged, head - self.confirmations + 1)
        return head - self.final_depth + 1

    @property
    def is_active(self) -> bool:
        return self.status == ACTIVE

    def asset_by_symbol(self, symbol: str) -> Asset | None:
        """The asset a tenant names: symbols match case-insensitively (`usdc` is USDC)."""
        wanted = symbol.casefold()
        return next((a for a in self.assets if a.symbol.casefold() == wanted), None)

    def asset_by_token(self, token_address: str) -> Asset | None:
        wanted = token_address.lower()
        return next((a for a in self.assets if a.token_address.lower() == wanted), None)


@dataclass(frozen=True)
class ChainRegistry:
    chains: tuple[Chain, ...]
    default_venue_chain_id: int
    default_venue_asset: str
    _by_id: dict[int, Chain] = field(init=False, repr=False, compare=False)
    _active: tuple[Chain, ...] = field(init=False, repr=False, compare=False)
    _positions: dict[int, int] = field(init=False, repr=False, compare=False)
    #: (chain id, position) of each active chain, in registry order.
    active_positions: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Derived once: the registry is immutable, and every account creation asks.
        object.__setattr__(self, "_by_id", {c.chain_id: c for c in self.chains})
        object.__setattr__(self, "_active", tuple(c for c in self.chains if c.is_active))
        positions = {c.chain_id: i for i, c in reversed(list(enumerate(self.chains)))}
        object.__setattr__(self, "_positions", positions)
        object.__setattr__(
            self,
            "active_positions",
            tuple((c.chain_id, positions[c.chain_id]) for c in self._active),
        )

    def get(self, chain_id: int) -> Chain | None:
        return self._by_id.get(chain_id)

    def active(self) -> tuple[Chain, ...]:
        return self._active

    def require_active(self, chain_id: int) -> Chain:
        """The active chain, or `unsupported_chain` (declared or unknown chains)."""
        chain = self._by_id.get(chain_id)
        if chain is None:
            raise UnsupportedChain(f"chain {chain_id} is not supported")
        if not chain.is_active:
            raise UnsupportedChain(
                f"chain {chain_id} ({chain.name}) is declared but not active yet"
            )
        return chain

    def position(self, chain_id: int) -> int:
        """The chain's place in the chains file (KeyError for a chain not in it)."""
        return self._positions[chain_id]


class ChainsFileError(ValueError):
    """The chains file is not usable; the message says where."""


def _decimal(value: object, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ChainsFileError(f"{where} must be a number")
    return Decimal(str(value))


def _assets(raw: Iterable[dict[str, object]], where: str) -> tuple[Asset, ...]:
    assets = []
    for i, item in enumerate(raw):
        token = str(item["token_address"])
        if not is_checksum_address(token):
            raise ChainsFileError(f"{where}.assets[{i}].token_address must be EIP-55 checksummed")
        decimals = item["decimals"]
        if not isinstance(decimals, int) or not 0 <= decimals <= 36:
            raise ChainsFileError(f"{where}.assets[{i}].decimals must be 0..36")
        symbol = str(item["symbol"])
        if any(a.symbol.casefold() == symbol.casefold() for a in assets):
            # Symbols match case-insensitively (Chain.asset_by_symbol): keep them apart.
            raise ChainsFileError(f"{where}.assets[{i}].symbol repeats another's (any case)")
        assets.append(Asset(symbol, token, decimals))
    return tuple(assets)


def _finality_tag(value: object, where: str) -> str | None:
    if value is None or value == "":
        return None
    if value not in FINALITY_TAGS:
        raise ChainsFileError(f"{where}.finality_tag must be one of {', '.join(FINALITY_TAGS)}")
    return str(value)


def _explorer(value: object, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("https://") or "{txHash}" not in value:
        raise ChainsFileError(f"{where}.explorer_tx_url must be an https:// URL with {{txHash}}")
    return value


def parse_chains(text: str) -> ChainRegistry:
    """Parse and check the TOML text of a chains file."""
    data = tomllib.loads(text)
    chains = []
    for i, raw in enumerate(data.get("chains", [])):
        where = f"chains[{i}]"
        try:
            status = str(raw["status"])
            if status not in (ACTIVE, DECLARED):
                raise ChainsFileError(f"{where}.status must be active or declared")
            floor = raw.get("min_deposit_usd")
            chain = Chain(
                chain_id=int(raw["chain_id"]),
                name=str(raw["name"]),
                status=status,
                native_symbol=str(raw["native_symbol"]),
                native_usd=_decimal(raw["native_usd"], f"{where}.native_usd"),
                gas_price_gwei=_decimal(raw["gas_price_gwei"], f"{where}.gas_price_gwei"),
                settlement_gas_units=int(raw["settlement_gas_units"]),
                confirmations=int(raw["confirmations"]),
                min_deposit_usd=None
                if floor is None
                else _decimal(floor, f"{where}.min_deposit_usd"),
                assets=_assets(raw.get("assets", []), where) if status == ACTIVE else (),
                finality_tag=_finality_tag(raw.get("finality_tag"), where),
                reorg_depth=int(raw.get("reorg_depth", 0)),
                payment_max_fee_gwei=None
                if raw.get("payment_max_fee_gwei") is None
                else _decimal(raw["payment_max_fee_gwei"], f"{where}.payment_max_fee_gwei"),
                explorer_tx_url=_explorer(raw.get("explorer_tx_url"), where),
            )
        except KeyError as missing:
            raise ChainsFileError(f"{where} lacks {missing}") from None
        if chain.confirmations < 1:
            raise ChainsFileError(f"{where}.confirmations must be at least 1")
        if chain.reorg_depth < 0:
            raise ChainsFileError(f"{where}.reorg_depth must not be negative")
        if chain.payment_max_fee_gwei is not None and chain.payment_max_fee_gwei <= 0:
            raise ChainsFileError(f"{where}.payment_max_fee_gwei must be positive")
        chains.append(chain)
    ids = [c.chain_id for c in chains]
    if len(set(ids)) != len(ids):
        raise ChainsFileError("a chain_id appears twice")
    venue = data.get("default_settlement_venue", {})
    registry = ChainRegistry(
        tuple(chains), int(venue.get("chain_id", 0)), str(venue.get("asset", ""))
    )
    venue_chain = registry.get(registry.default_venue_chain_id)
    if venue_chain is None or venue_chain.asset_by_symbol(registry.default_venue_asset) is None:
        raise ChainsFileError("default_settlement_venue must name an active chain and its asset")
    return registry


def load_chains(path: Path | None = None) -> ChainRegistry:
    return parse_chains((path or DEFAULT_CHAINS_FILE).read_text(encoding="utf-8"))
