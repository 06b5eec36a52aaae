"""`settle core worker`: the outbox relay, the fee oracle, the deposit pipeline, the
deposit address backfill and the outbox's partition maintenance.

Each runs in its own thread until SIGTERM/SIGINT. If one of them dies the process
exits non-zero, so the supervisor (compose, systemd) restarts it whole: nothing is
lost, because every step's state is in the database.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.core.config import CoreConfig
from services.core.context import CoreContext
from shared.heap import freeze_heap
from shared.settings import SettingsError

if TYPE_CHECKING:
    from shared.db import Database
    from shared.partitions import Maintainer

log = logging.getLogger(__name__)

#: How long stopping threads get before the process exits anyway.
STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class Task:
    name: str
    run: Callable[[threading.Event], None]


def core_tasks(ctx: CoreContext) -> list[Task]:
    """The loops of a core worker process, built from the context."""
    from prometheus_client import CollectorRegistry

    from services.core.backfill import run_address_backfill
    from services.core.deposits.metrics import ChainCollector, DepositCollector
    from services.core.deposits.worker import PipelineMetrics, run_pipeline
    from services.core.fee_oracle import run_fee_oracle
    from services.core.hot_wallet_balances import hot_wallet_balances
    from services.core.relay import (
        OutboxCollector,
        RelayMetrics,
        relay_publisher_factory,
        run_relay,
    )
    from shared.metrics import CachedCollector, metrics_port, serve_metrics

    if not ctx.config.amqp_url:
        raise SettingsError("settle core worker needs SETTLE_AMQP_URL (settle dev embeds a broker)")
    publisher_factory = relay_publisher_factory(ctx.config)
    registry = CollectorRegistry(auto_describe=True)
    for collector in (OutboxCollector(ctx.db), ChainCollector(ctx.db), DepositCollector(ctx.db)):
        registry.register(CachedCollector(collector))
    relay_metrics = RelayMetrics(registry)
    pipeline_metrics = PipelineMetrics(registry)
    settings = ctx.config.deposits
    balances = hot_wallet_balances(
        ctx.registry,
        ctx.config.rpc_urls,
        settings.hot_wallet_key,
        settings.hot_wallet_minimums,
        registry,
        settings.rpc_timeout_s,
    )
    serve_metrics(registry, metrics_port())  # SETTLE_METRICS_PORT; nothing when unset
    tasks = [
        Task("fee-oracle", lambda stop: run_fee_oracle(ctx, stop)),
        Task(
            "outbox-relay",
            lambda stop: run_relay(ctx.db, publisher_factory, stop, metrics=relay_metrics),
        ),
        Task("deposit-pipeline", lambda stop: run_pipeline(ctx, stop, pipeline_metrics)),
        Task("address-backfill", lambda stop: run_address_backfill(ctx, stop)),
    ]
    if balances is not None:
        tasks.append(Task("hot-wallet-balances", balances.run))
    tasks.append(Task("partitions", outbox_maintainer(ctx.config, ctx.db).run))
    return tasks


def outbox_maintainer(config: CoreConfig, db: Database) -> Maintainer:
    """The outbox's partition maintenance step (made ahead, old ones dropped), hourly by
    default; its errors are logged and retried next round, never fatal."""
    from services.core.retention import partitioned_tables
    from shared.partitions import Maintainer

    return Maintainer(db.engine, partitioned_tables(config.retention), config.partitions)


def supervise(tasks: list[Task], stop: threading.Event) -> int:
    """Run tasks in threads until `stop`; if any dies, stop the rest and return 1."""
    failed = threading.Event()

    def guarded(task: Task) -> None:
        try:
            task.run(stop)
        except Exception:
            log.exception("%s died; stopping the worker", task.name)
            failed.set()
            stop.set()

    threads = [threading.Thread(target=guarded, args=(t,), name=t.name, daemon=True) for t in tasks]
    for thread in threads:
        thread.start()
    log.info("started %s", ", ".join(t.name for t in tasks))
    stop.wait()
    for thread in threads:
        thread.join(STOP_GRACE_S / max(1, len(threads)))
    return 1 if failed.is_set() else 0


def run_worker(config: CoreConfig) -> int:
    ctx = CoreContext.build(config)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %s: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tasks = core_tasks(ctx)
    freeze_heap()
    try:
        return supervise(tasks, stop)
    finally:
        ctx.db.dispose()
