"""POST /v1/webhook-endpoints/<id>/test with `eventType`: the catalog's example of that type.

The portal's event catalog has a "Send example" button for every type; it is this
route. What arrives must be a body of that type a receiver can parse against the
catalog's schema, under a fresh event id (never the example's, never a durable
`evt_dep_...` one a receiver might already have), for the caller's tenant, to that
endpoint alone, whatever the endpoint subscribes to.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from shared import event_catalog, events
from shared.db import Database
from tests.conftest import make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    EnqueueRecorder,
    enqueued_fixture,
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
)
from tests.support.catalog import conforming

pytestmark = pytest.mark.integration

ENDPOINTS = "/v1/webhook-endpoints"
DELIVERIES = "/v1/webhook-deliveries"


def sent_event(client: FlaskClient, headers: dict[str, str], delivery_id: str) -> dict[str, Any]:
    shown = client.get(f"{DELIVERIES}/{delivery_id}", headers=headers)
    assert shown.status_code == 200, shown.get_json()
    event: dict[str, Any] = shown.get_json()["webhookDelivery"]["event"]
    return event


@pytest.mark.parametrize("event_type", events.EVENT_TYPES)
def test_an_example_of_each_type_goes_to_that_endpoint_alone(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder, event_type: str
) -> None:
    # Given an endpoint subscribed to webhook.test only, and another of the same tenant
    tenant = make_tenant(pg_db)
    target, _ = make_endpoint(notifier_client, tenant, eventTypes=[events.WEBHOOK_TEST])
    make_endpoint(notifier_client, tenant, eventTypes=list(events.EVENT_TYPES))
    # When an example of `event_type` is sent to the first
    response = notifier_client.post(
        f"{ENDPOINTS}/{target['id']}/test", json={"eventType": event_type}, headers=tenant.headers
    )
    # Then one delivery of that type, to that endpoint alone, is made and handed over
    assert response.status_code == 200, response.get_json()
    delivery = response.get_json()["webhookDelivery"]
    assert (delivery["endpointId"], delivery["eventType"]) == (target["id"], event_type)
    assert enqueued.calls[-1] == [delivery["id"]]
    listed = notifier_client.get(
        f"{DELIVERIES}?eventId={delivery['eventId']}", headers=tenant.headers
    ).get_json()["webhookDeliveries"]
    assert [d["id"] for d in listed] == [delivery["id"]]
    # And its body is the catalog's example of that type (it conforms to the schema),
    # for this tenant, under a fresh id
    event = conforming(sent_event(notifier_client, tenant.headers, delivery["id"]))
    example = event_catalog.get(event_type).example
    assert (event["type"], event["tenantId"]) == (event_type, tenant.tenant_id)
    if event_type != events.WEBHOOK_TEST:
        # the example's data, with every object id one no real object has (issue 23)
        assert event["data"] == _same_ids(example["data"], event["data"])
        assert event["data"] != example["data"] or not _ids(example["data"])
        assert all("_example_" in i for i in _ids(event["data"]))
    assert event["id"] != example["id"] and event["id"].startswith("evt_test_")
    # And it is marked a test: never money
    assert event["livemode"] is False


def _ids(value: Any) -> list[str]:
    """Every object id (`dep_...`, `acc_...`) in an event's data."""
    if isinstance(value, dict):
        return [i for v in value.values() for i in _ids(v)]
    if isinstance(value, list):
        return [i for v in value for i in _ids(v)]
    if isinstance(value, str) and re.match(r"^[a-z]+_(example_)?[0-9A-HJKMNP-TV-Z]{26}$", value):
        return [value]
    return []


def _same_ids(example: Any, sent: Any) -> Any:
    """`example` with each object id replaced by the one `sent` has in its place."""
    if isinstance(example, dict):
        return {
            k: _same_ids(v, sent.get(k) if isinstance(sent, dict) else None)
            for k, v in example.items()
        }
    if isinstance(example, list):
        return [_same_ids(v, s) for v, s in zip(example, sent or [], strict=False)]
    if _ids(example) and isinstance(sent, str):
        return sent
    return example


def test_two_examples_of_one_type_are_two_events(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder
) -> None:
    tenant = make_tenant(pg_db)
    target, _ = make_endpoint(notifier_client, tenant, eventTypes=[events.WEBHOOK_TEST])
    ids = set()
    for _ in range(2):
        response = notifier_client.post(
            f"{ENDPOINTS}/{target['id']}/test",
            json={"eventType": events.DEPOSIT_CREDITED},
            headers=tenant.headers,
        )
        assert response.status_code == 200, response.get_json()
        ids.add(response.get_json()["webhookDelivery"]["eventId"])
    assert len(ids) == 2


@pytest.mark.parametrize(
    "body",
    [
        {"eventType": "deposit.nope"},
        {"eventType": ""},
        {"eventType": 7},
        {"eventType": ["deposit.credited"]},
        {"eventType": "x" * 10_000},
        {"eventType": "deposit.credited", "extra": 1},
        ["deposit.credited"],
        "deposit.credited",
    ],
)
def test_a_bad_example_request_is_400_and_sends_nothing(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder, body: Any
) -> None:
    tenant = make_tenant(pg_db)
    target, _ = make_endpoint(notifier_client, tenant, eventTypes=[events.WEBHOOK_TEST])
    before = len(enqueued.calls)
    response = notifier_client.post(
        f"{ENDPOINTS}/{target['id']}/test", json=body, headers=tenant.headers
    )
    assert response.status_code == 400, response.get_json()
    error = response.get_json()
    assert error["code"] in ("invalid_request", "invalid_json"), error
    assert len(error["error"]) < 2000  # a huge type is never echoed back whole
    assert len(enqueued.calls) == before
    listed = notifier_client.get(
        f"{DELIVERIES}?endpointId={target['id']}", headers=tenant.headers
    ).get_json()["webhookDeliveries"]
    assert listed == []


def test_without_a_type_it_is_still_webhook_test(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder
) -> None:
    tenant = make_tenant(pg_db)
    target, _ = make_endpoint(notifier_client, tenant, eventTypes=[events.WEBHOOK_TEST])
    # No body, an empty object, or a null type: the classic test event
    for kwargs in ({}, {"json": {}}, {"json": {"eventType": None}}):
        response = notifier_client.post(
            f"{ENDPOINTS}/{target['id']}/test", headers=tenant.headers, **kwargs
        )
        assert response.status_code == 200, response.get_json()
        assert response.get_json()["webhookDelivery"]["eventType"] == events.WEBHOOK_TEST
