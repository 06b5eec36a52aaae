"""The delivery engine assembled: settings, broker, actors, and how each process runs it.

Processes (see DESIGN.md):
- `settle notifier consume`: `run_consume` (bus consumer + sweeper threads);
- `settle notifier worker`: `run_worker` (Dramatiq worker threads);
- `settle notifier api`: `wire_enqueue(ctx)` so test, replay and recover deliveries
  are handed to the workers at once;
- `settle dev`: `start_embedded(ctx)`, everything in-process (StubBroker, in-process
  bus, worker threads, sweeper).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import dramatiq

from services.notifier.actors import Deliverer, DeliveryActors, DeliveryTuning
from services.notifier.broker import build_broker
from services.notifier.config import NotifierConfig
from services.notifier.context import NotifierContext
from services.notifier.metrics import NotifierMetrics
from services.notifier.sender import Sender
from shared.bus import BusNames, InProcessBus
from shared.settings import environ

log = logging.getLogger(__name__)

#: How long stopping waits for attempts in flight before giving up (they are re-sent).
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class EngineSettings:
    """Engine knobs: the values come from NotifierConfig, the bus names from the environment."""

    names: BusNames = field(default_factory=BusNames)
    #: Sweeper: how often, how overdue a delivery must be, how many per round.
    sweep_interval_s: float = 5.0
    sweep_grace_s: float = 30.0
    sweep_batch: int = 500
    #: Unacked domain events the consumer may hold.
    prefetch: int = 64
    tuning: DeliveryTuning = field(default_factory=DeliveryTuning)

    @classmethod
    def from_env(
        cls, config: NotifierConfig, env: Mapping[str, str] | None = None
    ) -> EngineSettings:
        """Settings for `config`; only the bus names are read from `env`.

        Every knob is read and validated once, by NotifierConfig.from_env, so a process
        and its config never disagree about them.
        """
        env = environ() if env is None else env
        return cls(
            names=BusNames.from_env(env),
            sweep_interval_s=config.sweep_interval_s,
            sweep_grace_s=config.sweep_grace_s,
            sweep_batch=config.sweep_batch,
            prefetch=config.prefetch,
            tuning=DeliveryTuning(lease_margin_s=config.lease_margin_s),
        )


@dataclass
class Engine:
    """What one notifier process needs to consume, enqueue and deliver."""

    ctx: NotifierContext
    settings: EngineSettings
    broker: dramatiq.Broker
    actors: DeliveryActors
    deliverer: Deliverer
    metrics: NotifierMetrics

    def enqueue(self, delivery_ids: list[str]) -> None:
        self.actors.enqueue(delivery_ids)


def build_engine(
    ctx: NotifierContext,
    settings: EngineSettings | None = None,
    *,
    broker: dramatiq.Broker | None = None,
    metrics: NotifierMetrics | None = None,
) -> Engine:
    """Broker, sender and actors for `ctx`; sets `ctx.enqueue` so every path hands off here."""
    settings = settings or EngineSettings()
    broker = broker or build_broker(ctx.config)
    metrics = metrics or NotifierMetrics()
    sender = Sender(
        timeout_s=ctx.config.webhook_timeout_s,
        allow_private=ctx.config.allow_private,
        pool_per_host=max(4, ctx.config.per_endpoint_concurrency),
    )
    deliverer = Deliverer(ctx, sender, metrics, tuning=settings.tuning)
    actors = DeliveryActors(broker, deliverer, settings.names)
    ctx.enqueue = actors.enqueue
    return Engine(ctx, settings, broker, actors, deliverer, metrics)


def wire_enqueue(ctx: NotifierContext, env: Mapping[str, str] | None = None) -> Engine | None:
    """For the notifier API process: hand new deliveries to the workers through RabbitMQ.

    Without SETTLE_AMQP_URL this does nothing (the embedded mode wires its own).
    """
    if not ctx.config.amqp_url:
        return None
    return build_engine(ctx, EngineSettings.from_env(ctx.config, env))


def start_worker(engine: Engine, *, threads: int) -> dramatiq.Worker:
    """Dramatiq worker threads on the two delivery queues of this engine."""
    # What the dramatiq CLI does in each worker process (starts TimeLimit's watchdog).
    engine.broker.emit_after("process_boot")
    worker = dramatiq.Worker(
        engine.broker,
        worker_threads=threads,
        queues={engine.actors.queue, engine.actors.retry_queue},
        worker_timeout=250,
    )
    worker.start()
    return worker


def run_worker(engine: Engine, stop: threading.Event, *, threads: int) -> None:
    """Deliver until `stop`; attempts in flight get STOP_TIMEOUT_S to finish."""
    worker = start_worker(engine, threads=threads)
    log.info("notifier worker ready: %d threads on %s", threads, engine.actors.queue)
    try:
        stop.wait()
    finally:
        worker.stop(timeout=int(STOP_TIMEOUT_S * 1000))
        engine.broker.close()


def run_consume(engine: Engine, stop: threading.Event) -> int:
    """The consumer and the sweeper until `stop`; 1 if either died."""
    from services.notifier.consumer import run_consumer
    from services.notifier.sweeper import run_sweeper

    if not engine.ctx.config.amqp_url:
        raise ValueError("settle notifier consume needs SETTLE_AMQP_URL")
    failed = threading.Event()

    def guarded(target: object, name: str) -> threading.Thread:
        def run() -> None:
            try:
                target(engine, stop)  # type: ignore[operator]
            except Exception:
                log.exception("%s died; stopping", name)
                failed.set()
                stop.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    threads = [guarded(run_consumer, "event-consumer"), guarded(run_sweeper, "sweeper")]
    stop.wait()
    for thread in threads:
        thread.join(STOP_TIMEOUT_S)
    engine.broker.close()
    return 1 if failed.is_set() else 0


@dataclass
class EmbeddedEngine:
    """The whole engine inside one process (`settle dev`): call `stop()` on the way out."""

    engine: Engine
    bus: InProcessBus
    worker: dramatiq.Worker
    stop_event: threading.Event
    sweeper: threading.Thread

    def stop(self) -> None:
        self.stop_event.set()
        self.worker.stop(timeout=int(STOP_TIMEOUT_S * 1000))
        self.sweeper.join(STOP_TIMEOUT_S)


def start_embedded(
    ctx: NotifierContext, settings: EngineSettings | None = None, *, threads: int | None = None
) -> EmbeddedEngine:
    """StubBroker, worker threads, sweeper, and an in-process bus for core's relay.

    Core side (services/dev.py): `run_relay(core_db, lambda: embedded.bus, stop, wake=wake)`
    with `install_commit_wakeup(core_db, wake)`.
    """
    from services.notifier.consumer import inprocess_handler
    from services.notifier.sweeper import run_sweeper

    settings = settings or EngineSettings.from_env(ctx.config)
    engine = build_engine(ctx, settings, broker=build_broker(_without_amqp(ctx.config)))
    worker = start_worker(engine, threads=threads or ctx.config.worker_threads)
    stop = threading.Event()
    sweeper = threading.Thread(target=run_sweeper, args=(engine, stop), name="sweeper", daemon=True)
    sweeper.start()
    return EmbeddedEngine(engine, InProcessBus(inprocess_handler(ctx)), worker, stop, sweeper)


def _without_amqp(config: NotifierConfig) -> NotifierConfig:
    from dataclasses import replace

    return replace(config, amqp_url=None)
