"""What receivers ask for, end to end: wildcard subscriptions and Standard Webhooks.

Real PostgreSQL, real RabbitMQ (names unique to this module), real HTTP receivers on
127.0.0.1: outbox -> relay -> RabbitMQ -> consumer's fan-out -> worker -> receiver.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import standardwebhooks
import svix.webhooks

from services.notifier.app import create_app
from services.notifier.models import SUCCEEDED, Endpoint
from shared import events, signing
from tests.conftest import make_tenant
from tests.support.pipeline import Pipeline, isolated_database, running_pipeline, wait_until
from tests.support.receiver import Receiver
from tests.support.services import require_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with isolated_database("receivers") as url, running_pipeline(url) as running:
        yield running


@pytest.fixture
def rx() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


def _data() -> dict[str, object]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:10]}", "amount": "1.00"}}


def test_star_receives_every_type_and_deposit_star_only_deposit_events(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given one endpoint subscribed to "*" and one to "deposit.*"
    tenant_id = make_tenant(pipeline.db).tenant_id
    pipeline.endpoint(tenant_id, rx.url("/all"), ["*"])
    pipeline.endpoint(tenant_id, rx.url("/deposits"), ["deposit.*"])
    # When one event of every type in the catalog is emitted
    sent = [pipeline.emit(tenant_id, t, _data()) for t in events.EVENT_TYPES]
    deposit_types = [t for t in events.EVENT_TYPES if t.startswith("deposit.")]
    for envelope in sent:
        count = 2 if envelope["type"] in deposit_types else 1
        pipeline.wait_status(envelope["id"], SUCCEEDED, count=count, timeout=30)
    # Then "*" received every type, and "deposit.*" exactly the deposit ones
    wait_until(lambda: len(rx.hits("/all")) >= len(events.EVENT_TYPES), 10, "all hits")
    everything = sorted(json.loads(h.body)["type"] for h in rx.hits("/all"))
    assert everything == sorted(events.EVENT_TYPES)
    deposits = sorted(json.loads(h.body)["type"] for h in rx.hits("/deposits"))
    assert deposits == sorted(deposit_types)
    assert "deposit.account.created" in deposits and "webhook.test" not in deposits


# -- Standard Webhooks --------------------------------------------------------------


def _standard_verifiers(secret: str) -> list[tuple[str, Any]]:
    """The libraries receivers use, unchanged: each `verify(body, headers)` raises on a
    forgery."""
    return [
        ("standardwebhooks", standardwebhooks.Webhook(secret)),
        ("svix", svix.webhooks.Webhook(secret)),
    ]


def _verified_by_libraries(secret: str, hit: Any) -> None:
    headers = dict(hit.headers)
    for name, verifier in _standard_verifiers(secret):
        try:
            verifier.verify(hit.body, headers)
        except Exception as err:  # each library has its own error class
            raise AssertionError(f"{name} refused a delivery signed with {secret!r}") from err


def _refused_by_libraries(secret: str, hit: Any) -> None:
    headers = dict(hit.headers)
    for name, verifier in _standard_verifiers(secret):
        with pytest.raises(Exception, match=r"(?i)signature|match"):
            verifier.verify(hit.body, headers)
        assert name


def test_a_standard_endpoint_is_verified_by_the_standard_libraries_unchanged(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given an endpoint with signatureScheme "standard"
    tenant_id = make_tenant(pipeline.db).tenant_id
    _, secret = pipeline.endpoint(
        tenant_id, rx.url("/std"), ["deposit.*"], signature_scheme=signing.STANDARD
    )
    assert secret.startswith("whsec_")
    # When a deposit event is delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _data())
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    (hit,) = rx.hits("/std")
    # Then it carries Standard Webhooks' headers, the message id being the event id
    assert hit.headers["webhook-id"] == envelope["id"]
    assert hit.headers["webhook-timestamp"] == hit.headers["x-service-timestamp"]
    assert re.fullmatch(r"v1,[A-Za-z0-9+/]{43}=", hit.headers["webhook-signature"])
    # And the standardwebhooks and svix verifiers accept it with the secret from creation
    _verified_by_libraries(secret, hit)
    # And today's headers are still there and verify as before
    signing.verify(secret, hit.headers, hit.body)
    # And a byte changed in the body is refused by both libraries
    tampered = dataclasses.replace(hit, body=hit.body.replace(b"1.00", b"9.00"))
    _refused_by_libraries(secret, tampered)


def test_rotation_overlap_signs_with_both_secrets_in_both_schemes(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given a standard endpoint whose secret was rotated with an hour of overlap
    tenant_id = make_tenant(pipeline.db).tenant_id
    endpoint_id, old = pipeline.endpoint(
        tenant_id, rx.url("/rot"), ["*"], signature_scheme=signing.STANDARD
    )
    new = pipeline.rotate(endpoint_id, overlap_s=3600)
    # When an event is delivered during the overlap
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_FAILED, _data())
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    (hit,) = rx.hits("/rot")
    # Then both schemes carry one signature per secret, newest first
    ts = int(hit.headers["webhook-timestamp"])
    assert hit.headers["webhook-signature"] == " ".join(
        f"v1,{signing.compute_standard(s, envelope['id'], ts, hit.body)}" for s in (new, old)
    )
    assert hit.headers["x-service-signature"].count("v1=") == 2
    # And receivers holding either secret accept it, with either library or ours
    for secret in (new, old):
        _verified_by_libraries(secret, hit)
        signing.verify(secret, hit.headers, hit.body)


def test_a_cut_over_rotation_leaves_the_old_secret_refused(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given a standard endpoint rotated with no overlap (a leaked secret)
    tenant_id = make_tenant(pipeline.db).tenant_id
    endpoint_id, old = pipeline.endpoint(
        tenant_id, rx.url("/cut"), ["*"], signature_scheme=signing.STANDARD
    )
    new = pipeline.rotate(endpoint_id, overlap_s=0)
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_FAILED, _data())
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    (hit,) = rx.hits("/cut")
    # Then the new secret verifies and the old one is refused by both libraries
    _verified_by_libraries(new, hit)
    _refused_by_libraries(old, hit)
    assert " " not in hit.headers["webhook-signature"]


def test_a_settle_endpoint_sends_todays_headers_only(pipeline: Pipeline, rx: Receiver) -> None:
    tenant_id = make_tenant(pipeline.db).tenant_id
    _, secret = pipeline.endpoint(tenant_id, rx.url("/ours"), ["deposit.credited"])
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _data())
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    (hit,) = rx.hits("/ours")
    assert not [name for name in hit.headers if name.startswith("webhook-")]
    signing.verify(secret, hit.headers, hit.body)


def test_the_api_sets_the_scheme_and_shows_the_standard_headers_as_sent(
    pipeline: Pipeline, rx: Receiver
) -> None:
    tenant = make_tenant(pipeline.db)
    client = create_app(context=pipeline.ctx).test_client()
    # Given an endpoint created through the API (the default scheme is "settle")
    created = client.post(
        "/v1/webhook-endpoints",
        json={"name": "std", "url": rx.url("/api-std"), "eventTypes": ["*"]},
        headers=tenant.headers,
    ).get_json()
    endpoint, secret = created["webhookEndpoint"], created["secret"]
    assert endpoint["signatureScheme"] == "settle"
    path = f"/v1/webhook-endpoints/{endpoint['id']}"
    # When bad schemes are asked for, they are 400s naming the field; nothing changes
    for bad in ("Standard", "svix", "", 1, None):
        refused = client.patch(path, json={"signatureScheme": bad}, headers=tenant.headers)
        assert refused.status_code == 400, (bad, refused.get_json())
        assert "signatureScheme" in refused.get_json()["error"]
    # When PATCH switches it to "standard", then an event is delivered
    patched = client.patch(path, json={"signatureScheme": "standard"}, headers=tenant.headers)
    assert patched.get_json()["webhookEndpoint"]["signatureScheme"] == "standard"
    envelope = pipeline.emit(tenant.tenant_id, events.DEPOSIT_CREDITED, _data())
    (delivery,) = pipeline.wait_status(envelope["id"], SUCCEEDED)
    (hit,) = rx.hits("/api-std")
    _verified_by_libraries(secret, hit)
    # Then the delivery's log shows the Standard Webhooks headers exactly as sent
    detail = client.get(f"/v1/webhook-deliveries/{delivery.id}", headers=tenant.headers).get_json()[
        "webhookDelivery"
    ]
    (attempt,) = detail["attempts"]
    sent = attempt["requestHeaders"]
    assert {"webhook-id", "webhook-timestamp", "webhook-signature"} <= set(sent)
    assert sent == {name: hit.headers[name.lower()] for name in sent}


def test_a_secret_made_before_the_standard_scheme_must_be_rotated_first(
    pipeline: Pipeline,
) -> None:
    # Given an endpoint whose secret has the old form (URL-safe base64, no padding)
    tenant = make_tenant(pipeline.db)
    client = create_app(context=pipeline.ctx).test_client()
    endpoint_id, _ = pipeline.endpoint(tenant.tenant_id, "https://hooks.example.com/x", ["*"])
    legacy = "whsec_" + secrets.token_urlsafe(32)
    assert not signing.is_standard_readable(legacy)
    with pipeline.db.transaction() as session:
        row = session.get_one(Endpoint, endpoint_id)
        row.secret_encrypted = pipeline.ctx.secret_box.encrypt(legacy)
    path = f"/v1/webhook-endpoints/{endpoint_id}"
    # When it is switched to "standard", it is a 409 that says to rotate first
    refused = client.patch(path, json={"signatureScheme": "standard"}, headers=tenant.headers)
    assert refused.status_code == 409 and "rotate" in refused.get_json()["error"]
    assert pipeline.endpoint_row(endpoint_id).signature_scheme == "settle"
    # And after a rotation (the new secret in whsec_<base64> form) it is accepted
    rotated = pipeline.rotate(endpoint_id, overlap_s=60)
    assert signing.is_standard_readable(rotated)
    switched = client.patch(path, json={"signatureScheme": "standard"}, headers=tenant.headers)
    assert switched.status_code == 200, switched.get_json()
