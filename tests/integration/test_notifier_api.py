"""The notifier's HTTP API against the real PostgreSQL: endpoints, secrets, the delivery log.

The delivery engine is not running here: `enqueued` records what the API hands it,
and deliveries are put in the states the engine would leave them in.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from services.notifier import deliveries, fanout
from services.notifier.consumer import store_events
from services.notifier.context import NotifierContext
from services.notifier.models import (
    FAILED,
    PENDING,
    RETRYING,
    SKIPPED,
    SUCCEEDED,
    Delivery,
    StoredEvent,
)
from services.notifier.webhook_endpoints import signing_secrets
from shared import events
from shared.db import Database
from shared.timefmt import iso_ms, parse_iso, utcnow
from tests.conftest import make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    PUBLIC_URL,
    EnqueueRecorder,
    add_attempt,
    deliver_event,
    dev_notifier_client_fixture,
    endpoint_row,
    enqueued_fixture,
    load,
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
    update_delivery,
)

pytestmark = pytest.mark.integration

ENDPOINTS = "/v1/webhook-endpoints"
DELIVERIES = "/v1/webhook-deliveries"


def error_of(response: Any) -> tuple[int, str, str]:
    body = response.get_json()
    return response.status_code, body["code"], body["error"]


# -- creation and secrets -----------------------------------------------------------


def test_creation_shows_the_secret_once_and_stores_it_encrypted(
    notifier_client: FlaskClient, pg_db: Database, notifier_context: NotifierContext
) -> None:
    # Given a tenant
    tenant = make_tenant(pg_db)

    # When it registers an endpoint (with a duplicated event type)
    response = notifier_client.post(
        ENDPOINTS,
        json={
            "name": "Ledger",
            "url": PUBLIC_URL,
            "eventTypes": [events.DEPOSIT_CREDITED, events.DEPOSIT_FAILED, events.DEPOSIT_CREDITED],
        },
        headers=tenant.headers,
    )

    # Then the response carries the endpoint and a whsec_ secret
    assert response.status_code == 200
    body = response.get_json()
    assert set(body) == {"webhookEndpoint", "secret"}
    endpoint, secret = body["webhookEndpoint"], body["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    assert endpoint["id"].startswith("we_")
    assert endpoint["eventTypes"] == [events.DEPOSIT_CREDITED, events.DEPOSIT_FAILED]
    assert endpoint["status"] == "enabled" and endpoint["disabledReason"] is None
    assert endpoint["previousSecretExpiresAt"] is None
    assert parse_iso(endpoint["createdAt"]) and endpoint["createdAt"].endswith("Z")
    assert secret not in str(endpoint) and "whsec_" not in str(endpoint)

    # And reading it back never shows the secret
    one = notifier_client.get(f"{ENDPOINTS}/{endpoint['id']}", headers=tenant.headers)
    listed = notifier_client.get(ENDPOINTS, headers=tenant.headers)
    assert one.get_json() == {"webhookEndpoint": endpoint}
    assert listed.get_json()["webhookEndpoints"] == [endpoint]
    assert secret not in one.get_data(as_text=True) + listed.get_data(as_text=True)

    # And the database holds it encrypted, decrypting to the secret shown
    row = endpoint_row(pg_db, endpoint["id"])
    assert secret not in row.secret_encrypted
    assert notifier_context.secret_box.decrypt(row.secret_encrypted) == secret
    assert signing_secrets(row, notifier_context.secret_box) == [secret]


def test_an_idempotent_creation_replays_the_first_response(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given a creation sent with an Idempotency-Key
    tenant = make_tenant(pg_db)
    headers = {**tenant.headers, "Idempotency-Key": "create-1"}
    body = {"name": "Ledger", "url": PUBLIC_URL, "eventTypes": [events.DEPOSIT_CREDITED]}
    first = notifier_client.post(ENDPOINTS, json=body, headers=headers)

    # When it is sent again, and once more with another body
    again = notifier_client.post(ENDPOINTS, json=body, headers=headers)
    other = notifier_client.post(ENDPOINTS, json={**body, "name": "Other"}, headers=headers)

    # Then the retry answers the first response (secret included) and makes nothing new
    assert again.status_code == 200 and again.get_json() == first.get_json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert error_of(other)[:2] == (409, "idempotency_key_reused")
    listed = notifier_client.get(ENDPOINTS, headers=tenant.headers).get_json()
    assert len(listed["webhookEndpoints"]) == 1


VALID = {"name": "Ledger", "url": PUBLIC_URL, "eventTypes": [events.DEPOSIT_CREDITED]}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": None}, "name"),
        ({"url": None}, "url"),
        ({"eventTypes": None}, "eventTypes"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"url": "http://hooks.example.com/x"}, "url"),
        ({"url": "https://127.0.0.1/x"}, "url"),
        ({"url": "https://10.0.0.7/x"}, "url"),
        ({"url": "https://169.254.169.254/x"}, "url"),
        ({"url": "https://[::1]/x"}, "url"),
        ({"url": "https://localhost/x"}, "url"),
        ({"url": "https://u:p@hooks.example.com/"}, "url"),
        ({"url": "https://hooks.example.com/#f"}, "url"),
        ({"url": "https://hooks.example.com/" + "a" * 2048}, "url"),
        ({"url": 5}, "url"),
        ({"eventTypes": []}, "eventTypes"),
        ({"eventTypes": ["deposit.nope"]}, "eventTypes.0"),
        ({"eventTypes": ["nope.*"]}, "eventTypes.0"),
        ({"eventTypes": ["*.credited"]}, "eventTypes.0"),
        ({"eventTypes": ["deposit.credited.*"]}, "eventTypes.0"),
        ({"eventTypes": [events.DEPOSIT_CREDITED, 7]}, "eventTypes.1"),
        ({"eventTypes": "deposit.credited"}, "eventTypes"),
        ({"secret": "whsec_mine"}, "secret"),
    ],
)
def test_bad_creations_are_400_naming_the_field(
    notifier_client: FlaskClient, pg_db: Database, change: dict[str, Any], field: str
) -> None:
    # Given a body with one bad or missing field (None means: left out)
    tenant = make_tenant(pg_db)
    body = {**VALID, **change}
    body = {k: v for k, v in body.items() if v is not None}

    # When it is posted
    response = notifier_client.post(ENDPOINTS, json=body, headers=tenant.headers)

    # Then it is refused with invalid_request naming the field, and nothing is stored
    status, code, message = error_of(response)
    assert (status, code) == (400, "invalid_request"), message
    assert field in response.get_json()["details"]["fields"], message
    assert message.startswith(f"invalid_request: {field}")
    assert (
        notifier_client.get(ENDPOINTS, headers=tenant.headers).get_json()["webhookEndpoints"] == []
    )


def test_patterns_are_kept_as_given_and_expanded_in_receives(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given endpoints subscribed to "*" and to "deposit.*" (and deposit.credited again)
    tenant = make_tenant(pg_db)
    everything, _ = make_endpoint(notifier_client, tenant, eventTypes=["*"])
    deposits, _ = make_endpoint(
        notifier_client, tenant, eventTypes=["deposit.*", events.DEPOSIT_CREDITED]
    )
    # Then each shows its subscription as given and what it receives today
    assert everything["eventTypes"] == ["*"]
    assert everything["receives"] == list(events.EVENT_TYPES)
    assert deposits["eventTypes"] == ["deposit.*", events.DEPOSIT_CREDITED]
    assert deposits["receives"] == [t for t in events.EVENT_TYPES if t.startswith("deposit.")]
    # And PATCH takes patterns too
    path = f"{ENDPOINTS}/{deposits['id']}"
    patched = notifier_client.patch(
        path, json={"eventTypes": ["webhook.*"]}, headers=tenant.headers
    ).get_json()["webhookEndpoint"]
    assert patched["receives"] == [t for t in events.EVENT_TYPES if t.startswith("webhook.")]


def test_bad_json_is_invalid_json(notifier_client: FlaskClient, pg_db: Database) -> None:
    tenant = make_tenant(pg_db)
    response = notifier_client.post(
        ENDPOINTS,
        data="{nope",
        headers={**tenant.headers, "Content-Type": "application/json"},
    )
    assert error_of(response)[:2] == (400, "invalid_json")


def test_dev_mode_admits_http_and_loopback(
    dev_notifier_client: FlaskClient, notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given SETTLE_WEBHOOK_ALLOW_PRIVATE (dev), an http loopback URL is admitted
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(dev_notifier_client, tenant, url="http://127.0.0.1:9000/hook")
    assert endpoint["url"] == "http://127.0.0.1:9000/hook"

    # But the production-like notifier refuses to move it to another private address
    response = notifier_client.patch(
        f"{ENDPOINTS}/{endpoint['id']}",
        json={"url": "http://127.0.0.1:9001/hook"},
        headers=tenant.headers,
    )
    assert error_of(response)[:2] == (400, "invalid_request")


@pytest.mark.parametrize(
    "url",
    [
        "https://\uff11\uff12\uff17.\uff10.\uff10.\uff11/hook",  # fullwidth 127.0.0.1
        "https://169\u3002254\u3002169\u3002254/latest",  # ideographic dots: metadata
        "https://[fec0::1]/hook",  # site-local IPv6
    ],
)
def test_hidden_private_targets_are_refused_at_creation_and_update(
    notifier_client: FlaskClient, pg_db: Database, url: str
) -> None:
    # Given a tenant with a public endpoint
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    # When it registers, or moves the endpoint to, a private address in disguise
    created = notifier_client.post(ENDPOINTS, json={**VALID, "url": url}, headers=tenant.headers)
    moved = notifier_client.patch(
        f"{ENDPOINTS}/{endpoint['id']}", json={"url": url}, headers=tenant.headers
    )
    # Then both are 400 naming the url, and nothing changed
    for response in (created, moved):
        status, code, message = error_of(response)
        assert (status, code) == (400, "invalid_request"), message
        assert "url" in response.get_json()["details"]["fields"]
    listed = notifier_client.get(ENDPOINTS, headers=tenant.headers).get_json()
    assert [e["url"] for e in listed["webhookEndpoints"]] == [endpoint["url"]]


def test_a_tenant_has_at_most_the_endpoint_cap(
    notifier_client: FlaskClient, pg_db: Database, notifier_context: NotifierContext
) -> None:
    # Given a cap of 2 endpoints per tenant and a tenant with 2
    tenant = make_tenant(pg_db)
    cap = notifier_context.max_endpoints_per_tenant
    notifier_context.max_endpoints_per_tenant = 2
    try:
        first, _ = make_endpoint(notifier_client, tenant)
        make_endpoint(notifier_client, tenant)

        # When a third is registered, Then 409 conflict
        third = notifier_client.post(ENDPOINTS, json=VALID, headers=tenant.headers)
        status, code, message = error_of(third)
        assert (status, code) == (409, "conflict") and "at most 2" in message

        # And after deleting one, there is room again
        notifier_client.delete(f"{ENDPOINTS}/{first['id']}", headers=tenant.headers)
        make_endpoint(notifier_client, tenant)
    finally:
        notifier_context.max_endpoints_per_tenant = cap


# -- listing, changing, deleting ----------------------------------------------------


def test_endpoints_are_listed_newest_first_in_pages(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given three endpoints
    tenant = make_tenant(pg_db)
    made = [make_endpoint(notifier_client, tenant, name=f"e{i}")[0]["id"] for i in range(3)]

    # When listed two at a time
    first = notifier_client.get(f"{ENDPOINTS}?limit=2", headers=tenant.headers).get_json()
    second = notifier_client.get(
        f"{ENDPOINTS}?limit=2&cursor={first['nextCursor']}", headers=tenant.headers
    ).get_json()

    # Then the pages cover them all, newest first, and the last page has no cursor
    assert [e["id"] for e in first["webhookEndpoints"]] == made[::-1][:2]
    assert [e["id"] for e in second["webhookEndpoints"]] == made[:1]
    assert first["nextCursor"] and second["nextCursor"] is None

    # And bad paging arguments are 400s naming them
    for query, field in (("limit=0", "limit"), ("limit=201", "limit"), ("cursor=%%%", "cursor")):
        response = notifier_client.get(f"{ENDPOINTS}?{query}", headers=tenant.headers)
        assert error_of(response)[:2] == (400, "invalid_request"), query
        assert field in response.get_json()["details"]["fields"]


def test_patch_changes_any_subset_and_toggles_status(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given an endpoint
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    path = f"{ENDPOINTS}/{endpoint['id']}"

    # When its name, url and event types change
    changed = notifier_client.patch(
        path,
        json={
            "name": "Renamed",
            "url": "https://other.example.com/hook",
            "eventTypes": [events.DEPOSIT_FAILED],
        },
        headers=tenant.headers,
    )

    # Then they are stored and the rest stays
    assert changed.status_code == 200
    after = changed.get_json()["webhookEndpoint"]
    assert (after["name"], after["url"], after["eventTypes"]) == (
        "Renamed",
        "https://other.example.com/hook",
        [events.DEPOSIT_FAILED],
    )
    assert after["createdAt"] == endpoint["createdAt"] and after["status"] == "enabled"
    assert parse_iso(after["updatedAt"]) >= parse_iso(endpoint["updatedAt"])

    # When it is disabled, Then it shows why and gets no new deliveries
    disabled = notifier_client.patch(path, json={"status": "disabled"}, headers=tenant.headers)
    assert disabled.get_json()["webhookEndpoint"]["status"] == "disabled"
    assert disabled.get_json()["webhookEndpoint"]["disabledReason"] == "manual"
    _, made = deliver_event(pg_db, tenant.tenant_id, events.DEPOSIT_FAILED)
    assert made == []

    # When it is enabled again, Then deliveries resume
    enabled = notifier_client.patch(path, json={"status": "enabled"}, headers=tenant.headers)
    assert enabled.get_json()["webhookEndpoint"]["status"] == "enabled"
    assert enabled.get_json()["webhookEndpoint"]["disabledReason"] is None
    _, made = deliver_event(pg_db, tenant.tenant_id, events.DEPOSIT_FAILED)
    assert [d.endpoint_id for d in made] == [endpoint["id"]]

    # And bad patches are 400s
    for body, field in (
        ({}, "body"),
        ({"status": "paused"}, "status"),
        ({"eventTypes": []}, "eventTypes"),
        ({"url": "http://other.example.com/"}, "url"),
        ({"name": None}, "name"),
        ({"colour": "red"}, "colour"),
    ):
        response = notifier_client.patch(path, json=body, headers=tenant.headers)
        assert error_of(response)[:2] == (400, "invalid_request"), body
        assert field in response.get_json()["details"]["fields"], body


def test_delete_is_204_then_404_and_stops_unfinished_deliveries(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given an endpoint with a delivery still retrying
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    _, (delivery,) = deliver_event(pg_db, tenant.tenant_id)
    update_delivery(pg_db, delivery.id, status=RETRYING, attempt_count=2)
    path = f"{ENDPOINTS}/{endpoint['id']}"

    # When it is deleted
    deleted = notifier_client.delete(path, headers=tenant.headers)

    # Then 204 with no body, and it is gone from every route and from fan-out
    assert deleted.status_code == 204 and deleted.get_data() == b""
    for method, suffix in (("get", ""), ("patch", ""), ("delete", ""), ("post", "/test")):
        kwargs: dict[str, Any] = {"json": {"name": "x"}} if method == "patch" else {}
        response = getattr(notifier_client, method)(path + suffix, headers=tenant.headers, **kwargs)
        assert error_of(response)[:2] == (404, "not_found"), (method, suffix)
    assert (
        notifier_client.get(ENDPOINTS, headers=tenant.headers).get_json()["webhookEndpoints"] == []
    )
    assert deliver_event(pg_db, tenant.tenant_id)[1] == []

    # And its unfinished delivery stopped, still visible in the log
    shown = notifier_client.get(f"{DELIVERIES}/{delivery.id}", headers=tenant.headers)
    assert shown.get_json()["webhookDelivery"]["status"] == "failed"
    assert shown.get_json()["webhookDelivery"]["lastError"] == "endpoint_deleted"
    assert shown.get_json()["webhookDelivery"]["nextAttemptAt"] is None


# -- rotation -----------------------------------------------------------------------


def test_rotation_keeps_the_old_secret_24_hours_by_default(
    notifier_client: FlaskClient, pg_db: Database, notifier_context: NotifierContext
) -> None:
    # Given an endpoint whose receivers know its secret
    tenant = make_tenant(pg_db)
    endpoint, old = make_endpoint(notifier_client, tenant)

    # When its secret is rotated with no body at all (it used to cut over at once, so
    # every receiver not yet updated started refusing deliveries)
    before = utcnow()
    response = notifier_client.post(
        f"{ENDPOINTS}/{endpoint['id']}/rotate-secret", headers=tenant.headers
    )

    # Then a new secret is shown, and the old one keeps signing beside it for 24 h
    assert response.status_code == 200
    new = response.get_json()["secret"]
    assert new.startswith("whsec_") and new != old
    shown = response.get_json()["webhookEndpoint"]["previousSecretExpiresAt"]
    expires = parse_iso(shown)
    assert before + timedelta(hours=24) <= expires <= utcnow() + timedelta(hours=24)
    row = endpoint_row(pg_db, endpoint["id"])
    box = notifier_context.secret_box
    assert signing_secrets(row, box, now=expires - timedelta(seconds=1)) == [new, old]
    assert signing_secrets(row, box, now=expires + timedelta(seconds=1)) == [new]


def test_rotation_with_zero_overlap_retires_the_old_secret(
    notifier_client: FlaskClient, pg_db: Database, notifier_context: NotifierContext
) -> None:
    # Given an endpoint
    tenant = make_tenant(pg_db)
    endpoint, old = make_endpoint(notifier_client, tenant)

    # When its secret is rotated asking for an immediate cut-over (a leaked secret)
    response = notifier_client.post(
        f"{ENDPOINTS}/{endpoint['id']}/rotate-secret",
        json={"previousSecretExpiresInSeconds": 0},
        headers=tenant.headers,
    )

    # Then only the new secret signs, and the old one is gone from the row
    assert response.status_code == 200
    new = response.get_json()["secret"]
    assert response.get_json()["webhookEndpoint"]["previousSecretExpiresAt"] is None
    row = endpoint_row(pg_db, endpoint["id"])
    assert signing_secrets(row, notifier_context.secret_box) == [new]
    assert old not in (row.previous_secret_encrypted or "")
    assert row.previous_secret_encrypted is None


def test_rotation_with_overlap_keeps_the_old_secret_until_it_expires(
    notifier_client: FlaskClient, pg_db: Database, notifier_context: NotifierContext
) -> None:
    # Given an endpoint
    tenant = make_tenant(pg_db)
    endpoint, old = make_endpoint(notifier_client, tenant)
    path = f"{ENDPOINTS}/{endpoint['id']}/rotate-secret"

    # When it is rotated keeping the old secret for an hour
    before = utcnow()
    response = notifier_client.post(
        path, json={"previousSecretExpiresInSeconds": 3600}, headers=tenant.headers
    )

    # Then both sign, newest first, until the hour is over; then only the new one
    new = response.get_json()["secret"]
    expires = parse_iso(response.get_json()["webhookEndpoint"]["previousSecretExpiresAt"])
    assert before + timedelta(seconds=3600) <= expires <= utcnow() + timedelta(seconds=3600)
    row = endpoint_row(pg_db, endpoint["id"])
    box = notifier_context.secret_box
    assert signing_secrets(row, box, now=expires - timedelta(seconds=1)) == [new, old]
    assert signing_secrets(row, box, now=expires + timedelta(seconds=1)) == [new]
    shown = notifier_client.get(f"{ENDPOINTS}/{endpoint['id']}", headers=tenant.headers)
    assert shown.get_json()["webhookEndpoint"]["previousSecretExpiresAt"] == iso_ms(expires)

    # And overlaps outside 0..86400 (or not whole numbers) are refused
    for value in (-1, 86401, "60", 1.5, True):
        bad = notifier_client.post(
            path, json={"previousSecretExpiresInSeconds": value}, headers=tenant.headers
        )
        assert error_of(bad)[:2] == (400, "invalid_request"), value
        assert "previousSecretExpiresInSeconds" in bad.get_json()["details"]["fields"]


# -- test sends, replay, recovery ---------------------------------------------------


def test_a_test_send_makes_one_webhook_test_delivery_and_hands_it_over(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder
) -> None:
    # Given two endpoints, both subscribed to webhook.test
    tenant = make_tenant(pg_db)
    target, _ = make_endpoint(notifier_client, tenant, eventTypes=[events.WEBHOOK_TEST])
    make_endpoint(notifier_client, tenant, eventTypes=[events.WEBHOOK_TEST])

    # When a test is sent to one of them
    response = notifier_client.post(f"{ENDPOINTS}/{target['id']}/test", headers=tenant.headers)

    # Then one pending delivery to that endpoint alone is returned and handed to the engine
    assert response.status_code == 200
    delivery = response.get_json()["webhookDelivery"]
    assert delivery["id"].startswith("whd_")
    assert (delivery["endpointId"], delivery["eventType"], delivery["status"]) == (
        target["id"],
        events.WEBHOOK_TEST,
        "pending",
    )
    assert delivery["attemptCount"] == 0 and delivery["replayOf"] is None
    assert delivery["nextAttemptAt"] is not None
    assert enqueued.calls == [[delivery["id"]]]
    listed = notifier_client.get(
        f"{DELIVERIES}?eventId={delivery['eventId']}", headers=tenant.headers
    ).get_json()
    assert [d["id"] for d in listed["webhookDeliveries"]] == [delivery["id"]]

    # And the event is a webhook.test envelope naming the endpoint
    shown = notifier_client.get(f"{DELIVERIES}/{delivery['id']}", headers=tenant.headers)
    event = shown.get_json()["webhookDelivery"]["event"]
    assert event["id"] == delivery["eventId"] and event["id"].startswith("evt_")
    assert (event["type"], event["tenantId"]) == (events.WEBHOOK_TEST, tenant.tenant_id)
    assert event["data"] == {"endpointId": target["id"], "message": "Test delivery from Settle"}
    assert list(event) == ["id", "type", "createdAt", "tenantId", "livemode", "data"]
    # A test, never money (issue 23): livemode false, an evt_test_ id
    assert event["livemode"] is False and event["id"].startswith("evt_test_")

    # And a disabled endpoint gets no test (409)
    notifier_client.patch(
        f"{ENDPOINTS}/{target['id']}", json={"status": "disabled"}, headers=tenant.headers
    )
    refused = notifier_client.post(f"{ENDPOINTS}/{target['id']}/test", headers=tenant.headers)
    assert error_of(refused)[:2] == (409, "conflict")
    assert len(enqueued.calls) == 1


def test_replay_sends_the_same_event_as_a_new_delivery(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder
) -> None:
    # Given a delivery that failed
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    event, (original,) = deliver_event(pg_db, tenant.tenant_id, data={"deposit": {"id": "dep_1"}})
    update_delivery(pg_db, original.id, status=FAILED, attempt_count=10, next_attempt_at=None)

    # When it is replayed
    response = notifier_client.post(f"{DELIVERIES}/{original.id}/replay", headers=tenant.headers)

    # Then a new pending delivery of the same event names the original, and is handed over
    assert response.status_code == 200
    replayed = response.get_json()["webhookDelivery"]
    assert replayed["id"] != original.id and replayed["replayOf"] == original.id
    assert (replayed["eventId"], replayed["endpointId"], replayed["status"]) == (
        event.id,
        endpoint["id"],
        "pending",
    )
    assert replayed["attemptCount"] == 0
    assert enqueued.ids == [replayed["id"]]

    # And it carries the same body: one stored event, shown identically for both
    shown = [
        notifier_client.get(f"{DELIVERIES}/{i}", headers=tenant.headers).get_json()
        for i in (original.id, replayed["id"])
    ]
    assert shown[0]["webhookDelivery"]["event"] == shown[1]["webhookDelivery"]["event"]
    assert events.encode(shown[1]["webhookDelivery"]["event"]).decode() == event.body
    with pg_db.reader() as session:
        count = session.scalar(
            sa.select(sa.func.count()).select_from(StoredEvent).where(StoredEvent.id == event.id)
        )
    assert count == 1

    # And a delivery whose endpoint is disabled cannot be replayed (409)
    notifier_client.patch(
        f"{ENDPOINTS}/{endpoint['id']}", json={"status": "disabled"}, headers=tenant.headers
    )
    refused = notifier_client.post(f"{DELIVERIES}/{original.id}/replay", headers=tenant.headers)
    assert error_of(refused)[:2] == (409, "conflict")


def test_recover_resends_only_failed_deliveries_in_the_window(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder
) -> None:
    # Given an endpoint whose deliveries, over three days, failed, succeeded or still retry
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    now = utcnow()
    day = timedelta(days=1)
    _, (old_failed,) = deliver_event(pg_db, tenant.tenant_id, at=now - 3 * day)
    _, (failed_a,) = deliver_event(pg_db, tenant.tenant_id, at=now - day)
    event_b, (failed_b,) = deliver_event(pg_db, tenant.tenant_id, at=now - day)
    _, (succeeded,) = deliver_event(pg_db, tenant.tenant_id, at=now - day)
    _, (retrying,) = deliver_event(pg_db, tenant.tenant_id, at=now - day)
    for d in (old_failed, failed_a, failed_b):
        update_delivery(pg_db, d.id, status=FAILED, next_attempt_at=None)
    update_delivery(pg_db, succeeded.id, status=SUCCEEDED, next_attempt_at=None)
    update_delivery(pg_db, retrying.id, status=RETRYING)
    # (event B was replayed once already, and that replay failed too)
    with pg_db.transaction() as session:
        stored_b = session.get(StoredEvent, event_b.id)
        assert stored_b is not None
        row = fanout.pending(
            tenant.tenant_id,
            stored_b.id,
            stored_b.event_type,
            endpoint["id"],
            now - day + timedelta(hours=1),
            replay_of=failed_b.id,
        )
        (b_again,) = fanout.create_deliveries(session, [row])
        b_again.status = FAILED
    path = f"{ENDPOINTS}/{endpoint['id']}/recover"

    # When the last two days are recovered
    response = notifier_client.post(
        path, json={"since": iso_ms(now - 2 * day)}, headers=tenant.headers
    )

    # Then one new delivery per failed event in the window, naming its latest failure
    assert response.status_code == 200
    made = response.get_json()["webhookDeliveries"]
    assert set(response.get_json()) == {"webhookDeliveries"}
    assert {(d["eventId"], d["replayOf"]) for d in made} == {
        (failed_a.event_id, failed_a.id),
        (failed_b.event_id, b_again.id),
    }
    assert all(d["status"] == "pending" and d["endpointId"] == endpoint["id"] for d in made)
    assert sorted(enqueued.ids) == sorted(d["id"] for d in made)

    # And recovering again makes nothing: those events are in flight now
    again = notifier_client.post(
        path, json={"since": iso_ms(now - 2 * day)}, headers=tenant.headers
    )
    assert again.get_json() == {"webhookDeliveries": []}

    # And a window that is reversed, longer than 30 days or missing is refused
    for body, field in (
        ({"since": iso_ms(now), "until": iso_ms(now - day)}, "until"),
        ({"since": iso_ms(now - 31 * day), "until": iso_ms(now)}, "until"),
        ({}, "since"),
        ({"since": "yesterday"}, "since"),
    ):
        bad = notifier_client.post(path, json=body, headers=tenant.headers)
        assert error_of(bad)[:2] == (400, "invalid_request"), body
        assert field in bad.get_json()["details"]["fields"], body


def test_a_capped_recovery_continues_where_it_stopped(
    notifier_client: FlaskClient, pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch cap of 2 and three events that failed to reach an endpoint
    monkeypatch.setattr(deliveries, "MAX_RECOVER_BATCH", 2)
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    failed = [deliver_event(pg_db, tenant.tenant_id)[1][0] for _ in range(3)]
    for d in failed:
        update_delivery(pg_db, d.id, status=FAILED, next_attempt_at=None)
    path = f"{ENDPOINTS}/{endpoint['id']}/recover"
    body = {"since": iso_ms(utcnow() - timedelta(hours=1))}

    # When recovery is called until it returns nothing
    batches = []
    for _ in range(4):
        made = notifier_client.post(path, json=body, headers=tenant.headers).get_json()
        batches.append([d["replayOf"] for d in made["webhookDeliveries"]])

    # Then the oldest two come first, the third next, then nothing: no duplicates
    assert batches == [[failed[0].id, failed[1].id], [failed[2].id], [], []]


# -- the delivery log ---------------------------------------------------------------


def test_the_delivery_log_filters_by_each_field(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given two endpoints and deliveries of two types, in several states and times
    tenant = make_tenant(pg_db)
    both = [events.DEPOSIT_CREDITED, events.DEPOSIT_FAILED]
    first, _ = make_endpoint(notifier_client, tenant, eventTypes=both)
    second, _ = make_endpoint(notifier_client, tenant, eventTypes=[events.DEPOSIT_FAILED])
    now = utcnow()
    early = now - timedelta(hours=5)
    credited, (c1,) = deliver_event(pg_db, tenant.tenant_id, events.DEPOSIT_CREDITED, at=early)
    failed_event, (f1, f2) = deliver_event(pg_db, tenant.tenant_id, events.DEPOSIT_FAILED, at=now)
    update_delivery(pg_db, c1.id, status=SUCCEEDED, succeeded_at=early, next_attempt_at=None)
    update_delivery(pg_db, f2.id, status=FAILED, next_attempt_at=None)

    def ids(query: str) -> list[str]:
        response = notifier_client.get(f"{DELIVERIES}?{query}", headers=tenant.headers)
        assert response.status_code == 200, response.get_json()
        return [d["id"] for d in response.get_json()["webhookDeliveries"]]

    # Then every filter narrows the log (newest first)
    assert f1.endpoint_id == first["id"] and f2.endpoint_id == second["id"]
    assert set(ids("")) == {c1.id, f1.id, f2.id} and ids("")[-1] == c1.id
    assert set(ids(f"endpointId={first['id']}")) == {c1.id, f1.id}
    assert ids(f"eventId={credited.id}") == [c1.id]
    assert set(ids(f"eventType={events.DEPOSIT_FAILED}")) == {f1.id, f2.id}
    assert ids("status=succeeded") == [c1.id]
    assert ids("status=failed") == [f2.id]
    assert ids("status=pending") == [f1.id]
    assert ids("status=retrying") == []
    half = iso_ms(now - timedelta(hours=1)).replace("+", "%2B")
    assert set(ids(f"createdAfter={half}")) == {f1.id, f2.id}
    assert ids(f"createdBefore={half}") == [c1.id]
    assert ids(f"endpointId={second['id']}&status=failed&eventId={failed_event.id}") == [f2.id]

    # And the log pages
    page = notifier_client.get(f"{DELIVERIES}?limit=2", headers=tenant.headers).get_json()
    rest = notifier_client.get(
        f"{DELIVERIES}?limit=2&cursor={page['nextCursor']}", headers=tenant.headers
    ).get_json()
    assert len(page["webhookDeliveries"]) == 2 and rest["nextCursor"] is None
    assert [d["id"] for d in page["webhookDeliveries"] + rest["webhookDeliveries"]] == ids("")

    # And bad filters are 400s naming them (a misspelt one too)
    for query, field in (
        ("status=done", "status"),
        ("eventType=deposit.nope", "eventType"),
        ("createdAfter=monday", "createdAfter"),
        ("endpointID=we_1", "endpointID"),
        ("endpointId=we_%00", "endpointId"),
        ("eventId=evt%20x", "eventId"),
    ):
        response = notifier_client.get(f"{DELIVERIES}?{query}", headers=tenant.headers)
        assert error_of(response)[:2] == (400, "invalid_request"), query
        assert field in response.get_json()["details"]["fields"], query


def test_a_delivery_shows_its_attempts_and_the_event_as_sent(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given a delivery that failed once and then succeeded
    tenant = make_tenant(pg_db)
    make_endpoint(notifier_client, tenant)
    event, (delivery,) = deliver_event(pg_db, tenant.tenant_id, data={"deposit": {"id": "dep_9"}})
    t1, t2 = utcnow() - timedelta(seconds=10), utcnow()
    add_attempt(
        pg_db,
        delivery.id,
        1,
        attempted_at=t1,
        response_status=500,
        latency_ms=12.5,
        error="http_500",
        response_body="oops",
        signature_header="v1=aa",
    )
    add_attempt(
        pg_db,
        delivery.id,
        2,
        attempted_at=t2,
        response_status=204,
        latency_ms=3.0,
        error=None,
        response_body="",
        signature_header="v1=bb",
    )
    update_delivery(
        pg_db,
        delivery.id,
        status=SUCCEEDED,
        attempt_count=2,
        last_attempt_at=t2,
        last_response_status=204,
        succeeded_at=t2,
        next_attempt_at=None,
    )

    # When it is read
    shown = notifier_client.get(f"{DELIVERIES}/{delivery.id}", headers=tenant.headers)

    # Then it lists both attempts in order and the envelope exactly as stored
    body = shown.get_json()["webhookDelivery"]
    assert body["status"] == "succeeded" and body["attemptCount"] == 2
    assert body["succeededAt"] == iso_ms(t2) and body["lastResponseStatus"] == 204
    # (each attempt's request headers as sent: the recorded signature, its own second)
    sent = [attempt.pop("requestHeaders") for attempt in body["attempts"]]
    for headers, signature, at in ((sent[0], "v1=aa", t1), (sent[1], "v1=bb", t2)):
        assert headers["x-service-signature"] == signature
        assert headers["x-service-timestamp"] == str(int(at.timestamp()))
        assert headers["x-service-delivery-id"] == delivery.id
        assert headers["x-service-event-id"] == delivery.event_id
    assert body["requestBody"] == event.body
    assert body["attempts"] == [
        {
            "number": 1,
            "attemptedAt": iso_ms(t1),
            "responseStatus": 500,
            "latencyMs": 12.5,
            "error": "http_500",
            "responseBody": "oops",
        },
        {
            "number": 2,
            "attemptedAt": iso_ms(t2),
            "responseStatus": 204,
            "latencyMs": 3.0,
            "error": None,
            "responseBody": "",
        },
    ]
    assert events.encode(body["event"]).decode() == event.body
    assert set(body) >= {
        "id",
        "endpointId",
        "eventId",
        "eventType",
        "status",
        "attemptCount",
        "nextAttemptAt",
        "lastAttemptAt",
        "lastResponseStatus",
        "lastError",
        "replayOf",
        "createdAt",
        "updatedAt",
        "succeededAt",
    }


# -- persistence contract for the engine --------------------------------------------


def test_an_event_is_stored_once(pg_db: Database) -> None:
    # Given an event envelope
    tenant = make_tenant(pg_db)
    body = events.encode(events.envelope(events.DEPOSIT_CREDITED, tenant.tenant_id, {"a": "é"}))

    # When it is stored twice (a redelivered message)
    with pg_db.transaction() as session:
        first = deliveries.store_event(session, body)
    with pg_db.transaction() as session:
        second = deliveries.store_event(session, body)

    # Then the first stores it byte for byte, the second is a no-op
    assert first is not None and second is None
    stored = load(pg_db, StoredEvent, first.id)
    assert stored.body.encode() == body and stored.tenant_id == tenant.tenant_id

    # And a body that is not an envelope is refused
    for bad in (b"not json", b"[]", b'{"id":"evt_1","type":"nope"}', b"\xff"):
        with pytest.raises(deliveries.InvalidEvent), pg_db.transaction() as session:
            deliveries.store_event(session, bad)


def test_the_consumer_fans_out_to_enabled_live_subscribed_endpoints_only(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given endpoints: subscribed, subscribed then disabled, subscribed then deleted, other type
    tenant = make_tenant(pg_db)
    other = make_tenant(pg_db)
    subscribed, _ = make_endpoint(notifier_client, tenant)
    disabled, _ = make_endpoint(notifier_client, tenant)
    deleted, _ = make_endpoint(notifier_client, tenant)
    make_endpoint(notifier_client, tenant, eventTypes=[events.DEPOSIT_FAILED])
    make_endpoint(notifier_client, other)
    notifier_client.patch(
        f"{ENDPOINTS}/{disabled['id']}", json={"status": "disabled"}, headers=tenant.headers
    )
    notifier_client.delete(f"{ENDPOINTS}/{deleted['id']}", headers=tenant.headers)

    # When the consumer stores an event of the subscribed type (its own code, real PostgreSQL)
    envelope = events.envelope(events.DEPOSIT_CREDITED, tenant.tenant_id, {"n": 1})
    (handled,) = store_events(pg_db, [events.encode(envelope)])

    # Then only the first endpoint gets a delivery to send; the disabled one's is kept,
    # skipped (enabling it sends it); the deleted one and the others get none
    with pg_db.reader() as session:
        made = session.scalars(sa.select(Delivery).where(Delivery.event_id == envelope["id"]))
        assert {d.endpoint_id: d.status for d in made} == {
            subscribed["id"]: PENDING,
            disabled["id"]: SKIPPED,
        }
    assert len(handled.delivery_ids) == 1


# -- isolation and auth -------------------------------------------------------------


def _id_routes(endpoint_id: str, delivery_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    since = {"since": iso_ms(utcnow() - timedelta(days=1))}
    return [
        ("get", f"{ENDPOINTS}/{endpoint_id}", {}),
        ("patch", f"{ENDPOINTS}/{endpoint_id}", {"json": {"name": "mine now"}}),
        ("delete", f"{ENDPOINTS}/{endpoint_id}", {}),
        ("post", f"{ENDPOINTS}/{endpoint_id}/rotate-secret", {"json": {}}),
        ("post", f"{ENDPOINTS}/{endpoint_id}/test", {}),
        ("post", f"{ENDPOINTS}/{endpoint_id}/recover", {"json": since}),
        ("post", f"{ENDPOINTS}/{endpoint_id}/renew", {"json": {}}),
        ("get", f"{DELIVERIES}/{delivery_id}", {}),
        ("post", f"{DELIVERIES}/{delivery_id}/replay", {}),
    ]


def test_another_tenants_ids_answer_404_like_missing_ones(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder
) -> None:
    # Given an endpoint and a delivery of one tenant
    owner = make_tenant(pg_db)
    intruder = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, owner)
    _, (delivery,) = deliver_event(pg_db, owner.tenant_id)

    # When another tenant uses their ids, Then every route answers as for a missing id
    for method, path, kwargs in _id_routes(endpoint["id"], delivery.id):
        theirs = getattr(notifier_client, method)(path, headers=intruder.headers, **kwargs)
        missing_path = path.replace(endpoint["id"], "we_missing").replace(delivery.id, "whd_x")
        missing = getattr(notifier_client, method)(missing_path, headers=intruder.headers, **kwargs)
        assert theirs.status_code == missing.status_code == 404, (method, path)
        assert theirs.get_json()["code"] == missing.get_json()["code"] == "not_found"

    # And their lists do not show them, even when filtered by the owner's ids
    assert (
        notifier_client.get(ENDPOINTS, headers=intruder.headers).get_json()["webhookEndpoints"]
        == []
    )
    for query in ("", f"?endpointId={endpoint['id']}", f"?eventId={delivery.event_id}"):
        listed = notifier_client.get(DELIVERIES + query, headers=intruder.headers).get_json()
        assert listed["webhookDeliveries"] == [], query

    # And nothing of the owner's changed or was sent
    assert enqueued.calls == []
    shown = notifier_client.get(f"{ENDPOINTS}/{endpoint['id']}", headers=owner.headers)
    assert shown.get_json()["webhookEndpoint"] == endpoint


def test_ids_no_id_could_have_are_404_not_a_crash(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given ids PostgreSQL cannot even compare (a NUL byte) or far too long
    tenant = make_tenant(pg_db)
    for bad, answer in (("we_%00", (400, "invalid_request")), ("x" * 500, (404, "not_found"))):
        # When any id route gets one, Then it is a plain 404, or a 400 for the control
        # character a NUL is (refused on every path before routing: issue 23)
        for method, path, kwargs in _id_routes(bad, bad):
            response = getattr(notifier_client, method)(path, headers=tenant.headers, **kwargs)
            assert error_of(response)[:2] == answer, (method, path)


def test_routes_need_a_key_with_the_right_scope(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given a tenant's endpoint and delivery, and keys with one webhooks scope each
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    _, (delivery,) = deliver_event(pg_db, tenant.tenant_id)
    read_only = tenant.key_with("webhooks:read")
    write_only = tenant.key_with("webhooks:write")
    routes = [
        ("get", ENDPOINTS, {}),
        ("post", ENDPOINTS, {"json": VALID}),
        ("get", DELIVERIES, {}),
        *_id_routes(endpoint["id"], delivery.id),
    ]

    for method, path, kwargs in routes:
        call = getattr(notifier_client, method)
        # Then no key (or an unknown one) is 401
        assert error_of(call(path, **kwargs))[:2] == (401, "unauthorized"), path
        bogus = {"Authorization": "Bearer sk_nope"}
        assert error_of(call(path, headers=bogus, **kwargs))[:2] == (401, "unauthorized")
        # And a key without the route's scope is 403 insufficient_scope
        lacking = write_only if method == "get" else read_only
        assert error_of(call(path, headers=lacking, **kwargs))[:2] == (
            403,
            "insufficient_scope",
        ), (method, path)

    # And a key with the scope gets through
    assert notifier_client.get(ENDPOINTS, headers=read_only).status_code == 200
    assert notifier_client.get(f"{DELIVERIES}/{delivery.id}", headers=read_only).status_code == 200
    renamed = notifier_client.patch(
        f"{ENDPOINTS}/{endpoint['id']}", json={"name": "ok"}, headers=write_only
    )
    assert renamed.status_code == 200


# -- status and OpenAPI -------------------------------------------------------------


def test_status_and_openapi_are_public_and_complete(notifier_client: FlaskClient) -> None:
    # When the status and the OpenAPI document are fetched without a key
    status = notifier_client.get("/v1/notifier/status")
    spec = notifier_client.get("/v1/notifier/openapi.json")

    # Then the status reports its databases
    assert status.status_code == 200
    assert status.get_json()["status"] == "ok"
    assert status.get_json()["components"] == {"database": "ok", "identity": "ok"}

    # And every webhook route is documented with its scope, 401/403 and error schema
    assert spec.status_code == 200
    paths = spec.get_json()["paths"]
    expected = {
        ("get", "/v1/webhook-endpoints"): "webhooks:read",
        ("post", "/v1/webhook-endpoints"): "webhooks:write",
        ("get", "/v1/webhook-endpoints/{endpointId}"): "webhooks:read",
        ("patch", "/v1/webhook-endpoints/{endpointId}"): "webhooks:write",
        ("delete", "/v1/webhook-endpoints/{endpointId}"): "webhooks:write",
        ("post", "/v1/webhook-endpoints/{endpointId}/rotate-secret"): "webhooks:write",
        ("post", "/v1/webhook-endpoints/{endpointId}/test"): "webhooks:write",
        ("post", "/v1/webhook-endpoints/{endpointId}/recover"): "webhooks:write",
        ("post", "/v1/webhook-endpoints/{endpointId}/renew"): "webhooks:write",
        ("get", "/v1/webhook-endpoints/{endpointId}/stats"): "webhooks:read",
        ("get", "/v1/webhook-deliveries"): "webhooks:read",
        ("get", "/v1/webhook-deliveries/{deliveryId}"): "webhooks:read",
        ("post", "/v1/webhook-deliveries/{deliveryId}/replay"): "webhooks:write",
    }
    # And the paths are exactly these: parameters named as in the interface
    # (`:endpointId`, `:deliveryId`), camelCase like core's `{externalUserId}`
    assert {path for path in paths if path.startswith("/v1/webhook-")} == {
        path for _, path in expected
    }
    for path, item in paths.items():
        declared = sorted(p["name"] for p in item.get("parameters", []) if p["in"] == "path")
        if path.startswith("/v1/webhook-endpoints/"):
            assert declared == ["endpointId"], path
        elif path.startswith("/v1/webhook-deliveries/"):
            assert declared == ["deliveryId"], path
        else:
            assert declared == [], path
    for (method, path), scope in expected.items():
        operation = paths[path][method]
        assert operation["security"] == [{"apiKey": []}, {"session": []}], path
        assert f"`{scope}`" in operation["description"], path
        assert {"401", "403"} <= set(operation["responses"]), path
    schemas = spec.get_json()["components"]["schemas"]
    assert {"Endpoint", "Delivery", "DeliveryDetail", "Attempt", "Error"} <= set(schemas)
