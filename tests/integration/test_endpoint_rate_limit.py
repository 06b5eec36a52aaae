"""`rateLimitPerSecond`: an endpoint's own cap on how fast deliveries come.

The API on the real PostgreSQL (the field, its validation); the pipeline test
(RabbitMQ, a receiver on 127.0.0.1) checks the pace the receiver sees.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from services.notifier.models import SUCCEEDED, Endpoint
from shared import events
from tests.conftest import TenantKeys, make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
)
from tests.support.pipeline import Pipeline, isolated_database, running_pipeline
from tests.support.receiver import Receiver
from tests.support.services import require_service

pytestmark = pytest.mark.integration
ENDPOINTS = "/v1/webhook-endpoints"


def test_the_rate_limit_is_set_shown_changed_and_removed(
    notifier_client: FlaskClient, tenant: TenantKeys
) -> None:
    # Given an endpoint made with a rate limit
    endpoint, _ = make_endpoint(notifier_client, tenant, rateLimitPerSecond=2.5)
    assert endpoint["rateLimitPerSecond"] == 2.5
    # When it is changed, then removed (null)
    changed = notifier_client.patch(
        f"{ENDPOINTS}/{endpoint['id']}", json={"rateLimitPerSecond": 10}, headers=tenant.headers
    )
    removed = notifier_client.patch(
        f"{ENDPOINTS}/{endpoint['id']}", json={"rateLimitPerSecond": None}, headers=tenant.headers
    )
    # Then each answer shows it, and an endpoint made without one has null
    assert changed.get_json()["webhookEndpoint"]["rateLimitPerSecond"] == 10
    assert removed.get_json()["webhookEndpoint"]["rateLimitPerSecond"] is None
    plain, _ = make_endpoint(notifier_client, tenant)
    assert plain["rateLimitPerSecond"] is None


@pytest.mark.parametrize("value", [0, -1, 0.001, 1001, "5", True, float("inf")])
def test_a_bad_rate_limit_is_a_400_naming_the_field(
    notifier_client: FlaskClient, tenant: TenantKeys, value: object
) -> None:
    body = {
        "name": "x",
        "url": "https://hooks.example.com/x",
        "eventTypes": [events.DEPOSIT_CREDITED],
        "rateLimitPerSecond": value,
    }
    response = notifier_client.post(
        ENDPOINTS,
        data=json.dumps(body).replace("Infinity", "1e999"),
        headers={**tenant.headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.get_json()
    assert "rateLimitPerSecond" in str(response.get_json())


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with isolated_database("rate_limit") as url, running_pipeline(url) as running:
        yield running


def test_deliveries_come_no_faster_than_the_endpoint_asks(pipeline: Pipeline) -> None:
    with Receiver() as rx:
        # Given an endpoint that asks for at most 4 deliveries a second
        tenant_id = make_tenant(pipeline.db).tenant_id
        endpoint_id, _ = pipeline.endpoint(tenant_id, rx.url("/paced"), [events.DEPOSIT_CREDITED])
        with pipeline.db.transaction() as session:
            session.get_one(Endpoint, endpoint_id).rate_limit_per_second = 4.0
        # When 12 events arrive at once
        sent = [
            pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, {"n": n, "id": uuid.uuid4().hex})
            for n in range(12)
        ]
        for envelope in sent:
            pipeline.wait_status(envelope["id"], SUCCEEDED, timeout=20)
        # Then every one arrives, and no second saw more than 4 (plus the first burst)
        times = sorted(h.received_at for h in rx.hits("/paced"))
        assert len(times) == 12
        busiest = max(sum(1 for t in times if s <= t < s + 1.0) for s in times)
        assert busiest <= 5, times
        assert times[-1] - times[0] >= 1.5
