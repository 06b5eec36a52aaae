"""Faults against the processes started as in production: nothing is lost.

`settle core worker` (outbox relay), `settle notifier consume` and `settle notifier
worker` run as subprocesses on the real PostgreSQL and RabbitMQ (exchange and queue
names unique to the test), delivering to a real HTTP receiver on 127.0.0.1. Events
are committed to core's outbox the way core commits them.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from services.core import outbox
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.models import PER_ACCOUNT, SUCCEEDED, Delivery
from services.notifier.secrets import SecretBox
from shared import events, signing
from shared.bus import BusNames
from shared.db import Database
from tests.conftest import make_tenant
from tests.support import keys
from tests.support.pipeline import delete_bus, isolated_database, unique_prefix, wait_until
from tests.support.processes import SettleProcess, SettleProcesses
from tests.support.receiver import Answer, Receiver
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.e2e

SECRET_KEY = "e2e-faults-secret-key"
WORKER_THREADS = 8
CONSUMER_READY = "notifier consumer ready"
WORKER_READY = "notifier worker ready"
RELAY_READY = "outbox relay started"


class Stack:
    """The three processes, their environment, and helpers to drive them."""

    def __init__(self, procs: SettleProcesses, db: Database, names: BusNames) -> None:
        self.procs = procs
        self.db = db
        self.names = names
        self.box = SecretBox(SECRET_KEY)
        self.relay: SettleProcess | None = None
        self.consumer: SettleProcess | None = None
        self.worker: SettleProcess | None = None

    def start(self) -> None:
        # Started together, waited for together: each spends seconds importing.
        self.relay = self.procs.start(
            "core-worker", "core", "worker", ready=RELAY_READY, wait=False
        )
        self.consumer = self.procs.start(
            "consume", "notifier", "consume", ready=CONSUMER_READY, wait=False
        )
        self.worker = self.procs.start(
            "worker",
            "notifier",
            "worker",
            "--threads",
            str(WORKER_THREADS),
            ready=WORKER_READY,
            wait=False,
        )
        for process in (self.relay, self.consumer, self.worker):
            process.wait_ready()

    def endpoint(
        self, tenant_id: str, url: str, types: list[str], ordering: str | None = None
    ) -> tuple[str, str]:
        with self.db.transaction() as session:
            endpoint, secret = endpoint_domain.create_endpoint(
                session,
                self.box,
                tenant_id,
                name="e2e",
                url=url,
                event_types=types,
                allow_private=True,
                max_endpoints=100,
                ordering=ordering,
            )
            return endpoint.id, secret

    def emit(self, tenant_id: str, n: int, start: int = 0) -> list[str]:
        ids = []
        for i in range(start, start + n):
            with self.db.transaction() as session:
                envelope = outbox.emit(
                    session, events.DEPOSIT_CREDITED, tenant_id, {"deposit": {"n": i}}
                )
            ids.append(envelope["id"])
        return ids

    def emit_about(self, tenant_id: str, account_id: str, event_id: str | None = None) -> str:
        """An event about a deposit account (numbered by core: `sequence`)."""
        with self.db.transaction() as session:
            envelope = outbox.emit(
                session,
                events.DEPOSIT_CREDITED,
                tenant_id,
                {"deposit": {"id": f"dep_{event_id}", "accountId": account_id}},
                event_id=event_id,
            )
        return str(envelope["id"])

    def deliveries(self, event_ids: list[str]) -> list[Delivery]:
        with self.db.reader() as session:
            rows = list(
                session.scalars(sa.select(Delivery).where(Delivery.event_id.in_(event_ids)))
            )
            session.expunge_all()
            return rows


@pytest.fixture(scope="module")
def stack_url() -> Iterator[str]:
    """A database of the module's own: the processes relay and sweep every row they see."""
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with isolated_database("faults") as url:
        yield url


@pytest.fixture
def stack(stack_url: str, tmp_path: Path) -> Iterator[Stack]:
    names = BusNames(unique_prefix())
    pg_url = stack_url
    pg_db = Database(stack_url, pool_size=4)
    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": pg_url,
        "SETTLE_DATA_DIR": str(tmp_path / "data"),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
        "SETTLE_AMQP_URL": AMQP_URL,
        "SETTLE_AMQP_PREFIX": names.prefix,
        "SETTLE_SECRET_KEY": SECRET_KEY,
        "SETTLE_WEBHOOK_ALLOW_PRIVATE": "true",
        "SETTLE_WEBHOOK_RETRY_SCHEDULE": "0.2s,0.5s,1s,2s",
        "SETTLE_WEBHOOK_TIMEOUT_S": "1",
        "SETTLE_WEBHOOK_ENDPOINT_CONCURRENCY": str(WORKER_THREADS),
        "SETTLE_WEBHOOK_SWEEP_INTERVAL_S": "0.5",
        "SETTLE_WEBHOOK_SWEEP_GRACE_S": "1",
        "SETTLE_WEBHOOK_LEASE_MARGIN_S": "0.5",
    }
    (tmp_path / "data").mkdir()
    procs = SettleProcesses(env, tmp_path / "logs")
    (tmp_path / "logs").mkdir()
    stack = Stack(procs, pg_db, names)
    try:
        with procs:
            stack.start()
            yield stack
    finally:
        delete_bus(names)
        pg_db.dispose()


def _received_ids(rx: Receiver, path: str) -> Counter[str]:
    return Counter(json.loads(h.body)["id"] for h in rx.hits(path))


def test_events_flow_through_the_production_processes(stack: Stack) -> None:
    with Receiver() as rx:
        # Given an endpoint and the three processes running
        tenant_id = make_tenant(stack.db).tenant_id
        _, secret = stack.endpoint(tenant_id, rx.url("/hook"), [events.DEPOSIT_CREDITED])
        # When core commits three events
        ids = stack.emit(tenant_id, 3)
        # Then each arrives once, signed
        assert rx.wait_for(lambda r: len(r.hits("/hook")) >= 3, 15), stack.procs.logs()
        assert sorted(_received_ids(rx, "/hook")) == sorted(ids)
        for hit in rx.hits("/hook"):
            signing.verify(secret, hit.headers, hit.body)
        wait_until(
            lambda: [d.status for d in stack.deliveries(ids)] == [SUCCEEDED] * 3, 5, "succeeded"
        )


def test_consumer_and_worker_killed_mid_batch_lose_nothing(stack: Stack) -> None:
    assert stack.consumer is not None and stack.worker is not None
    with Receiver() as rx:
        # Given a receiver that takes 0.2 s per delivery, so attempts are in flight
        rx.script("/slow", Answer.hang(0.2))
        tenant_id = make_tenant(stack.db).tenant_id
        stack.endpoint(tenant_id, rx.url("/slow"), [events.DEPOSIT_CREDITED])
        # When a batch is underway
        ids = stack.emit(tenant_id, 80)
        assert rx.wait_for(lambda r: len(r.hits("/slow")) >= 12, 20), stack.procs.logs()
        # And the consumer and the worker are killed without warning
        stack.consumer.kill()
        stack.worker.kill()
        received_at_kill = len(rx.hits("/slow"))
        # And core keeps committing while they are down
        ids += stack.emit(tenant_id, 20, start=80)
        # And they are started again
        stack.procs.restart(stack.consumer, wait=False)
        stack.procs.restart(stack.worker, wait=False)
        stack.consumer.wait_ready()
        stack.worker.wait_ready()
        # Then every event reaches the receiver
        everything = lambda r: set(ids) <= set(_received_ids(r, "/slow"))  # noqa: E731
        assert rx.wait_for(everything, 40), (
            f"missing {len(set(ids) - set(_received_ids(rx, '/slow')))} of {len(ids)} "
            f"(received {received_at_kill} before the kill)\n" + stack.procs.logs()
        )
        # And each event has exactly one delivery, succeeded
        wait_until(
            lambda: sorted(d.status for d in stack.deliveries(ids)) == [SUCCEEDED] * len(ids),
            10,
            "every delivery succeeded",
        )
        rows = stack.deliveries(ids)
        assert sorted(d.event_id for d in rows) == sorted(ids)
        # And repeats are only the attempts that were in flight at the kill (at least once)
        counts = _received_ids(rx, "/slow")
        repeats = sum(c - 1 for c in counts.values())
        assert repeats <= WORKER_THREADS, counts.most_common(3)


def test_the_worker_killed_mid_attempt_resends_after_the_lease(stack: Stack) -> None:
    assert stack.worker is not None
    with Receiver() as rx:
        # Given a receiver that holds the first request for 5 s
        rx.script("/stuck", Answer.hang(5), Answer.ok())
        tenant_id = make_tenant(stack.db).tenant_id
        stack.endpoint(tenant_id, rx.url("/stuck"), [events.DEPOSIT_CREDITED])
        (event_id,) = stack.emit(tenant_id, 1)
        # When the worker dies while that attempt waits
        assert rx.wait_for(lambda r: len(r.hits("/stuck")) >= 1, 15), stack.procs.logs()
        stack.worker.kill()
        started = time.monotonic()
        stack.procs.restart(stack.worker)
        # Then, once the lease lapses, the delivery is sent again and succeeds
        assert rx.wait_for(lambda r: len(r.hits("/stuck")) >= 2, 20), stack.procs.logs()
        (delivery,) = wait_until(
            lambda: [d for d in stack.deliveries([event_id]) if d.status == SUCCEEDED],
            10,
            "the delivery succeeded",
        )
        # The killed attempt was never recorded, but it took its number: it counts
        assert delivery.attempt_count == 2
        assert time.monotonic() - started < 20
        first, second = rx.hits("/stuck")[:2]
        assert first.body == second.body
        assert first.headers["x-service-delivery-id"] == second.headers["x-service-delivery-id"]


def test_the_worker_killed_mid_delivery_on_an_ordered_endpoint_holds_the_accounts_next(
    stack: Stack,
) -> None:
    assert stack.worker is not None
    with Receiver() as rx:
        # Given an ordered endpoint that holds account A's first event for 5 s
        first = events.new_event_id()
        rx.script("/ordered", Answer.hang(5), Answer.ok(), event_id=first)
        tenant_id = make_tenant(stack.db).tenant_id
        stack.endpoint(
            tenant_id, rx.url("/ordered"), [events.DEPOSIT_CREDITED], ordering=PER_ACCOUNT
        )
        stack.emit_about(tenant_id, "acc_A", first)
        assert rx.wait_for(lambda r: len(r.hits("/ordered")) >= 1, 15), stack.procs.logs()
        # When A's next event and account B's are committed while A's first is in flight
        second = stack.emit_about(tenant_id, "acc_A", events.new_event_id())
        other = stack.emit_about(tenant_id, "acc_B", events.new_event_id())
        # Then B's goes through (it is not held by A's), A's next does not
        assert rx.wait_for(lambda r: other in _received_ids(r, "/ordered"), 15), stack.procs.logs()
        assert second not in _received_ids(rx, "/ordered")
        # And when the worker dies with A's first still in flight
        stack.worker.kill()
        stack.procs.restart(stack.worker)
        # Then A's first is sent again once its lease lapses, and A's next only after it
        assert rx.wait_for(lambda r: second in _received_ids(r, "/ordered"), 30), stack.procs.logs()
        order = [json.loads(h.body)["id"] for h in rx.hits("/ordered")]
        assert order.count(first) == 2, order
        assert order.index(second) > len(order) - 1 - order[::-1].index(first), order
        ids = [first, second, other]
        wait_until(
            lambda: [d.status for d in stack.deliveries(ids)] == [SUCCEEDED] * 3, 10, "succeeded"
        )
