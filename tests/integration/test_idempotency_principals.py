"""An Idempotency-Key replays only to the principal that made the first request.

Hostile cases of issue 23: another tenant, a lesser key of the same tenant, a portal
link's session and a member demoted since all send an admin's exact key and body;
each must meet its route's own checks and never receive the stored response (a
full-scope API key, a webhook signing secret).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from shared.db import Database
from shared.identity.models import SCOPES, Member
from tests.conftest import PASSWORD, TenantKeys, make_tenant
from tests.integration.conftest import assert_error
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    PUBLIC_URL,
    notifier_app_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration

KEY = {"Idempotency-Key": "same-key-everywhere"}
FULL = {"scopes": sorted(SCOPES)}
HOOK = {"name": "ledger", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}


def _ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, (response.status_code, response.get_json())
    body: dict[str, Any] = response.get_json()
    return body


def test_a_lesser_key_and_another_tenant_never_replay_an_admins_new_key(
    core_app: Flask, tenant: TenantKeys, pg_db: Database
) -> None:
    # Given tenant A's full-scope key made a full-scope key with an Idempotency-Key
    client = core_app.test_client()
    first = _ok(client.post("/v1/api-keys", json=FULL, headers={**tenant.headers, **KEY}))
    # When a key of A allowed only to create keys sends the same key and body
    lesser = {**tenant.key_with("api_keys:write"), **KEY}
    answer = client.post("/v1/api-keys", json=FULL, headers=lesser)
    # Then it runs its own request, which its scopes refuse: no replay, no secret
    assert answer.headers.get("Idempotent-Replayed") is None
    assert_error(answer, 403, "forbidden")
    assert first["secret"] not in answer.get_data(as_text=True)
    # And tenant B sending the same gets a new key of its own, not A's
    other = make_tenant(pg_db)
    theirs = client.post("/v1/api-keys", json=FULL, headers={**other.headers, **KEY})
    assert theirs.headers.get("Idempotent-Replayed") is None
    made = _ok(theirs)
    assert made["secret"] != first["secret"]
    assert made["apiKey"]["id"] != first["apiKey"]["id"]
    # And A's own key still gets its first answer back
    again = client.post("/v1/api-keys", json=FULL, headers={**tenant.headers, **KEY})
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.get_json() == first


def test_a_portal_link_session_never_replays_the_tenants_signing_secret(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    # Given the tenant's key created an endpoint (its answer holds the signing secret)
    notifier = notifier_app.test_client()
    key_headers = {**tenant.headers, **KEY}
    created = _ok(notifier.post("/v1/webhook-endpoints", json=HOOK, headers=key_headers))
    # And a developer's portal link (it may write webhooks), opened in a browser
    link = _ok(
        core_app.test_client().post(
            "/v1/portal-links", json={"role": "developer"}, headers=tenant.headers
        )
    )
    browser = core_app.test_client()
    token = link["portalLink"]["url"].partition("#")[2]
    session = _ok(browser.post("/v1/sessions/portal-link", json={"token": token}))["session"]
    cookie = browser.get_cookie("settle_session", path="/v1")
    assert cookie is not None
    notifier.set_cookie("settle_session", cookie.value, path="/v1")
    # When the link's session sends the same Idempotency-Key and body
    answer = notifier.post(
        "/v1/webhook-endpoints",
        json=HOOK,
        headers={"X-CSRF-Token": session["csrfToken"], **KEY},
    )
    # Then it makes an endpoint of its own: the key's endpoint and secret stay unseen
    assert answer.headers.get("Idempotent-Replayed") is None
    made = _ok(answer)
    assert made["webhookEndpoint"]["id"] != created["webhookEndpoint"]["id"]
    assert created["secret"] not in answer.get_data(as_text=True)


def test_a_member_demoted_since_is_judged_anew(
    core_app: Flask, tenant: TenantKeys, pg_db: Database
) -> None:
    # Given an owner made another owner with an Idempotency-Key
    owner = tenant.signed_in("owner")
    client = owner.client(core_app)
    headers = {**owner.headers, **KEY}
    body = {"email": f"o-{uuid.uuid4().hex[:8]}@example.com", "role": "owner", "password": PASSWORD}
    _ok(client.post("/v1/members", json=body, headers=headers))
    # When the owner is made an admin and sends the same request again
    with pg_db.transaction() as session:
        session.execute(sa.update(Member).where(Member.id == owner.member_id).values(role="admin"))
    answer = client.post("/v1/members", json=body, headers=headers)
    # Then the admin's role decides anew (an admin never makes an owner): no replay
    assert answer.headers.get("Idempotent-Replayed") is None
    assert_error(answer, 403, "forbidden")
