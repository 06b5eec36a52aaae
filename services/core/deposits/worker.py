"""The deposit pipeline's loops, as `settle core worker` runs them.

One thread per watched chain (a chain with a node: `SETTLE_RPC_URL_<chainId>`), and
one settlement loop: sandbox confirmations, settling confirmed deposits, polling
in-flight credits, recovering interrupted ones, provider health checks.

Safe to run in several processes at once: watchers advance their cursor with a
compare-and-set under a row lock, and every deposit step locks its row
(`FOR UPDATE SKIP LOCKED`: a deposit another worker holds is skipped this round).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Gauge

from services.core.chains import ChainRegistry
from services.core.context import CoreContext
from services.core.deposits.chain_check import ChainCheck
from services.core.deposits.detection import Detection
from services.core.deposits.pricing import PriceFeed, build_prices
from services.core.deposits.sandbox import SandboxChain, SandboxConfirmer
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import (
    EvmPayer,
    Payer,
    RouteProvider,
    Settlement,
    SimulatedBridge,
    SimulatedPayer,
)
from services.core.deposits.settling import Settling
from services.core.deposits.watcher import ChainWatcher
from services.core.evm import Web3ChainReader
from services.core.hot_wallet import Erc20TransferExecutor
from services.core.outbox_wakeup import OutboxListener

log = logging.getLogger(__name__)

#: Longest pause after a failed round (a node or database outage), seconds.
MAX_BACKOFF_S = 30.0
#: Longest sleep of an idle settlement loop. Every deposit that needs it is woken
#: sooner: a commit of core's (a deposit seen or confirmed emits an event) NOTIFYs the
#: loop at once, and a retry, a poll or a recovery is due at a time the loop reads
#: before it sleeps. This only bounds the wait for a NOTIFY that was lost.
IDLE_POLL_S = 10.0


@dataclass
class Pipeline:
    """Everything the worker drives, built once per process."""

    settling: Settling
    sandbox: SandboxConfirmer
    watchers: list[ChainWatcher] = field(default_factory=list)
    settings: PipelineSettings = field(default_factory=PipelineSettings)
    #: A URL price source, fetched between rounds (None: the fixed table).
    price_feed: PriceFeed | None = None
    _health_due: float = 0.0
    _prices_due: float = 0.0

    def settle_round(self) -> int:
        """One settlement round; how many steps did something (0: idle)."""
        settling, batch = self.settling, self.settings.batch_size
        queue = settling.store
        work = self.sandbox.tick()
        for deposit_id in queue.interrupted(settling.stuck_cutoff(), batch):
            work += settling.recover(deposit_id) is not None
        for deposit_id in queue.due_for_settlement(settling.clock(), batch):
            work += settling.settle(deposit_id) is not None
        for deposit_id in queue.due_for_poll(settling.clock(), batch):
            status = settling.poll(deposit_id)
            work += status is not None and status != "credit_submitted"
        if self.price_feed is not None and time.monotonic() >= self._prices_due:
            # Outside any transaction; a failed fetch keeps the last prices until they
            # are too old (then deposits wait in review as `no_price`).
            self.price_feed.refresh()
            self._prices_due = time.monotonic() + self.settings.price_refresh_s
        if time.monotonic() >= self._health_due and settling.settlement.providers:
            settling.settlement.check_health(settling.db, settling.clock())
            self._health_due = time.monotonic() + self.settings.health_check_s
        return work

    def idle_wait(self, idle_s: float) -> float:
        """Seconds the settlement loop may sleep after a round with nothing to do: until the
        earliest retry, poll or recovery falls due, the next simulated block while sandbox
        deposits wait, or the next price refresh or health check; IDLE_POLL_S at most,
        `idle_s` at least (something due now that a round could not take, because another
        worker holds it, waits that long, as before)."""
        due, mark, sandbox_waiting = self.settling.store.next_work()
        now = self.settling.clock()
        waits = [IDLE_POLL_S]
        if due is not None:
            waits.append((due - now).total_seconds())
        if mark is not None:
            stuck = mark + timedelta(seconds=self.settings.stuck_payment_s)
            waits.append((stuck - now).total_seconds())
        if sandbox_waiting:
            waits.append(self.sandbox.chain.block_s)
        monotonic = time.monotonic()
        if self.price_feed is not None:
            waits.append(self._prices_due - monotonic)
        if self.settling.settlement.providers:
            waits.append(self._health_due - monotonic)
        return max(idle_s, min(waits))


def build_payers(
    registry: ChainRegistry,
    rpc_urls: Mapping[int, str],
    settings: PipelineSettings,
    checks: Mapping[int, ChainCheck] | None = None,
) -> dict[int, Payer | EvmPayer]:
    """Each active chain's payer: the hot wallet where a node and the key are set, else
    the simulated payer when simulated settlement is on (the worker and the ops CLI).
    `checks`: the chains' nodes against the chains file (the worker's), which a hot
    wallet waits for before it pays."""
    payers: dict[int, Payer | EvmPayer] = {}
    for chain in registry.active():
        url = rpc_urls.get(chain.chain_id)
        if url and settings.hot_wallet_key:
            executor = Erc20TransferExecutor.from_url(
                url, settings.hot_wallet_key, settings.rpc_timeout_s, chain_id=chain.chain_id
            )
            payers[chain.chain_id] = EvmPayer(
                executor,
                check=(checks or {}).get(chain.chain_id),
                name=f"hot-wallet-{chain.chain_id}",
            )
        elif settings.simulated_settlement:
            payers[chain.chain_id] = SimulatedPayer()
    return payers


def build_pipeline(ctx: CoreContext, settings: PipelineSettings | None = None) -> Pipeline:
    """Readers, payers and providers from the configuration."""
    settings = settings or ctx.config.deposits
    registry = ctx.registry
    rpc_urls = ctx.config.rpc_urls
    # Each watched chain's node against the chains file (chain id, tokens' decimals),
    # shared by its watcher and its hot wallet: nothing is read or paid there before it
    # passes. Asked now, at start, and again each round until it passes.
    checks = {
        chain.chain_id: ChainCheck(
            ctx.db,
            chain,
            Web3ChainReader.from_url(
                rpc_urls[chain.chain_id], settings.rpc_timeout_s, chain.chain_id
            ),
        )
        for chain in registry.active()
        if rpc_urls.get(chain.chain_id)
    }
    for check in checks.values():
        check.ready()
    payers = build_payers(registry, rpc_urls, settings, checks)
    providers: list[RouteProvider] = []
    if settings.simulated_settlement:
        providers.append(SimulatedBridge(delay_s=settings.simulated_bridge_s))
    settlement = Settlement(
        registry,
        payers=payers,
        providers=providers,
        provider_max_failures=settings.provider_max_failures,
    )
    prices = build_prices(settings)
    if isinstance(prices, PriceFeed):
        prices.refresh()
    settling = Settling(ctx.db, registry, settlement, prices, settings)
    detection = Detection(ctx.db, registry, prices)
    settlement.seed_inventory(ctx.db, settings.inventory, settling.clock())
    watchers = []
    for chain in registry.active():
        url = rpc_urls.get(chain.chain_id)
        if not url:
            continue
        reader = Web3ChainReader.from_url(
            url,
            settings.rpc_timeout_s,
            chain.chain_id,
            max_block_span=settings.watcher_max_range,
        )
        watchers.append(
            ChainWatcher(
                detection,
                chain,
                reader,
                lag_blocks=settings.watcher_lag_blocks,
                max_range=settings.watcher_max_range,
                stray_tokens=settings.watcher_stray_tokens,
                check=checks[chain.chain_id],
            )
        )
    sandbox = SandboxConfirmer(
        detection, SandboxChain(settings.sandbox_block_s), batch_size=settings.batch_size
    )
    return Pipeline(
        settling=settling,
        sandbox=sandbox,
        watchers=watchers,
        settings=settings,
        price_feed=prices if isinstance(prices, PriceFeed) else None,
        _prices_due=time.monotonic() + settings.price_refresh_s,
    )


class PipelineMetrics:
    """What the pipeline's loops count (the core worker's metrics port)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.watcher_errors = Counter(
            "settle_watcher_errors",
            "Chain watcher rounds that failed (the node or the database did not answer)",
            ["chain_id"],
            registry=registry,
        )
        self.watcher_success = Gauge(
            "settle_watcher_last_success_timestamp_seconds",
            "When each chain watcher last finished a round (Unix time)",
            ["chain_id"],
            registry=registry,
        )
        self.settlement_errors = Counter(
            "settle_settlement_errors",
            "Settlement rounds that failed (a node, a provider or the database)",
            registry=registry,
        )


def loop(
    name: str,
    step: Callable[[], bool],
    idle_s: float,
    stop: threading.Event,
    *,
    idle: Callable[[], object] | None = None,
    succeeded: Callable[[], object] | None = None,
    failed: Callable[[], object] | None = None,
) -> None:
    """Run `step` until `stop`; when it had nothing to do, call `idle` (default: wait
    `idle_s`); back off on errors. `succeeded` and `failed` are told of each round."""
    failures = 0
    while not stop.is_set():
        try:
            busy = step()
            failures = 0
            if succeeded is not None:
                succeeded()
        except Exception:
            if failed is not None:
                failed()
            failures += 1
            log.exception("%s: round failed (%s in a row)", name, failures)
            stop.wait(min(MAX_BACKOFF_S, idle_s * 2**failures))
            continue
        if not busy:
            if idle is None:
                stop.wait(idle_s)
            else:
                idle()


def settle_loop(
    pipeline: Pipeline, stop: threading.Event, metrics: PipelineMetrics | None = None
) -> None:
    """Settlement rounds until `stop`; between idle rounds, asleep on core's outbox
    channel (LISTEN) until a commit, the next due time (`Pipeline.idle_wait`) or stop."""
    settings = pipeline.settings
    idle_s = settings.poll_s
    if settings.sandbox_block_s > 0:
        idle_s = min(idle_s, settings.sandbox_block_s)
    listener = OutboxListener(pipeline.settling.db)

    def idle() -> None:
        try:
            wait_s = pipeline.idle_wait(idle_s)
        except sa.exc.DBAPIError:
            log.warning("settlement: could not read what is due; looking again in %ss", idle_s)
            wait_s = idle_s
        listener.sleep(stop, wait_s)

    try:
        loop(
            "settlement",
            lambda: pipeline.settle_round() > 0,
            idle_s,
            stop,
            idle=idle,
            failed=None if metrics is None else metrics.settlement_errors.inc,
        )
    finally:
        listener.close()


def run_pipeline(
    ctx: CoreContext, stop: threading.Event, metrics: PipelineMetrics | None = None
) -> None:
    """Run the watchers and the settlement loop until `stop` is set."""
    pipeline = build_pipeline(ctx)
    run(pipeline, stop, metrics)


def run(pipeline: Pipeline, stop: threading.Event, metrics: PipelineMetrics | None = None) -> None:
    """Run a built pipeline's loops in threads until `stop`."""
    settings = pipeline.settings
    threads = []
    for watcher in pipeline.watchers:
        counted: dict[str, Any] = {}
        if metrics is not None:
            chain = str(watcher.chain_id)
            counted = {
                "succeeded": metrics.watcher_success.labels(chain).set_to_current_time,
                "failed": metrics.watcher_errors.labels(chain).inc,
            }
        threads.append(
            threading.Thread(
                target=loop,
                args=(
                    f"watcher-{watcher.chain_id}",
                    lambda w=watcher: not w.tick().caught_up,
                    settings.watcher_poll_s,
                    stop,
                ),
                kwargs=counted,
                name=f"watcher-{watcher.chain_id}",
                daemon=True,
            )
        )
    threads.append(
        threading.Thread(
            target=settle_loop,
            args=(pipeline, stop, metrics),
            name="deposit-settlement",
            daemon=True,
        )
    )
    for thread in threads:
        thread.start()
    log.info("deposit pipeline: %s", ", ".join(t.name for t in threads))
    stop.wait()
    for thread in threads:
        thread.join(timeout=10)
