"""The event catalog as tenants meet it: GET /v1/event-types, the unknown-type error, payloads.

Deposit, account, inventory and provider events are checked against the catalog
wherever a test reads the outbox (`events_of`, `outbox_events`); this module covers
the rest: the endpoint itself, `webhook.test` and `tenant.api_key_revoked`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from services.cli import main
from services.notifier.models import StoredEvent
from shared import event_catalog, events
from shared.db import Database
from shared.identity import service as identity
from tests.conftest import TenantKeys, make_tenant
from tests.integration.conftest import outbox_events
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    enqueued_fixture,
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
)
from tests.support.catalog import catalog_errors, conforming

pytestmark = pytest.mark.integration

ENDPOINTS = "/v1/webhook-endpoints"


def test_event_types_is_public_and_describes_every_type(client: FlaskClient) -> None:
    # When anyone (no API key) asks for the catalog
    response = client.get("/v1/event-types")

    # Then every event type is there, in the interface's order, each with a description,
    # a schema and an example that meets it
    assert response.status_code == 200 and response.mimetype == "application/json"
    body = response.get_json()
    assert list(body) == ["eventTypes", "patterns"]
    listed = body["eventTypes"]
    assert [entry["type"] for entry in listed] == list(events.EVENT_TYPES)
    for entry in listed:
        assert set(entry) == {"type", "description", "schema", "example"}
        assert len(entry["description"]) > 40, entry["type"]
        assert entry["schema"]["properties"]["type"] == {"const": entry["type"]}
        assert catalog_errors(entry["example"]) == [], entry["type"]
    # And the patterns an endpoint may subscribe to, each with what it covers today
    patterns = {p["pattern"]: p["eventTypes"] for p in body["patterns"]}
    assert patterns["*"] == list(events.EVENT_TYPES)
    assert patterns["deposit.*"] == [t for t in events.EVENT_TYPES if t.startswith("deposit.")]


def test_event_types_is_in_the_openapi_document(client: FlaskClient) -> None:
    spec = client.get("/v1/openapi.json").get_json()
    operation = spec["paths"]["/v1/event-types"]["get"]
    assert not operation.get("security"), "the catalog is public"
    schema_ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    schema = spec["components"]["schemas"][schema_ref.rsplit("/", 1)[1]]
    assert list(schema["properties"]) == ["eventTypes", "patterns"]


@pytest.mark.parametrize("bad", ["deposit.*x", "deposit.settled", "", "DEPOSIT.CREDITED"])
def test_an_unknown_event_type_is_refused_with_the_valid_ones(
    notifier_client: FlaskClient, pg_db: Database, bad: str
) -> None:
    # Given a tenant with an endpoint
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)

    # When it subscribes to a type that does not exist, at creation or by PATCH
    created = notifier_client.post(
        ENDPOINTS,
        json={"name": "x", "url": "https://hooks.example.com/a", "eventTypes": [bad]},
        headers=tenant.headers,
    )
    patched = notifier_client.patch(
        f"{ENDPOINTS}/{endpoint['id']}",
        json={"eventTypes": ["deposit.credited", bad]},
        headers=tenant.headers,
    )

    # Then both are 400s that name the field and list every valid type
    for response in (created, patched):
        assert response.status_code == 400, response.get_json()
        body = response.get_json()
        assert body["code"] == "invalid_request"
        assert "eventTypes" in body["error"]
        for event_type in events.EVENT_TYPES:
            assert event_type in body["error"], (event_type, body["error"])
        assert "GET /v1/event-types" in body["error"]


def test_a_test_delivery_carries_what_the_catalog_says(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given an endpoint
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)

    # When a test delivery is asked for
    response = notifier_client.post(f"{ENDPOINTS}/{endpoint['id']}/test", headers=tenant.headers)
    assert response.status_code == 200, response.get_json()

    # Then the stored event (the exact body sent) matches the catalog's webhook.test
    with pg_db.reader() as session:
        body = session.scalars(
            sa.select(StoredEvent.body).where(
                StoredEvent.tenant_id == tenant.tenant_id,
                StoredEvent.event_type == events.WEBHOOK_TEST,
            )
        ).one()
    event = conforming(json.loads(body))
    assert event["data"]["endpointId"] == endpoint["id"]


def test_a_revoked_key_event_carries_what_the_catalog_says(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_url: str,
    pg_db: Database,
    tenant: TenantKeys,
) -> None:
    # Given a second key of the tenant
    with pg_db.transaction() as session:
        issued = identity.create_api_key(session, tenant.tenant_id, ["deposits:read"])
        key_id = issued.record.id

    # When ops revoke it
    monkeypatch.setenv("SETTLE_DATABASE_URL", pg_url)
    monkeypatch.setenv("SETTLE_ENV", "dev")
    assert main(["api-keys", "revoke", key_id]) == 0
    capsys.readouterr()

    # Then its event (read through the catalog check) names the key and the time
    (event,) = outbox_events(pg_db, tenant.tenant_id, events.API_KEY_REVOKED)
    assert event["data"]["apiKeyId"] == key_id


def test_the_catalog_check_catches_an_undocumented_field() -> None:
    # Given a real example body with a field the catalog does not document
    example: dict[str, Any] = event_catalog.get(events.DEPOSIT_CREDITED).example
    example["data"]["deposit"]["surprise"] = 1
    # Then the strict check refuses it (so the checks above can fail)
    assert any("surprise" in error for error in catalog_errors(example))
