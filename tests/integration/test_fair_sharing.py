"""Fair sharing of a worker: tenant and endpoint shares, first attempts first, the breaker.

Real PostgreSQL, RabbitMQ and HTTP receivers on 127.0.0.1 for the pipeline tests (8
worker threads, a tenant may hold half of them, an endpoint 2, 1 s attempt deadline);
the queue-order test runs Dramatiq's StubBroker with a stand-in deliverer.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from services.notifier.actors import DeliveryActors
from services.notifier.broker import DeliveryQueues
from services.notifier.models import SUCCEEDED
from shared import events
from shared.bus import BusNames
from tests.conftest import make_tenant
from tests.support.pipeline import Pipeline, isolated_database, running_pipeline, wait_until
from tests.support.receiver import Answer, Receiver
from tests.support.services import require_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with isolated_database("fairness") as url:
        yield url


@pytest.fixture(scope="module")
def pipeline(engine_url: str) -> Iterator[Pipeline]:
    with running_pipeline(
        engine_url,
        worker_threads=8,
        per_endpoint_concurrency=2,
        tenant_share=0.5,
        breaker_threshold=5,
        breaker_cooldown_s=1.0,
    ) as running:
        yield running


@pytest.fixture
def rx() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


def _deposit(n: int = 1) -> dict[str, object]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:10]}", "n": n}}


def _most_at_once(times: list[float], held_s: float) -> int:
    """Most requests begun within any window of `held_s` (each holds a thread that long)."""
    times = sorted(times)
    return max((sum(1 for t in times if s <= t < s + held_s) for s in times), default=0)


def test_a_tenant_with_many_hanging_endpoints_holds_only_its_share(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given a tenant whose 6 endpoints all hang past the 1 s deadline: at 2 slots each
    # they could take 12 threads, more than the worker's 8
    hostile = make_tenant(pipeline.db).tenant_id
    paths = [f"/hang{i}" for i in range(6)]
    for path in paths:
        rx.script(path, Answer.hang(3))
        pipeline.endpoint(hostile, rx.url(path), [events.DEPOSIT_SOURCE_SEEN])
    # And another tenant with a healthy endpoint
    healthy = make_tenant(pipeline.db).tenant_id
    pipeline.endpoint(healthy, rx.url("/fine"), [events.DEPOSIT_CREDITED])
    # When the hostile tenant's events are being attempted
    for n in range(4):
        pipeline.emit(hostile, events.DEPOSIT_SOURCE_SEEN, _deposit(n))
    assert rx.wait_for(lambda r: sum(len(r.hits(p)) for p in paths) >= 4, 10)
    started = time.time()
    sent = [pipeline.emit(healthy, events.DEPOSIT_CREDITED, _deposit(n)) for n in range(5)]
    # Then the healthy tenant's events arrive at once: the hostile tenant holds at most
    # half the threads, so the others are free
    assert rx.wait_for(lambda r: len(r.hits("/fine")) >= 5, 5)
    slowest = max(h.received_at for h in rx.hits("/fine")) - started
    assert slowest < 0.8, f"the healthy tenant waited {slowest:.2f}s"
    for envelope in sent:
        pipeline.wait_status(envelope["id"], SUCCEEDED)
    # And no 0.9 s window saw the hostile tenant hold more than 7 threads: alone it may
    # use all but the reserve (1 of 8), which the healthy tenant found free at once
    hostile_times = [h.received_at for p in paths for h in rx.hits(p)]
    assert _most_at_once(hostile_times, 0.9) <= 7


def test_the_breaker_stops_hammering_a_failing_endpoint_and_probes_until_it_answers(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given an endpoint that fails every attempt
    rx.script("/down", Answer.fail(500))
    tenant_id = make_tenant(pipeline.db).tenant_id
    pipeline.endpoint(tenant_id, rx.url("/down"), [events.DEPOSIT_CREDITED])
    # When 20 events are delivered to it (1 + 3 retries each: 80 attempts without a breaker)
    sent = [pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit(n)) for n in range(20)]
    time.sleep(3.0)
    # Then after a few failures the breaker holds the rest back, sending one probe a
    # second or so
    early = len(rx.hits("/down"))
    assert early <= 5 + 2 * 8, f"{early} attempts in 3 s"
    # And when the endpoint answers again, a probe finds out and every delivery goes
    rx.script("/down", Answer.ok())
    for envelope in sent:
        pipeline.wait_status(envelope["id"], SUCCEEDED, timeout=30)
    # And no delivery ran out its schedule while the breaker held it
    deliveries = [d for e in sent for d in pipeline.deliveries(e["id"])]
    assert all(d.attempt_count <= 4 for d in deliveries)


class _Recorder:
    """Stands in for the Deliverer: records the order of the jobs and takes 20 ms each."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.lock = threading.Lock()

    def deliver(self, delivery_id: str, bounces: int = 0, route: Any = None) -> str:
        time.sleep(0.02)
        with self.lock:
            self.order.append(delivery_id)
        return SUCCEEDED


def test_first_attempts_are_not_queued_behind_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker (one thread, fetching ahead up to 100 jobs a queue) with 40
    # retries queued and already underway
    monkeypatch.setattr(dramatiq.worker, "QUEUE_PREFETCH", 100)
    broker = StubBroker()
    broker.emit_after("process_boot")
    queues = DeliveryQueues(broker, BusNames(f"t{uuid.uuid4().hex[:6]}."))
    recorder = _Recorder()
    DeliveryActors(queues, recorder)  # type: ignore[arg-type]
    for n in range(40):
        queues.schedule(f"retry-{n}", 0.0)
    worker = dramatiq.Worker(broker, worker_threads=1, queues={queues.queue, queues.retry_queue})
    worker.start()
    try:
        wait_until(lambda: len(recorder.order) >= 3, 10, "retries underway")
        # When a first attempt arrives
        with recorder.lock:
            done_before = len(recorder.order)
            queues.enqueue(["first"])
        wait_until(lambda: "first" in recorder.order, 10, "the first attempt")
        retries_after: Any = recorder.order.index("first") - done_before
    finally:
        worker.stop()
        broker.close()
    # Then it goes next (give or take the job in hand), not after the remaining retries
    assert retries_after <= 2, recorder.order


def test_a_freed_slot_runs_the_next_waiting_delivery_without_a_broker_round_trip(
    pipeline: Pipeline, rx: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an endpoint answering in 50 ms, which may hold 2 of the worker's 8 threads
    rx.script("/slowish", Answer.hang(0.05))
    tenant_id = make_tenant(pipeline.db).tenant_id
    pipeline.endpoint(tenant_id, rx.url("/slowish"), [events.DEPOSIT_CREDITED])
    deliverer = pipeline.engine.deliverer
    queues = deliverer.dispatch
    sent_on: list[str] = []
    send = queues.schedule  # (not `queues.schedule` inside: that is this spy once patched)

    def schedule(delivery_id: str, delay_s: float, **kwargs: Any) -> None:
        sent_on.append(delivery_id)
        send(delivery_id, delay_s, **kwargs)

    monkeypatch.setattr(queues, "schedule", schedule)
    parked_before = deliverer.metrics.saturated._value.get()
    # When 24 events for it arrive at once (most must wait for one of its 2 slots)
    sent = [pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit(n)) for n in range(24)]
    for envelope in sent:
        pipeline.wait_status(envelope["id"], SUCCEEDED, timeout=30)
    parked = deliverer.metrics.saturated._value.get() - parked_before
    # Then each waited here and went on in the thread whose attempt freed its slot: a
    # job through the broker and back (a publish, a consume, an ack) only when a
    # thread's run of them reached its bound (one attempt deadline, 1 s: ~20 of 50 ms)
    assert parked >= 10, f"only {parked} deliveries waited for a slot"
    assert len(sent_on) <= 4, f"{len(sent_on)} sent through the broker for {parked} waiting"


def test_an_event_to_many_endpoints_goes_as_one_job_and_reaches_every_endpoint(
    pipeline: Pipeline, rx: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a tenant with 20 endpoints (a fan-out of 16 or more travels as one job)
    tenant_id = _tenant_with_endpoints(pipeline, rx, "/many")
    deliverer = pipeline.engine.deliverer
    groups: list[int] = []
    run_group = deliverer.deliver_group

    def deliver_group(tenant: str, items: list[tuple[str, str]]) -> int:
        groups.append(len(items))
        return run_group(tenant, items)

    monkeypatch.setattr(deliverer, "deliver_group", deliver_group)
    # When one event is sent
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then one job carried its 20 deliveries, and each endpoint got it once, attempt 1
    rows = pipeline.wait_status(envelope["id"], SUCCEEDED, count=20, timeout=30)
    assert groups == [20]
    assert sorted(row.attempt_count for row in rows) == [1] * 20
    assert all(len(rx.hits(f"/many{n}")) == 1 for n in range(20))


def test_a_group_for_a_full_tenant_waits_without_a_claim_and_goes_when_slots_free(
    pipeline: Pipeline, rx: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant_id = _tenant_with_endpoints(pipeline, rx, "/full")
    deliverer = pipeline.engine.deliverer
    queues = deliverer.dispatch
    enqueued: list[list[str]] = []
    enqueue = queues.enqueue

    def spy(ids: list[str], routes: Any = None, **kwargs: Any) -> None:
        enqueued.append(list(ids))
        enqueue(ids, routes, **kwargs)

    # Given the tenant's every slot in the worker held
    held = 0
    while deliverer.limiter.try_acquire(f"busy-{held}", tenant_id):
        held += 1
    monkeypatch.setattr(queues, "enqueue", spy)
    try:
        # When an event to its 20 endpoints arrives (one group job)
        envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
        rows = wait_until(
            lambda: found if len(found := pipeline.deliveries(envelope["id"])) == 20 else None,
            15,
            "the event's 20 deliveries",
        )
        items = [(row.id, row.endpoint_id) for row in rows]
        # Then all 20 wait in the worker: no claim, no job sent on, no request made
        wait_until(
            lambda: {d for d, _ in items} <= set(deliverer.waiting.ids()),
            15,
            "the 20 deliveries waiting in the worker",
        )
        assert enqueued == []
        rows = pipeline.deliveries(envelope["id"])
        assert all(row.attempt_count == 0 and row.lease_until is None for row in rows)
        assert not any(rx.hits(f"/full{n}") for n in range(20))
    finally:
        for n in range(held):
            deliverer.limiter.release(f"busy-{n}", tenant_id)
    # And when its slots free up, the waiting ones go (as the room allows, then as
    # attempts end), each once
    deliverer.deliver_group(tenant_id, items)  # a repeat of the job: the room is free now
    pipeline.wait_status(envelope["id"], SUCCEEDED, count=20, timeout=30)
    assert all(len(rx.hits(f"/full{n}")) == 1 for n in range(20))
    assert enqueued and len(enqueued[0]) < 20  # only what the room allowed went as jobs


def _tenant_with_endpoints(pipeline: Pipeline, rx: Receiver, prefix: str, count: int = 20) -> str:
    """A new tenant with `count` endpoints on `rx` (`<prefix>0`...) for deposit.credited."""
    tenant_id = make_tenant(pipeline.db).tenant_id
    for n in range(count):
        pipeline.endpoint(
            tenant_id, rx.url(f"{prefix}{n}"), [events.DEPOSIT_CREDITED], name=f"e{n}"
        )
    return tenant_id
