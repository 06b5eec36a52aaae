"""The notifier's processes: `settle notifier api|consume|worker`, and `upgrade-queues`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from services.notifier.config import NotifierConfig
from services.notifier.metrics import BreakerCollector, DeadLetterCollector, DeliveryQueueCollector
from shared.heap import freeze_heap
from shared.metrics import CachedCollector, metrics_port, serve_metrics
from shared.serve import default_workers, serve
from shared.settings import SettingsError

log = logging.getLogger(__name__)

#: How long the dead-letter queues' depths are served again (each reading is a connection
#: to RabbitMQ).
DEAD_LETTERS_TTL_S = 15.0
#: How long a parent waits for its worker processes after SIGTERM before SIGKILL.
CHILD_STOP_S = 20.0


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %s: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def _engine_config() -> NotifierConfig:
    config = NotifierConfig.from_env()
    if not config.amqp_url:
        raise SettingsError(
            "this process needs SETTLE_AMQP_URL (`settle dev` runs the engine in-process)"
        )
    return config


def notifier_api(args: argparse.Namespace) -> int:
    serve(
        "services.notifier.wsgi:app",
        host=args.host,
        port=args.port,
        workers=args.workers or default_workers(),
        threads=args.threads,
    )
    return 0


def notifier_consume(args: argparse.Namespace) -> int:
    from services.notifier.delivery_engine import EngineSettings, build_engine, run_consume

    config = _engine_config()
    engine = build_engine(config, EngineSettings.from_env(config))
    ctx = engine.ctx
    registry = engine.metrics.registry
    registry.register(CachedCollector(DeliveryQueueCollector(ctx.db)))
    registry.register(
        CachedCollector(
            DeadLetterCollector(config.amqp_url or "", engine.settings.names),
            ttl_s=DEAD_LETTERS_TTL_S,
        )
    )
    serve_metrics(registry, metrics_port())
    stop = _stop_on_signals()
    freeze_heap()
    try:
        return run_consume(engine, stop)
    finally:
        ctx.db.dispose()


def notifier_worker(args: argparse.Namespace) -> int:
    if args.processes > 1:
        return _supervise_workers(args.processes, args.threads)
    from services.notifier.delivery_engine import EngineSettings, build_engine, run_worker

    config = _engine_config()
    threads = args.threads or config.worker_threads
    engine = build_engine(config, EngineSettings.from_env(config))
    ctx = engine.ctx
    engine.metrics.registry.register(BreakerCollector(engine.deliverer.breakers))
    serve_metrics(engine.metrics.registry, metrics_port())
    stop = _stop_on_signals()
    freeze_heap()
    try:
        run_worker(engine, stop, threads=threads)
    finally:
        ctx.db.dispose()
    return 0


def notifier_upgrade_queues(args: argparse.Namespace) -> int:
    """Replace the queues of an older deployment by quorum queues (docs/DEPLOY.md)."""
    import pika

    from services.notifier import queue_admin
    from shared.bus import BusNames, node_parameters

    config = _engine_config()
    # pika narrates every connection and each 404 of a queue not declared yet: the lines
    # below say what happened to each queue.
    logging.getLogger("pika").setLevel(logging.ERROR)
    connection = pika.BlockingConnection(node_parameters(config.amqp_url or ""))
    try:
        replaced = queue_admin.upgrade(
            connection, BusNames.from_env().prefix, say=lambda line: print(line, flush=True)
        )
    except queue_admin.UpgradeRefused as err:
        print(f"nothing changed: {err}", file=sys.stderr)
        return 1
    finally:
        if connection.is_open:
            connection.close()
    print(f"{len(replaced)} queues replaced; every queue is a quorum queue")
    return 0


def _supervise_workers(processes: int, threads: int | None) -> int:
    """N single-process workers; metrics ports SETTLE_METRICS_PORT + i. Any exit stops all."""
    stop = _stop_on_signals()
    children: list[subprocess.Popen[bytes]] = []
    for index in range(processes):
        env = dict(os.environ)
        port = metrics_port(offset=index)
        if port is not None:
            env["SETTLE_METRICS_PORT"] = str(port)
        argv = [sys.executable, "-m", "services.cli", "notifier", "worker", "--processes", "1"]
        if threads:
            argv += ["--threads", str(threads)]
        children.append(subprocess.Popen(argv, env=env))
    code = 0
    try:
        while not stop.is_set():
            if any(child.poll() is not None for child in children):
                log.error("a worker process exited; stopping the others")
                code = 1
                break
            stop.wait(0.5)
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CHILD_STOP_S
        for child in children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(5)
    return code
