"""The delivery engine's composition root: every part built once, in order, and wired here.

Nothing of the engine imports this module, and nothing is patched after it is built:
each part gets its collaborators in its constructor. The order breaks the one cycle
(the API and the actors send jobs; the actors run them): broker -> DeliveryQueues
(sends jobs) -> NotifierContext (hands new deliveries to the queues) -> Deliverer
(schedules retries on the queues) -> DeliveryActors (run the Deliverer).

Processes (see DESIGN.md):
- `settle notifier consume`: `run_consume` (event consumer + sweeper threads);
- `settle notifier worker`: `run_worker` (Dramatiq worker threads);
- `settle notifier api`: `api_context(config)`, so test, replay and recover
  deliveries are handed to the workers at once;
- `settle dev`: `start_embedded(config)`, everything in-process (StubBroker,
  in-process bus, worker threads, sweeper);
- Dramatiq's own CLI: `dramatiq services.notifier.delivery_engine:setup_from_env`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import dramatiq

from services.notifier.actors import Deliverer, DeliveryActors
from services.notifier.breaker import CircuitBreakers
from services.notifier.broker import DeliveryQueues, build_broker
from services.notifier.config import NotifierConfig
from services.notifier.consumer import EventConsumer, inprocess_handler
from services.notifier.context import NotifierContext
from services.notifier.delivery_store import DeliveryStore
from services.notifier.dramatiq_worker import QuietWorker
from services.notifier.limiter import EndpointLimiter, share_of
from services.notifier.metrics import NotifierMetrics
from services.notifier.retention import partitioned_tables
from services.notifier.retry_policy import DeliveryTuning
from services.notifier.secret_cache import SecretCache
from services.notifier.sender import Sender
from services.notifier.sweeper import Sweeper
from shared.bus import BusNames, InProcessBus
from shared.db import Database
from shared.partitions import Maintainer
from shared.settings import environ

log = logging.getLogger(__name__)

#: How long stopping waits for attempts in flight before giving up (they are re-sent).
STOP_TIMEOUT_S = 15.0
#: Shortest interval between two rounds of keeping a worker's waiting deliveries due.
KEEP_MIN_INTERVAL_S = 0.25


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
class DeliveryEngine:
    """What one notifier process needs to consume, enqueue and deliver."""

    ctx: NotifierContext
    settings: EngineSettings
    broker: dramatiq.Broker
    queues: DeliveryQueues
    actors: DeliveryActors
    deliverer: Deliverer
    metrics: NotifierMetrics

    def enqueue(self, delivery_ids: list[str]) -> None:
        self.queues.enqueue(delivery_ids)

    def consumer(self) -> EventConsumer:
        return EventConsumer(
            self.ctx, self.metrics, self.settings.names, prefetch=self.settings.prefetch
        )

    def sweeper(self) -> Sweeper:
        settings = self.settings
        return Sweeper(
            self.ctx.db,
            self.queues.enqueue,
            self.metrics,
            interval_s=settings.sweep_interval_s,
            grace_s=settings.sweep_grace_s,
            batch=settings.sweep_batch,
        )


def maintainer(config: NotifierConfig, db: Database) -> Maintainer:
    """The partition maintenance step (made ahead, old ones dropped), hourly by default."""
    return Maintainer(db.engine, partitioned_tables(config.retention), config.partitions)


def build_engine(
    config: NotifierConfig,
    settings: EngineSettings | None = None,
    *,
    db: Database | None = None,
    identity_db: Database | None = None,
    broker: dramatiq.Broker | None = None,
    metrics: NotifierMetrics | None = None,
) -> DeliveryEngine:
    """Every part of the engine for `config`, its context handing deliveries to its queues."""
    settings = settings or EngineSettings()
    broker = broker or build_broker(config)
    metrics = metrics or NotifierMetrics()
    queues = DeliveryQueues(broker, settings.names)
    ctx = NotifierContext.build(config, db=db, identity_db=identity_db, enqueue=queues.enqueue)
    sender = Sender(
        timeout_s=config.webhook_timeout_s,
        allow_private=config.allow_private,
        pool_per_host=max(4, config.per_endpoint_concurrency),
    )
    deliverer = Deliverer(
        config,
        DeliveryStore(ctx.db),
        sender,
        SecretCache(ctx.secret_box),
        queues,
        metrics,
        limiter=EndpointLimiter(
            config.per_endpoint_concurrency,
            share_of(config.worker_threads, config.tenant_share),
            threads=config.worker_threads,
            alone_after_s=config.webhook_timeout_s,
        ),
        breakers=CircuitBreakers(
            threshold=config.breaker_threshold,
            cooldown_s=config.breaker_cooldown_s,
            max_cooldown_s=config.breaker_max_cooldown_s,
        ),
        tuning=settings.tuning,
        identity=ctx.identity_db,
    )
    actors = DeliveryActors(queues, deliverer)
    return DeliveryEngine(ctx, settings, broker, queues, actors, deliverer, metrics)


def api_context(config: NotifierConfig, env: Mapping[str, str] | None = None) -> NotifierContext:
    """For the notifier API process: new deliveries go to the workers through RabbitMQ.

    Without SETTLE_AMQP_URL they wait for the sweeper (the embedded mode wires its own).
    """
    if not config.amqp_url:
        return NotifierContext.build(config)
    queues = DeliveryQueues(
        build_broker(config), BusNames.from_env(environ() if env is None else env)
    )
    return NotifierContext.build(config, enqueue=queues.enqueue)


def setup_from_env() -> dramatiq.Broker:
    """For the `dramatiq` CLI: engine from the environment, actors declared, broker global."""
    config = NotifierConfig.from_env()
    engine = build_engine(config, EngineSettings.from_env(config))
    dramatiq.set_broker(engine.broker)
    return engine.broker


def keep_interval_s(settings: EngineSettings) -> float:
    """How often a worker keeps its waiting deliveries due: well within the sweeper's grace."""
    return max(KEEP_MIN_INTERVAL_S, settings.sweep_grace_s / 3)


def start_worker(engine: DeliveryEngine, *, threads: int, stop: threading.Event) -> dramatiq.Worker:
    """Dramatiq worker threads on the two delivery queues of this engine, and the thread
    that keeps its waiting deliveries due (see Deliverer.keep_waiting) until `stop`."""
    # What the dramatiq CLI does in each worker process (starts TimeLimit's watchdog).
    engine.broker.emit_after("process_boot")
    worker = QuietWorker(
        engine.broker,
        worker_threads=threads,
        queues={engine.queues.queue, engine.queues.retry_queue},
        worker_timeout=250,
    )
    worker.start()
    if engine.settings.sweep_grace_s < 3 * KEEP_MIN_INTERVAL_S:
        # Rounds this close to the grace could not keep rows ahead of the sweeper: it
        # re-sends waiting deliveries, as it would without a keeper (harmless repeats).
        log.info(
            "sweep grace under %.2f s: waiting deliveries are not kept due", 3 * KEEP_MIN_INTERVAL_S
        )
        return worker
    threading.Thread(
        target=engine.deliverer.run_keeper,
        args=(stop, keep_interval_s(engine.settings)),
        name="waiting-keeper",
        daemon=True,
    ).start()
    return worker


def run_worker(engine: DeliveryEngine, stop: threading.Event, *, threads: int) -> None:
    """Deliver until `stop`; attempts in flight get STOP_TIMEOUT_S to finish."""
    worker = start_worker(engine, threads=threads, stop=stop)
    log.info("notifier worker ready: %d threads on %s", threads, engine.queues.queue)
    try:
        stop.wait()
    finally:
        worker.stop(timeout=int(STOP_TIMEOUT_S * 1000))
        engine.broker.close()


def run_consume(engine: DeliveryEngine, stop: threading.Event) -> int:
    """The consumer and the sweeper until `stop`; 1 if either died."""
    if not engine.ctx.config.amqp_url:
        raise ValueError("settle notifier consume needs SETTLE_AMQP_URL")
    failed = threading.Event()
    consumer, sweeper = engine.consumer(), engine.sweeper()

    def guarded(run: object, name: str) -> threading.Thread:
        def target() -> None:
            try:
                run(stop)  # type: ignore[operator]
            except Exception:
                log.exception("%s died; stopping", name)
                failed.set()
                stop.set()

        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    maintenance = maintainer(engine.ctx.config, engine.ctx.db)
    threads = [
        guarded(consumer.run, "event-consumer"),
        guarded(sweeper.run, "sweeper"),
        # Errors inside a round are logged and retried next round (never fatal).
        guarded(maintenance.run, "partitions"),
    ]
    stop.wait()
    for thread in threads:
        thread.join(STOP_TIMEOUT_S)
    engine.broker.close()
    return 1 if failed.is_set() else 0


@dataclass
class EmbeddedEngine:
    """The whole engine inside one process (`settle dev`): call `stop()` on the way out."""

    engine: DeliveryEngine
    bus: InProcessBus
    worker: dramatiq.Worker
    stop_event: threading.Event
    sweeper: threading.Thread
    maintenance: threading.Thread | None = None

    @property
    def ctx(self) -> NotifierContext:
        return self.engine.ctx

    def stop(self) -> None:
        self.stop_event.set()
        self.worker.stop(timeout=int(STOP_TIMEOUT_S * 1000))
        self.sweeper.join(STOP_TIMEOUT_S)
        if self.maintenance is not None:
            self.maintenance.join(STOP_TIMEOUT_S)


def start_embedded(
    config: NotifierConfig,
    settings: EngineSettings | None = None,
    *,
    db: Database | None = None,
    identity_db: Database | None = None,
    threads: int | None = None,
) -> EmbeddedEngine:
    """StubBroker, worker threads, sweeper, and an in-process bus for core's relay.

    Core side (services/dev.py): `start_relay_thread(core_db, lambda: embedded.bus, stop)`
    (woken by LISTEN/NOTIFY as in production); the notifier's API serves `embedded.ctx`.
    """
    settings = settings or EngineSettings.from_env(config)
    config = replace(config, amqp_url=None)  # the in-memory StubBroker
    engine = build_engine(config, settings, db=db, identity_db=identity_db)
    stop = threading.Event()
    worker = start_worker(engine, threads=threads or config.worker_threads, stop=stop)
    sweeper = threading.Thread(
        target=engine.sweeper().run, args=(stop,), name="sweeper", daemon=True
    )
    sweeper.start()
    maintenance = threading.Thread(
        target=maintainer(config, engine.ctx.db).run, args=(stop,), name="partitions", daemon=True
    )
    maintenance.start()
    bus = InProcessBus(inprocess_handler(engine.ctx))
    return EmbeddedEngine(engine, bus, worker, stop, sweeper, maintenance)
