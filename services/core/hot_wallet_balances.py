"""The hot wallet's balances on chain, for ops and their alerts.

- `settle_hot_wallet_balance{chain_id,asset}`: what the hot wallet holds, in token units,
  of each asset of the chains file and of the chain's native token (its gas; `asset` is
  the native symbol, e.g. ETH).
- `settle_hot_wallet_balance_minimum{chain_id,asset}`: the floor ops set in
  SETTLE_HOT_WALLET_MIN_BALANCE (`8453:USDC=5000,8453:ETH=0.05`); the alert fires below it.
- `settle_hot_wallet_balance_errors_total{chain_id}`: readings that failed.

Read by the core worker every `refresh_s` from each chain's node (one call per asset),
never at scrape time: a scrape must not wait for a node. A chain whose reading fails
shows no balance until the next good one (its series go missing rather than go stale).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from decimal import Decimal

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from web3 import Web3

from services.core.chains import Chain, ChainRegistry
from services.core.deposits.settings import BalanceMinimum

log = logging.getLogger(__name__)

#: Seconds between readings.
REFRESH_S = 60.0
#: The one ERC-20 function read here.
BALANCE_OF_ABI = [
    {
        "name": "balanceOf",
        "type": "function",
        "stateMutability": "view",
        "inputs": [{"name": "owner", "type": "address"}],
        "outputs": [{"name": "", "type": "uint256"}],
    }
]


class HotWalletBalances(Collector):
    """The latest balances read (see the module), served from memory."""

    def __init__(
        self,
        registry: ChainRegistry,
        nodes: Mapping[int, Web3],
        wallet: str,
        minimums: tuple[BalanceMinimum, ...] = (),
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self._chains = [chain for chain in registry.active() if chain.chain_id in nodes]
        self._nodes = nodes
        self._wallet = Web3.to_checksum_address(wallet)
        self._minimums = minimums
        self._lock = threading.Lock()
        self._balances: dict[tuple[int, str], Decimal] = {}
        self.errors = Counter(
            "settle_hot_wallet_balance_errors",
            "Readings of the hot wallet's balances that failed, per chain",
            ["chain_id"],
            registry=metrics,
        )

    def refresh(self) -> None:
        """Read every chain's balances now; a chain that fails keeps none."""
        for chain in self._chains:
            try:
                read = self.read(chain)
            except Exception as err:
                log.warning("hot wallet balances on chain %s: %s", chain.chain_id, err)
                self.errors.labels(str(chain.chain_id)).inc()
                read = {}
            with self._lock:
                for key in [key for key in self._balances if key[0] == chain.chain_id]:
                    del self._balances[key]
                self._balances.update(read)

    def read(self, chain: Chain) -> dict[tuple[int, str], Decimal]:
        """The wallet's balances on `chain` now: (chain id, asset) -> token units."""
        w3 = self._nodes[chain.chain_id]
        read = {
            (chain.chain_id, chain.native_symbol): Decimal(w3.eth.get_balance(self._wallet))
            / Decimal(10**18)
        }
        for asset in chain.assets:
            token = w3.eth.contract(
                address=Web3.to_checksum_address(asset.token_address), abi=BALANCE_OF_ABI
            )
            raw = token.functions.balanceOf(self._wallet).call()
            read[(chain.chain_id, asset.symbol)] = Decimal(raw) / Decimal(10**asset.decimals)
        return read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        balance = GaugeMetricFamily(
            "settle_hot_wallet_balance",
            "What the hot wallet holds on chain, in token units (asset: token symbol, or "
            "the chain's native symbol for gas)",
            labels=["chain_id", "asset"],
        )
        with self._lock:
            for (chain_id, asset), amount in sorted(self._balances.items()):
                balance.add_metric([str(chain_id), asset], float(amount))
        yield balance
        minimum = GaugeMetricFamily(
            "settle_hot_wallet_balance_minimum",
            "The hot wallet balance below which ops want an alert (SETTLE_HOT_WALLET_MIN_BALANCE)",
            labels=["chain_id", "asset"],
        )
        for floor in self._minimums:
            minimum.add_metric([str(floor.chain_id), floor.asset], float(floor.amount))
        yield minimum

    def run(self, stop: threading.Event, refresh_s: float = REFRESH_S) -> None:
        """Read every `refresh_s` until `stop`."""
        while not stop.is_set():
            self.refresh()
            stop.wait(refresh_s)


def hot_wallet_balances(
    registry: ChainRegistry,
    rpc_urls: Mapping[int, str],
    hot_wallet_key: str | None,
    minimums: tuple[BalanceMinimum, ...],
    metrics: CollectorRegistry,
    timeout_s: float,
) -> HotWalletBalances | None:
    """The readings for a worker with a hot wallet key and at least one chain's node."""
    from eth_account import Account

    from services.core.evm import connect

    nodes = {
        chain.chain_id: connect(rpc_urls[chain.chain_id], timeout_s)
        for chain in registry.active()
        if chain.chain_id in rpc_urls
    }
    if not hot_wallet_key or not nodes:
        return None
    wallet = Account.from_key(hot_wallet_key).address
    balances = HotWalletBalances(registry, nodes, wallet, minimums, metrics)
    metrics.register(balances)
    return balances
