"""The event pipeline in-process for integration tests, on the real PostgreSQL and RabbitMQ.

    with running_pipeline(pg_url, retry_schedule=(0.2, 0.5, 1.0)) as p:
        endpoint_id, secret = p.endpoint(tenant_id, rx.url("/hook"), ["deposit.credited"])
        envelope = p.emit(tenant_id, "deposit.credited", {"deposit": {...}})
        p.wait_status(envelope["id"], "succeeded")

Runs the outbox relay (RabbitPublisher), the notifier consumer, Dramatiq worker
threads (RabbitMQ broker) and the sweeper as threads of the test process. Every
exchange and queue carries a prefix unique to the pipeline, deleted afterwards,
so tests never see each other's messages nor a dev run's.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pika
import pika.exceptions
import sqlalchemy as sa

from services.core import outbox
from services.core.relay import start_relay_thread
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.config import NotifierConfig
from services.notifier.context import NotifierContext
from services.notifier.delivery_engine import (
    DeliveryEngine,
    EngineSettings,
    build_engine,
    start_worker,
)
from services.notifier.models import Attempt, Delivery, Endpoint
from services.notifier.retry_policy import DeliveryTuning
from shared import components, migrate
from shared.bus import BusNames, EventPublisher, RabbitPublisher
from shared.db import Database
from tests.support.services import AMQP_URL, create_database, drop_database

#: Secret key the pipeline's notifier encrypts endpoint secrets with.
SECRET_KEY = "pipeline-test-secret-key"
#: Dramatiq's suffixes of a queue's delay and dead-letter queues.
_DRAMATIQ_SUFFIXES = ("", ".DQ", ".XQ")


@contextmanager
def isolated_database(label: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database of its own; dropped afterwards.

    The engine's sweeper and relay act on every due row of their database, so the
    engine's tests keep to a database of their own: they neither send other tests'
    deliveries (which may name public hosts) nor take their outbox rows.
    """
    name = f"settle_test_{label}_{os.getpid()}"
    url = create_database(name)
    try:
        for component in (components.IDENTITY, components.CORE, components.NOTIFIER):
            migrate.upgrade(component, url)
        yield url
    finally:
        if not os.environ.get("SETTLE_TEST_KEEP_DB"):
            drop_database(name)


def unique_prefix() -> str:
    return f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}."


def delete_bus(names: BusNames, queues: tuple[str, ...] = ("webhooks", "webhooks.retry")) -> None:
    """Delete every exchange and queue a pipeline with these names declared."""
    try:
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    except pika.exceptions.AMQPError:
        return
    try:
        channel = connection.channel()
        doomed = [names.notifier_queue, names.notifier_dead_queue]
        doomed += [names.queue(q) + s for q in queues for s in _DRAMATIQ_SUFFIXES]
        for queue in doomed:
            channel.queue_delete(queue)
        for exchange in (names.exchange, names.dead_letter_exchange):
            channel.exchange_delete(exchange)
    finally:
        connection.close()


def notifier_config(db_url: str, **overrides: Any) -> NotifierConfig:
    values: dict[str, Any] = {
        "database_url": db_url,
        "identity_database_url": db_url,
        "secret_key": SECRET_KEY,
        "env": "dev",
        "amqp_url": AMQP_URL,
        "allow_private": True,
        "retry_schedule": (0.2, 0.5, 1.0),
        "webhook_timeout_s": 1.0,
        "per_endpoint_concurrency": 2,
        "worker_threads": 8,
    }
    values.update(overrides)
    return NotifierConfig(**values)


@dataclass
class Pipeline:
    """A running pipeline and the helpers tests drive it with."""

    db: Database
    ctx: NotifierContext
    engine: DeliveryEngine
    names: BusNames

    def endpoint(
        self,
        tenant_id: str,
        url: str,
        event_types: list[str],
        *,
        name: str = "test",
        **options: Any,
    ) -> tuple[str, str]:
        """A new enabled endpoint through the notifier's own domain code -> (id, secret);
        `options` are create_endpoint's (signature_scheme, ...)."""
        with self.db.transaction() as session:
            endpoint, secret = endpoint_domain.create_endpoint(
                session,
                self.ctx.secret_box,
                tenant_id,
                name=name,
                url=url,
                event_types=event_types,
                allow_private=True,
                max_endpoints=100,
                **options,
            )
            return endpoint.id, secret

    def rotate(self, endpoint_id: str, overlap_s: int) -> str:
        with self.db.transaction() as session:
            endpoint = endpoint_domain.get_endpoint(session, None, endpoint_id)
            return endpoint_domain.rotate_secret(
                endpoint, self.ctx.secret_box, previous_expires_in_s=overlap_s
            )

    def emit(
        self, tenant_id: str, event_type: str, data: dict[str, Any], event_id: str | None = None
    ) -> dict[str, Any]:
        """What core does: write the event in a committed transaction (NOTIFY wakes the relay)."""
        with self.db.transaction() as session:
            return outbox.emit(session, event_type, tenant_id, data, event_id=event_id)

    def _detached(self, query: Any) -> list[Any]:
        """Rows loaded and detached, so they can be read after the session ends."""
        with self.db.reader() as session:
            rows = list(session.scalars(query))
            session.expunge_all()
            return rows

    def deliveries(self, event_id: str) -> list[Delivery]:
        return self._detached(
            sa.select(Delivery).where(Delivery.event_id == event_id).order_by(Delivery.id)
        )

    def attempts(self, delivery_id: str) -> list[Attempt]:
        return self._detached(
            sa.select(Attempt)
            .where(Attempt.delivery_id == delivery_id)
            .order_by(Attempt.number, Attempt.id)
        )

    def endpoint_row(self, endpoint_id: str) -> Endpoint:
        (row,) = self._detached(sa.select(Endpoint).where(Endpoint.id == endpoint_id))
        return row

    def wait_status(
        self, event_id: str, status: str, *, count: int = 1, timeout: float = 15
    ) -> list[Delivery]:
        """Until `count` deliveries of the event have `status`; fails the test on timeout."""
        return wait_until(
            lambda: (
                found
                if len(found := [d for d in self.deliveries(event_id) if d.status == status])
                >= count
                else None
            ),
            timeout,
            f"{count} deliveries of {event_id} {status}",
        )


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@contextmanager
def running_pipeline(
    pg_url: str,
    *,
    publisher_factory: Callable[[BusNames], EventPublisher] | None = None,
    relay: bool = True,
    consumer: bool = True,
    worker: bool = True,
    sweeper: bool = True,
    settings: EngineSettings | None = None,
    names: BusNames | None = None,
    **config: Any,
) -> Iterator[Pipeline]:
    """Start the parts asked for; stop them and delete the bus names, whatever happens.

    `names`: the bus names to use (default: a prefix unique to this pipeline).
    """
    names = names or BusNames(unique_prefix())
    db = Database(pg_url, pool_size=12)
    settings = settings or EngineSettings(
        names=names,
        sweep_interval_s=0.25,
        sweep_grace_s=1.0,
        prefetch=32,
        tuning=DeliveryTuning(lease_margin_s=0.5),
    )
    settings = replace(settings, names=names)
    engine = build_engine(notifier_config(pg_url, **config), settings, db=db, identity_db=db)
    ctx = engine.ctx
    stop = threading.Event()
    threads: list[threading.Thread] = []
    dramatiq_worker = None
    try:
        if consumer:
            ready = threading.Event()
            thread = threading.Thread(
                target=engine.consumer().run, args=(stop,), kwargs={"ready": ready}, daemon=True
            )
            thread.start()
            threads.append(thread)
            assert ready.wait(15), "consumer did not connect to RabbitMQ"
        if worker:
            dramatiq_worker = start_worker(engine, threads=ctx.config.worker_threads, stop=stop)
        if sweeper:
            thread = threading.Thread(target=engine.sweeper().run, args=(stop,), daemon=True)
            thread.start()
            threads.append(thread)
        if relay:
            make = publisher_factory or (lambda n: RabbitPublisher(AMQP_URL, n))
            threads.append(start_relay_thread(db, lambda: make(names), stop, poll_s=0.5))
        yield Pipeline(db, ctx, engine, names)
    finally:
        stop.set()
        if dramatiq_worker is not None:
            dramatiq_worker.stop(timeout=5000)
        for thread in threads:
            thread.join(10)
        engine.broker.close()
        delete_bus(names)
        db.dispose()
