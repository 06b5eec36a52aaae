"""Operational events at a tenant's other endpoint: failing, exhausted, recovered.

The whole pipeline in-process (real PostgreSQL, real RabbitMQ, real HTTP receivers on
127.0.0.1): retries on a fast schedule (three attempts a delivery), an endpoint is
failing after three failed attempts in a row, and the breaker is out of the way.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from services.notifier.models import FAILED, SUCCEEDED, StoredEvent
from shared import events
from tests.conftest import make_tenant
from tests.support.catalog import conforming
from tests.support.pipeline import Pipeline, isolated_database, running_pipeline, wait_until
from tests.support.receiver import Answer, Receiver
from tests.support.services import require_service

pytestmark = pytest.mark.integration

#: Every operational type: the failing endpoint subscribes to them too, and must never
#: hear about itself.
OPERATIONAL = list(events.OPERATIONAL_EVENT_TYPES)
FAILING, RECOVERED, EXHAUSTED = (
    events.WEBHOOK_ENDPOINT_FAILING,
    events.WEBHOOK_ENDPOINT_RECOVERED,
    events.WEBHOOK_DELIVERY_EXHAUSTED,
)


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with (
        isolated_database("operational") as url,
        running_pipeline(
            url,
            retry_schedule=(0.2, 0.4),
            failing_after_attempts=3,
            breaker_threshold=1000,
        ) as running,
    ):
        yield running


@pytest.fixture
def rx() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


def _deposit() -> dict[str, Any]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:10]}", "amount": "125.50"}}


def _bodies(rx: Receiver, path: str) -> list[dict[str, Any]]:
    return [json.loads(hit.body) for hit in rx.hits(path)]


def _types(rx: Receiver, path: str) -> Counter[str]:
    return Counter(body["type"] for body in _bodies(rx, path))


def test_a_failing_endpoint_is_told_of_at_the_tenants_other_endpoint(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given a tenant's ledger endpoint that fails every attempt (it subscribes to the
    # operational events too), and its ops endpoint subscribed to them
    rx.script("/ledger", Answer.fail(503))
    tenant_id = make_tenant(pipeline.db).tenant_id
    ledger_id, _ = pipeline.endpoint(
        tenant_id, rx.url("/ledger"), [events.DEPOSIT_CREDITED, *OPERATIONAL]
    )
    pipeline.endpoint(tenant_id, rx.url("/ops"), OPERATIONAL)

    # When a deposit.credited event runs out its three attempts
    first = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    (gave_up,) = pipeline.wait_status(first["id"], FAILED, timeout=20)
    assert rx.wait_for(lambda r: _types(r, "/ops")[EXHAUSTED] == 1, 20)

    # Then the ops endpoint heard once that the ledger is failing, at its third attempt,
    # and that the delivery gave up (as the deliveries API serves it)
    assert rx.wait_for(lambda r: _types(r, "/ops")[FAILING] == 1, 20)
    by_type = {body["type"]: conforming(body) for body in _bodies(rx, "/ops")}
    failing = by_type[FAILING]["data"]
    assert failing["webhookEndpoint"]["id"] == ledger_id
    assert failing["failedAttempts"] == 3
    assert failing["lastAttempt"]["deliveryId"] == gave_up.id
    assert failing["lastAttempt"]["number"] == 3
    assert failing["lastAttempt"]["responseStatus"] == 503
    assert failing["lastAttempt"]["error"] == "http_503"
    exhausted = by_type[EXHAUSTED]["data"]
    assert exhausted["webhookEndpoint"]["id"] == ledger_id
    assert exhausted["webhookDelivery"]["id"] == gave_up.id
    assert exhausted["webhookDelivery"]["status"] == FAILED
    assert exhausted["webhookDelivery"]["attemptCount"] == 3

    # When a second delivery gives up too
    second = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    (gave_up_too,) = pipeline.wait_status(second["id"], FAILED, timeout=20)
    assert rx.wait_for(lambda r: _types(r, "/ops")[EXHAUSTED] == 2, 20)
    # Then that is told, but not that the ledger is failing again (same run)
    told = [
        b["data"]["webhookDelivery"]["id"] for b in _bodies(rx, "/ops") if b["type"] == EXHAUSTED
    ]
    assert sorted(told) == sorted([gave_up.id, gave_up_too.id])
    assert _types(rx, "/ops")[FAILING] == 1

    # When the ledger answers again
    rx.script("/ledger", Answer.ok())
    third = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    pipeline.wait_status(third["id"], SUCCEEDED, timeout=20)
    # Then the ops endpoint hears it recovered, after a run of six failed attempts
    assert rx.wait_for(lambda r: _types(r, "/ops")[RECOVERED] == 1, 20)
    (recovered,) = [conforming(b) for b in _bodies(rx, "/ops") if b["type"] == RECOVERED]
    assert recovered["data"]["webhookEndpoint"]["id"] == ledger_id
    assert recovered["data"]["failedAttempts"] == 6
    assert recovered["data"]["failingSince"] == failing["failingSince"]
    assert _types(rx, "/ops") == Counter({FAILING: 1, EXHAUSTED: 2, RECOVERED: 1})

    # And the ledger never heard about itself: only its deposit events came to it
    assert set(_types(rx, "/ledger")) == {events.DEPOSIT_CREDITED}
    # And its streak is over: a new run would be told anew
    row = pipeline.endpoint_row(ledger_id)
    assert (row.failing_since, row.failed_attempts, row.failing_notified_at) == (None, 0, None)


def test_a_notice_that_gives_up_is_not_told_again(pipeline: Pipeline, rx: Receiver) -> None:
    # Given two endpoints of a tenant, both failing every attempt, each subscribed to
    # deposit.credited and to the operational events
    rx.script("/a", Answer.fail(500))
    rx.script("/b", Answer.fail(500))
    tenant_id = make_tenant(pipeline.db).tenant_id
    a_id, _ = pipeline.endpoint(tenant_id, rx.url("/a"), [events.DEPOSIT_CREDITED, *OPERATIONAL])
    pipeline.endpoint(tenant_id, rx.url("/b"), OPERATIONAL)

    # When a delivery to A gives up, and B fails every attempt of that notice too
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    pipeline.wait_status(envelope["id"], FAILED, timeout=20)
    assert rx.wait_for(lambda r: _types(r, "/b")[EXHAUSTED] == 3, 20)

    # Then its giving up is not an event of its own: one exhausted notice in all (two
    # endpoints failing would otherwise tell each other for ever)
    def notices_settled() -> bool:
        with pipeline.db.reader() as session:
            pending = session.scalar(
                sa.text(
                    "SELECT count(*) FROM webhook_deliveries WHERE tenant_id = :t "
                    "AND status IN ('pending', 'retrying')"
                ),
                {"t": tenant_id},
            )
        return pending == 0

    wait_until(notices_settled, 20, "every delivery of the tenant final")
    with pipeline.db.reader() as session:
        stored = Counter(
            session.scalars(
                sa.select(StoredEvent.event_type).where(StoredEvent.tenant_id == tenant_id)
            )
        )
    assert stored[EXHAUSTED] == 1
    (notice,) = [b for b in _bodies(rx, "/b") if b["type"] == EXHAUSTED][:1]
    assert notice["data"]["webhookEndpoint"]["id"] == a_id


def test_a_sandbox_tenants_operational_events_are_not_livemode(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given a sandbox tenant and a live one, each with a ledger that fails every attempt
    # and an ops endpoint subscribed to the operational events
    tenants = {
        "sandbox": make_tenant(pipeline.db, sandbox=True).tenant_id,
        "live": make_tenant(pipeline.db).tenant_id,
    }
    for kind, tenant_id in tenants.items():
        rx.script(f"/{kind}/ledger", Answer.fail(503))
        pipeline.endpoint(tenant_id, rx.url(f"/{kind}/ledger"), [events.DEPOSIT_CREDITED])
        pipeline.endpoint(tenant_id, rx.url(f"/{kind}/ops"), OPERATIONAL)
    # When a delivery to each ledger gives up, and each ledger answers again after
    for kind, tenant_id in tenants.items():
        first = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
        pipeline.wait_status(first["id"], FAILED, timeout=20)
        assert rx.wait_for(lambda r, k=kind: _types(r, f"/{k}/ops")[EXHAUSTED] == 1, 20)
        rx.script(f"/{kind}/ledger", Answer.ok())
        second = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
        pipeline.wait_status(second["id"], SUCCEEDED, timeout=20)
        assert rx.wait_for(lambda r, k=kind: _types(r, f"/{k}/ops")[RECOVERED] == 1, 20)
    # Then every operational event of the sandbox tenant (failing, exhausted, recovered:
    # the worker's) says livemode false, as its deposit events do; the live tenant's true
    for kind, livemode in (("sandbox", False), ("live", True)):
        told = _bodies(rx, f"/{kind}/ops")
        assert Counter(b["type"] for b in told) == Counter({FAILING: 1, EXHAUSTED: 1, RECOVERED: 1})
        assert {b["livemode"] for b in told} == {livemode}
        assert {json.loads(h.body)["livemode"] for h in rx.hits(f"/{kind}/ledger")} == {livemode}
