"""Delivery end to end in-process: outbox -> relay -> RabbitMQ -> consumer -> worker -> receiver.

Real PostgreSQL, real RabbitMQ (names unique to this module), real HTTP receivers on
127.0.0.1. Retries run on a fast schedule (0.2s, 0.5s, 1s) with a 1 s timeout.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pika
import pytest
import sqlalchemy as sa

from services.notifier import webhook_endpoints
from services.notifier.app import create_app
from services.notifier.models import DISABLED, FAILED, SKIPPED, SUCCEEDED, Endpoint
from services.notifier.sender import Sender
from shared import events, signing
from shared.bus import RabbitPublisher
from shared.db import Database
from shared.timefmt import utcnow
from tests.conftest import make_tenant
from tests.support.pipeline import Pipeline, isolated_database, running_pipeline, wait_until
from tests.support.receiver import Answer, Receiver, closed_port_url
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with isolated_database("delivery") as url:
        yield url


@pytest.fixture(scope="module")
def pipeline(engine_url: str) -> Iterator[Pipeline]:
    with running_pipeline(engine_url) as running:
        yield running


@pytest.fixture
def rx() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


def _tenant(db: Database) -> str:
    return make_tenant(db).tenant_id


def _deposit(n: int = 1) -> dict[str, object]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:10]}", "amount": "125.50", "n": n}}


def test_delivery_is_signed_and_carries_the_exact_envelope(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given an endpoint subscribed to deposit.credited
    tenant_id = _tenant(pipeline.db)
    endpoint_id, secret = pipeline.endpoint(tenant_id, rx.url("/hook"), [events.DEPOSIT_CREDITED])
    # When core commits a deposit.credited event
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then the receiver gets it once, signed with the secret from creation
    assert rx.wait_for(lambda r: len(r.hits("/hook")) >= 1, 10)
    (hit,) = rx.hits("/hook")
    assert hit.body == events.encode(envelope)
    assert signing.verify(secret, hit.headers, hit.body) == int(hit.headers["x-service-timestamp"])
    assert hit.headers["content-type"] == "application/json"
    assert hit.headers["x-service-event-id"] == envelope["id"]
    assert hit.headers["x-service-signature"].startswith("v1=")
    assert "," not in hit.headers["x-service-signature"]
    body = json.loads(hit.body)
    assert list(body) == ["id", "type", "createdAt", "tenantId", "livemode", "data"]
    assert body["type"] == events.DEPOSIT_CREDITED and body["tenantId"] == tenant_id
    # And the delivery is recorded as succeeded with one attempt
    (delivery,) = pipeline.wait_status(envelope["id"], SUCCEEDED)
    assert hit.headers["x-service-delivery-id"] == delivery.id
    assert delivery.endpoint_id == endpoint_id and delivery.attempt_count == 1
    (attempt,) = pipeline.attempts(delivery.id)
    assert attempt.response_status == 200 and attempt.error is None
    assert attempt.response_body == "ok" and attempt.latency_ms is not None
    assert attempt.signature_header == hit.headers["x-service-signature"]
    # And the worker's metrics counted it, end to end from core's commit
    registry = pipeline.engine.metrics.registry
    assert (
        registry.get_sample_value("settle_webhook_deliveries_total", {"outcome": "succeeded"}) or 0
    ) >= 1
    assert (registry.get_sample_value("settle_webhook_end_to_end_seconds_count") or 0) >= 1
    assert (
        registry.get_sample_value("settle_notifier_events_total", {"result": "stored"}) or 0
    ) >= 1


def test_the_api_shows_each_attempt_exactly_as_sent(pipeline: Pipeline, rx: Receiver) -> None:
    # Given a receiver that fails once, then takes the retry
    rx.script("/as-sent", Answer.fail(503), Answer.ok())
    tenant = make_tenant(pipeline.db)
    _, secret = pipeline.endpoint(tenant.tenant_id, rx.url("/as-sent"), [events.DEPOSIT_CREDITED])
    envelope = pipeline.emit(tenant.tenant_id, events.DEPOSIT_CREDITED, _deposit())
    (delivery,) = pipeline.wait_status(envelope["id"], SUCCEEDED, timeout=30)
    hits = rx.hits("/as-sent")
    assert len(hits) == 2
    # When support reads the delivery through the API
    app = create_app(context=pipeline.ctx)
    response = app.test_client().get(
        f"/v1/webhook-deliveries/{delivery.id}", headers=tenant.headers
    )
    detail = response.get_json()["webhookDelivery"]
    # Then the body is the exact bytes sent, and each attempt's headers are exactly the
    # ones its request carried (the timestamp and signature of that attempt included)
    assert detail["requestBody"].encode() == hits[0].body == hits[1].body
    for attempt, hit in zip(detail["attempts"], hits, strict=True):
        sent = attempt["requestHeaders"]
        assert sent == {name: hit.headers[name.lower()] for name in sent}, (sent, hit.headers)
        assert {"x-service-signature", "x-service-timestamp", "x-service-delivery-id"} <= set(sent)
        assert signing.verify(secret, sent, hit.body, tolerance=3600)


def test_unsubscribed_types_and_other_tenants_get_nothing(pipeline: Pipeline, rx: Receiver) -> None:
    # Given an endpoint subscribed to deposit.failed only
    tenant_id = _tenant(pipeline.db)
    pipeline.endpoint(tenant_id, rx.url("/only-failed"), [events.DEPOSIT_FAILED])
    # When another type and another tenant's deposit.failed are emitted, then ours
    other = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    foreign = pipeline.emit(_tenant(pipeline.db), events.DEPOSIT_FAILED, _deposit())
    mine = pipeline.emit(tenant_id, events.DEPOSIT_FAILED, _deposit())
    # Then only ours arrives
    pipeline.wait_status(mine["id"], SUCCEEDED)
    assert [json.loads(h.body)["id"] for h in rx.hits("/only-failed")] == [mine["id"]]
    assert pipeline.deliveries(other["id"]) == [] and pipeline.deliveries(foreign["id"]) == []


def test_deleted_and_disabled_endpoints_get_no_delivery(pipeline: Pipeline, rx: Receiver) -> None:
    # Given three endpoints subscribed to deposit.credited: live, then deleted, then disabled
    tenant_id = _tenant(pipeline.db)
    live, _ = pipeline.endpoint(tenant_id, rx.url("/live"), [events.DEPOSIT_CREDITED])
    deleted, _ = pipeline.endpoint(tenant_id, rx.url("/deleted"), [events.DEPOSIT_CREDITED])
    disabled, _ = pipeline.endpoint(tenant_id, rx.url("/disabled"), [events.DEPOSIT_CREDITED])
    with pipeline.db.transaction() as session:
        gone = webhook_endpoints.get_endpoint(session, tenant_id, deleted)
        webhook_endpoints.delete_endpoint(session, gone)
        off = webhook_endpoints.get_endpoint(session, tenant_id, disabled)
        webhook_endpoints.set_status(off, DISABLED)
    # When core emits an event of that type (relay -> RabbitMQ -> the consumer's fan-out)
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then the consumer made one delivery to the live endpoint, and only it was called;
    # the disabled one's is kept, skipped (enabling it sends it); the deleted one has none
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    made = {d.endpoint_id: d.status for d in pipeline.deliveries(envelope["id"])}
    assert made == {live: SUCCEEDED, disabled: SKIPPED}
    assert rx.hits("/deleted") == [] and rx.hits("/disabled") == []


def test_rotation_overlap_signs_with_new_then_old(pipeline: Pipeline, rx: Receiver) -> None:
    # Given an endpoint whose secret was rotated with a one-hour overlap
    tenant_id = _tenant(pipeline.db)
    endpoint_id, old = pipeline.endpoint(tenant_id, rx.url("/rotated"), [events.DEPOSIT_CREDITED])
    new = pipeline.rotate(endpoint_id, overlap_s=3600)
    # When an event is delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    (hit,) = rx.hits("/rotated")
    # Then the header is v1=<new>,v1=<old> and both secrets verify
    ts = int(hit.headers["x-service-timestamp"])
    assert hit.headers["x-service-signature"] == (
        f"v1={signing.compute(new, ts, hit.body)},v1={signing.compute(old, ts, hit.body)}"
    )
    signing.verify(new, hit.headers, hit.body)
    signing.verify(old, hit.headers, hit.body)


def test_receiver_failing_then_recovering_is_retried_until_success(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given a receiver that answers 500 twice, then 200
    rx.script("/flaky", Answer.fail(500), Answer.fail(503, b"busy"), Answer.ok())
    tenant_id = _tenant(pipeline.db)
    endpoint_id, secret = pipeline.endpoint(tenant_id, rx.url("/flaky"), [events.DEPOSIT_CREDITED])
    # When an event is delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then it is retried on the schedule and succeeds on the third attempt
    (delivery,) = pipeline.wait_status(envelope["id"], SUCCEEDED, timeout=15)
    attempts = pipeline.attempts(delivery.id)
    assert [(a.number, a.response_status, a.error) for a in attempts] == [
        (1, 500, "http_500"),
        (2, 503, "http_503"),
        (3, 200, None),
    ]
    assert attempts[1].response_body == "busy"
    hits = rx.hits("/flaky")
    assert len(hits) == 3 and len({h.body for h in hits}) == 1
    assert len({h.headers["x-service-delivery-id"] for h in hits}) == 1
    for hit in hits:
        signing.verify(secret, hit.headers, hit.body)
    # The gaps follow the schedule (0.2 s, then 0.5 s, each +-20 %)
    gaps = [b.received_at - a.received_at for a, b in itertools.pairwise(hits)]
    assert gaps[0] >= 0.15 and gaps[1] >= 0.38
    # And the endpoint's failure streak is over
    assert pipeline.endpoint_row(endpoint_id).failing_since is None


def test_a_response_body_with_nul_bytes_is_recorded(pipeline: Pipeline, rx: Receiver) -> None:
    # Given a receiver whose answers contain NUL bytes (PostgreSQL text refuses them)
    rx.script("/nul", Answer.fail(500, b"bad\x00news"), Answer.ok(body=b"ok\x00"))
    tenant_id = _tenant(pipeline.db)
    pipeline.endpoint(tenant_id, rx.url("/nul"), [events.DEPOSIT_CREDITED])
    # When an event is delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then both attempts are recorded (not re-sent unrecorded each lease) and it succeeds
    (delivery,) = pipeline.wait_status(envelope["id"], SUCCEEDED, timeout=15)
    attempts = pipeline.attempts(delivery.id)
    assert [(a.number, a.response_status, a.response_body) for a in attempts] == [
        (1, 500, "bad\ufffdnews"),
        (2, 200, "ok\ufffd"),
    ]
    assert len(rx.hits("/nul")) == 2


def test_timeouts_are_failures_and_retried(pipeline: Pipeline, rx: Receiver) -> None:
    # Given a receiver that hangs past the 1 s timeout once, then answers
    rx.script("/slow", Answer.hang(2.5), Answer.ok())
    tenant_id = _tenant(pipeline.db)
    pipeline.endpoint(tenant_id, rx.url("/slow"), [events.DEPOSIT_CREDITED])
    # When an event is delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then the first attempt is a timeout, the retry succeeds
    (delivery,) = pipeline.wait_status(envelope["id"], SUCCEEDED, timeout=15)
    first, second = pipeline.attempts(delivery.id)
    assert first.error == "timeout" and first.response_status is None
    assert 900 <= (first.latency_ms or 0) < 2400
    assert second.response_status == 200


def test_connection_refused_exhausts_the_schedule_then_fails(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given an endpoint on a port where nothing listens
    dead_url = closed_port_url()
    tenant_id = _tenant(pipeline.db)
    endpoint_id, _ = pipeline.endpoint(tenant_id, dead_url, [events.DEPOSIT_CREDITED])
    # When an event is delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then 1 + 3 retries are made, all refused, and the delivery ends failed
    (delivery,) = pipeline.wait_status(envelope["id"], FAILED, timeout=15)
    attempts = pipeline.attempts(delivery.id)
    assert [a.error for a in attempts] == ["connection_refused"] * 4
    assert delivery.attempt_count == 4 and delivery.next_attempt_at is None
    assert delivery.last_error == "connection_refused" and delivery.lease_until is None
    # And the endpoint records when its failure streak began
    assert pipeline.endpoint_row(endpoint_id).failing_since is not None


def test_redirects_are_not_followed(pipeline: Pipeline, rx: Receiver) -> None:
    # Given a receiver that redirects to another path of its own
    rx.script("/moved", Answer.redirect(rx.url("/target")))
    tenant_id = _tenant(pipeline.db)
    pipeline.endpoint(tenant_id, rx.url("/moved"), [events.DEPOSIT_CREDITED])
    # When an event is delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then each attempt is a failed 302 and the target is never called
    (delivery,) = pipeline.wait_status(envelope["id"], FAILED, timeout=15)
    assert {a.error for a in pipeline.attempts(delivery.id)} == {"http_302"}
    assert rx.hits("/target") == []


def test_retry_after_is_honoured(pipeline: Pipeline, rx: Receiver) -> None:
    # Given a receiver that answers 429 Retry-After: 2 once (the schedule says 0.2 s)
    rx.script("/limited", Answer.retry_after(2), Answer.ok())
    tenant_id = _tenant(pipeline.db)
    pipeline.endpoint(tenant_id, rx.url("/limited"), [events.DEPOSIT_CREDITED])
    # When an event is delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    # Then the retry waits for the receiver's 2 s
    pipeline.wait_status(envelope["id"], SUCCEEDED, timeout=15)
    first, second = rx.hits("/limited")
    assert second.received_at - first.received_at >= 1.9


def test_the_same_message_twice_makes_one_event_and_one_delivery(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given an endpoint, and an event published to the bus twice (a relay crash replay)
    tenant_id = _tenant(pipeline.db)
    pipeline.endpoint(tenant_id, rx.url("/dup"), [events.DEPOSIT_SOURCE_SEEN])
    envelope = events.envelope(
        events.DEPOSIT_SOURCE_SEEN,
        tenant_id,
        _deposit(),
        event_id=events.durable_event_id(f"dep_{uuid.uuid4().hex[:12]}", "source_seen"),
    )
    body = events.encode(envelope)
    publisher = RabbitPublisher(AMQP_URL, pipeline.names)
    try:
        publisher.publish(envelope["id"], envelope["type"], body)
        publisher.publish(envelope["id"], envelope["type"], body)
    finally:
        publisher.close()
    # Then there is one delivery and the receiver gets the event once
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    time.sleep(0.5)  # room for a wrong second delivery to show up
    assert len(pipeline.deliveries(envelope["id"])) == 1
    assert len(rx.hits("/dup")) == 1


def test_a_malformed_message_is_dead_lettered_and_the_consumer_goes_on(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given garbage published to the events exchange
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        channel.basic_publish(pipeline.names.exchange, events.DEPOSIT_CREDITED, b"{not json")
        # Then it lands in the dead-letter queue
        wait_until(
            lambda: (
                channel.queue_declare(
                    pipeline.names.notifier_dead_queue, passive=True
                ).method.message_count
                >= 1
            ),
            10,
            "the malformed message in the dead-letter queue",
        )
    finally:
        connection.close()
    # And the consumer still delivers good events
    tenant_id = _tenant(pipeline.db)
    pipeline.endpoint(tenant_id, rx.url("/after-garbage"), [events.DEPOSIT_CREDITED])
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    pipeline.wait_status(envelope["id"], SUCCEEDED)


def test_a_hanging_endpoint_does_not_hold_up_another(pipeline: Pipeline, rx: Receiver) -> None:
    # Given one tenant endpoint that hangs past the 1 s timeout and another that answers
    rx.script("/hang", Answer.hang(3))
    tenant_id = _tenant(pipeline.db)
    pipeline.endpoint(tenant_id, rx.url("/hang"), [events.DEPOSIT_SOURCE_SEEN])
    pipeline.endpoint(tenant_id, rx.url("/fast"), [events.DEPOSIT_CREDITED])
    # When a burst for the hanging one is being attempted (more events than worker threads)
    for n in range(12):
        pipeline.emit(tenant_id, events.DEPOSIT_SOURCE_SEEN, _deposit(n))
    assert rx.wait_for(lambda r: len(r.hits("/hang")) >= 2, 5)
    started = time.time()
    fast = [pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit(n)) for n in range(5)]
    # Then the fast endpoint gets every event promptly: without the per-endpoint limit,
    # every worker thread would be waiting out the hanging endpoint's timeout
    assert rx.wait_for(lambda r: len(r.hits("/fast")) >= 5, 5)
    slowest = max(h.received_at for h in rx.hits("/fast")) - started
    # Held up, it would wait out the 1 s timeout; below that with room for a busy machine
    assert slowest < 0.9, f"the fast endpoint waited {slowest:.2f}s"
    for envelope in fast:
        pipeline.wait_status(envelope["id"], SUCCEEDED)
    # And the hanging endpoint never had more than its 2 slots busy at once: a slot is
    # held for the whole 1 s timeout, so no 0.9 s window saw more than 2 requests
    times = sorted(h.received_at for h in rx.hits("/hang"))
    assert max(sum(1 for t in times if s <= t < s + 0.9) for s in times) <= 2


def test_blocked_addresses_are_refused_at_send_time(rx: Receiver) -> None:
    # Given a production sender (private addresses refused)
    sender = Sender(timeout_s=1.0, allow_private=False)
    headers = {"Content-Type": "application/json"}
    # When it is asked to send to loopback by IP, by name, or over plain http
    by_ip = sender.send(f"https://127.0.0.1:{rx.port}/x", b"{}", headers)
    by_name = sender.send(f"https://localhost:{rx.port}/x", b"{}", headers)
    plain = sender.send(f"http://example.com:{rx.port}/x", b"{}", headers)
    # Then nothing is sent and the attempt error says why
    assert by_ip.error == "blocked_address" and by_ip.status is None
    assert by_name.error == "blocked_address"
    assert plain.error == "invalid_url"
    assert rx.hits() == []


def test_an_endpoint_failing_long_enough_is_disabled(pipeline: Pipeline, rx: Receiver) -> None:
    # Given an endpoint whose attempts have all failed for longer than disable_after_s,
    # and another endpoint of the tenant subscribed to webhook.endpoint_disabled
    rx.script("/down", Answer.fail(500))
    tenant_id = _tenant(pipeline.db)
    endpoint_id, _ = pipeline.endpoint(tenant_id, rx.url("/down"), [events.DEPOSIT_CREDITED])
    pipeline.endpoint(tenant_id, rx.url("/ops"), [events.WEBHOOK_ENDPOINT_DISABLED])
    streak_began = utcnow() - timedelta(seconds=pipeline.ctx.config.disable_after_s + 60)
    with pipeline.db.transaction() as session:
        session.execute(
            sa.update(Endpoint).where(Endpoint.id == endpoint_id).values(failing_since=streak_began)
        )
    # When one more attempt fails
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    wait_until(
        lambda: pipeline.endpoint_row(endpoint_id).status == DISABLED, 10, "endpoint disabled"
    )
    # Then the endpoint is disabled as failing, its streak kept
    row = pipeline.endpoint_row(endpoint_id)
    assert row.disabled_reason == "failing" and row.failing_since == streak_began
    # And its delivery is skipped at the next try (kept for when it is enabled again)
    # instead of running out the schedule
    (delivery,) = pipeline.wait_status(envelope["id"], SKIPPED, timeout=10)
    assert delivery.last_error == "endpoint_disabled" and delivery.attempt_count == 1
    assert len(rx.hits("/down")) == 1
    # And the tenant's other endpoint is told, with the reason
    assert rx.wait_for(lambda r: len(r.hits("/ops")) == 1, 10)
    notice = json.loads(rx.hits("/ops")[0].body)
    assert notice["type"] == events.WEBHOOK_ENDPOINT_DISABLED
    assert notice["data"]["reason"] == "failing"
    assert notice["data"]["webhookEndpoint"]["id"] == endpoint_id


def test_a_success_ends_the_failure_streak(pipeline: Pipeline, rx: Receiver) -> None:
    # Given an endpoint that has been failing for a while (not yet long enough)
    tenant_id = _tenant(pipeline.db)
    endpoint_id, _ = pipeline.endpoint(tenant_id, rx.url("/back"), [events.DEPOSIT_CREDITED])
    with pipeline.db.transaction() as session:
        session.execute(
            sa.update(Endpoint)
            .where(Endpoint.id == endpoint_id)
            .values(failing_since=utcnow() - timedelta(hours=1))
        )
    # When a delivery succeeds
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    # Then the streak is over
    assert pipeline.endpoint_row(endpoint_id).failing_since is None
