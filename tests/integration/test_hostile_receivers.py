"""Receivers that fight back: trickling bytes, huge answers, attempts that outlive their lease.

Real HTTP receivers on 127.0.0.1, real PostgreSQL; the pipeline tests also use RabbitMQ.
The attempt deadline is 1 s (SETTLE_WEBHOOK_TIMEOUT_S) for DNS, connect, send and read
together.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest

from services.notifier.models import FAILED, SUCCEEDED
from services.notifier.sender import TIMEOUT, Sender
from services.notifier.sweeper import due_deliveries
from shared import events
from shared.timefmt import utcnow
from tests.conftest import make_tenant
from tests.integration.notifier_fixtures import deliver_event, update_delivery
from tests.support.pipeline import Pipeline, isolated_database, running_pipeline
from tests.support.receiver import Answer, Receiver
from tests.support.services import require_service

pytestmark = pytest.mark.integration

#: Slack for a loaded machine on top of the 1 s deadline.
SLACK_S = 0.5


@pytest.fixture
def rx() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with isolated_database("hostile_rx") as url:
        yield url


@pytest.fixture(scope="module")
def pipeline(engine_url: str) -> Iterator[Pipeline]:
    with running_pipeline(engine_url) as running:
        yield running


@pytest.fixture
def deliverer_only(engine_url: str) -> Iterator[Pipeline]:
    """The engine's Deliverer with nothing else running: the test drives every attempt."""
    with running_pipeline(
        engine_url, relay=False, consumer=False, worker=False, sweeper=False
    ) as running:
        yield running


def _deposit() -> dict[str, object]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:10]}", "amount": "1.00"}}


@pytest.mark.parametrize("headers_too", [True, False], ids=["status-line", "body"])
def test_a_trickling_receiver_is_cut_at_the_deadline(rx: Receiver, headers_too: bool) -> None:
    # Given a receiver that sends its answer one byte every 0.2 s (each read is quick,
    # so a per-read timeout never fires; the whole answer takes ~30 s)
    rx.script("/trickle", Answer.trickle(0.2, headers_too=headers_too))
    sender = Sender(timeout_s=1.0, allow_private=True)
    # When a delivery is sent to it
    started = time.monotonic()
    result = sender.send(rx.url("/trickle"), b"{}", {"Content-Type": "application/json"})
    took = time.monotonic() - started
    # Then the attempt is cut at its 1 s deadline and counts as a timeout
    assert result.error == TIMEOUT, result
    assert took < 1.0 + SLACK_S, f"the attempt took {took:.2f}s"
    assert len(rx.hits("/trickle")) == 1


def test_a_huge_answer_is_not_read_past_its_first_4_kib(rx: Receiver) -> None:
    # Given a receiver answering 200 with a 1 GiB body
    rx.script("/huge", Answer.huge(1 << 30))
    sender = Sender(timeout_s=1.0, allow_private=True)
    # When a delivery is sent to it
    started = time.monotonic()
    result = sender.send(rx.url("/huge"), b"{}", {})
    took = time.monotonic() - started
    # Then the answer counts (a 2xx in time) and only its first 4 KiB were read and kept
    assert result.ok and result.status == 200
    assert result.body == "x" * 4096
    assert took < 1.0, f"the attempt took {took:.2f}s"


def test_a_trickling_endpoint_runs_its_schedule_with_one_number_per_attempt(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given an endpoint that trickles its answer (it would take ~30 s per attempt)
    rx.script("/trickle", Answer.trickle(0.2))
    tenant_id = make_tenant(pipeline.db).tenant_id
    pipeline.endpoint(tenant_id, rx.url("/trickle"), [events.DEPOSIT_CREDITED])
    # When an event is delivered (schedule 0.2 s, 0.5 s, 1 s: four attempts)
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then each attempt is cut at 1 s, is recorded once with its own number, and the
    # delivery fails after the fourth, as the schedule says: the lease (deadline +
    # margin) never lapsed, so the sweeper never sent the same attempt again
    (delivery,) = pipeline.wait_status(envelope["id"], FAILED, timeout=20)
    attempts = pipeline.attempts(delivery.id)
    assert [a.number for a in attempts] == [1, 2, 3, 4]
    assert [a.error for a in attempts] == [TIMEOUT] * 4
    assert all((a.latency_ms or 0) < (1.0 + SLACK_S) * 1000 for a in attempts)
    assert delivery.attempt_count == 4
    assert len(rx.hits("/trickle")) == 4


def test_an_attempt_that_lost_its_lease_is_recorded_as_such_and_counted(
    deliverer_only: Pipeline, rx: Receiver
) -> None:
    # Given a delivery whose first attempt is slow (0.6 s, then 200)
    p = deliverer_only
    rx.script("/slow", Answer.hang(0.6), Answer.ok())
    tenant_id = make_tenant(p.db).tenant_id
    p.endpoint(tenant_id, rx.url("/slow"), [events.DEPOSIT_CREDITED])
    _, (delivery,) = deliver_event(p.db, tenant_id, data=_deposit())
    first = threading.Thread(target=p.engine.deliverer.deliver, args=(delivery.id,))
    first.start()
    assert rx.wait_for(lambda r: len(r.hits("/slow")) == 1, 5)
    # When its worker stalls past the lease and another worker takes the delivery over
    # (what the sweeper does with a lapsed lease) and sends it again
    update_delivery(p.db, delivery.id, lease_until=utcnow() - timedelta(seconds=1))
    assert p.engine.deliverer.deliver(delivery.id) == SUCCEEDED
    first.join(5)
    # Then both attempts are in the log with their own numbers; the first says it lost
    # its lease (its answer did not decide the delivery's state) and still counted
    attempts = p.attempts(delivery.id)
    assert [a.number for a in attempts] == [1, 2]
    assert attempts[0].response_status == 200 and attempts[0].error == "lease_lost"
    assert attempts[1].response_status == 200 and attempts[1].error is None
    (row,) = p.deliveries(delivery.event_id)
    assert row.status == SUCCEEDED and row.attempt_count == 2


def test_a_lapsed_lease_nobody_took_over_still_records_the_attempt(
    deliverer_only: Pipeline, rx: Receiver
) -> None:
    # Given an attempt in flight (0.6 s, then 200)
    p = deliverer_only
    rx.script("/late", Answer.hang(0.6))
    tenant_id = make_tenant(p.db).tenant_id
    p.endpoint(tenant_id, rx.url("/late"), [events.DEPOSIT_CREDITED])
    _, (delivery,) = deliver_event(p.db, tenant_id, data=_deposit())
    outcome: list[str] = []
    first = threading.Thread(target=lambda: outcome.append(p.engine.deliverer.deliver(delivery.id)))
    first.start()
    assert rx.wait_for(lambda r: len(r.hits("/late")) == 1, 5)
    # When its lease lapses while it waits, but no other worker claims the delivery
    update_delivery(p.db, delivery.id, lease_until=utcnow() - timedelta(seconds=1))
    first.join(5)
    # Then its answer still decides the delivery: succeeded after one attempt, not
    # left pending to be sent a second time
    assert outcome == [SUCCEEDED]
    (row,) = p.deliveries(delivery.event_id)
    assert row.status == SUCCEEDED and row.attempt_count == 1
    assert [a.error for a in p.attempts(delivery.id)] == [None]


def test_a_repeat_job_for_a_delivery_held_by_an_open_breaker_is_dropped(
    deliverer_only: Pipeline, rx: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeper re-sends a delivery held here by its endpoint's open breaker (the row
    is due, with no lease), every sweep while the breaker stays open: each repeat used
    to send another delayed message, and they piled up. Now one is on its way at a time;
    once it is due, a job for the delivery counts again (a lost message holds nothing)."""
    p = deliverer_only
    tenant_id = make_tenant(p.db).tenant_id
    endpoint_id, _ = p.endpoint(tenant_id, rx.url("/down"), [events.DEPOSIT_CREDITED])
    _, (delivery,) = deliver_event(p.db, tenant_id, data=_deposit())
    deliverer = p.engine.deliverer
    # Given the endpoint's breaker open here
    for _ in range(deliverer.breakers.threshold):
        deliverer.breakers.record(endpoint_id, ok=False)
    scheduled: list[tuple[str, float]] = []
    monkeypatch.setattr(
        deliverer.dispatch,
        "schedule",
        lambda delivery_id, delay_s, **_: scheduled.append((delivery_id, delay_s)),
    )
    route = (endpoint_id, tenant_id)
    # When the consumer's job and then three sweeper repeats arrive
    for _ in range(4):
        deliverer.deliver(delivery.id, route=route)
    # Then one message is on its way back, not four
    assert [d for d, _ in scheduled] == [delivery.id]
    # And once it is due, the delivery's next job is handled again (sent on once more)
    deliverer._breaker_waits[delivery.id] = time.monotonic() - 1  # its due time passed
    deliverer.deliver(delivery.id, route=route)
    assert [d for d, _ in scheduled] == [delivery.id, delivery.id]
    assert rx.hits("/down") == []


def test_a_delivery_waiting_for_a_slot_is_kept_due_so_the_sweeper_leaves_it(
    pipeline: Pipeline, rx: Receiver
) -> None:
    """A delivery waiting in a worker for a slot of its tenant is due with no lease (losing
    the worker must lose nothing), so the sweeper found it once it was overdue by the
    grace, and re-sent it every sweep after that: with a tenant held full by hanging
    endpoints, 500 jobs every 5 s ahead of everyone's first attempts. The worker now
    keeps such rows due, so the sweeper leaves them to it, and finds them once the
    worker is gone."""
    p = pipeline
    tenant_id = make_tenant(p.db).tenant_id
    endpoint_id, _ = p.endpoint(tenant_id, rx.url("/ok"), [events.DEPOSIT_CREDITED])
    _, (delivery,) = deliver_event(p.db, tenant_id, data=_deposit())
    deliverer = p.engine.deliverer
    # Given the tenant's every slot in the worker held (by attempts to other endpoints)
    held = 0
    while deliverer.limiter.try_acquire(f"busy-{held}", tenant_id):
        held += 1
    try:
        # And its delivery waiting in the worker for a slot, due for five minutes already
        assert deliverer.deliver(delivery.id, route=(endpoint_id, tenant_id)) == "saturated"
        assert delivery.id in deliverer.waiting.ids()
        update_delivery(p.db, delivery.id, next_attempt_at=utcnow() - timedelta(minutes=5))
        assert delivery.id in _swept(p, grace_s=30)
        # When the worker's keeper runs (every third of the 1 s grace here)
        deadline = time.monotonic() + 5
        while delivery.id in _swept(p, grace_s=30) and time.monotonic() < deadline:
            time.sleep(0.1)
        # Then the sweeper leaves the delivery to the worker
        assert delivery.id not in _swept(p, grace_s=30)
        (row,) = p.deliveries(delivery.event_id)
        assert row.lease_until is None and row.attempt_count == 0
        # And a row kept lately is not rewritten (its due time is indexed: each rewrite
        # is a new index entry)
        assert (
            deliverer.store.keep_due(
                [delivery.id], utcnow(), stale_before=row.next_attempt_at - timedelta(seconds=1)
            )
            == 0
        )
        assert deliverer.store.keep_due([delivery.id], utcnow()) == 1
        # And one grace after the worker stops keeping it (it died), the sweeper finds it
        assert delivery.id in _swept(p, grace_s=30, later_s=31)
    finally:
        for n in range(held):
            deliverer.limiter.release(f"busy-{n}", tenant_id)
    # And once a slot is free, the delivery goes
    deliverer.keep_waiting()  # what the keeper does: sends on the overdue ones that can go
    deliverer.deliver(delivery.id, route=(endpoint_id, tenant_id))
    p.wait_status(delivery.event_id, SUCCEEDED)


def _swept(p: Pipeline, *, grace_s: float, later_s: float = 0.0) -> list[str]:
    """Which deliveries a sweeper with `grace_s` would re-send, `later_s` from now."""
    now = utcnow() + timedelta(seconds=later_s)
    return [d for d, _, _ in due_deliveries(p.db, grace_s=grace_s, batch=100_000, now=now)]
