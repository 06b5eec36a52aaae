"""API keys, members and portal links from the API (and so from the portal's pages).

Hostile cases first: nobody hands out more than they hold, a tenant keeps an owner
even when two owners demote each other at once, a removed member's session dies at
once, a portal link opens one session once (also when two browsers race) and that
session reaches the webhook routes only.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from services.core.app import create_app
from services.core.context import CoreContext
from shared.db import Database
from shared.identity.models import SCOPES, PortalLink
from shared.timefmt import utcnow
from tests.conftest import PASSWORD, SignedIn, TenantKeys
from tests.integration.conftest import assert_error, outbox_events
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    PUBLIC_URL,
    notifier_app_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration

HOOK = {"name": "support", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.get_json())
    return response.get_json()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# -- API keys -----------------------------------------------------------------------


def test_an_admin_creates_lists_and_revokes_a_key(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys, pg_db: Database
) -> None:
    # Given a signed-in admin
    admin = tenant.signed_in("admin")
    client = admin.client(core_app)
    # When the admin creates a key with chosen scopes
    made = ok(
        client.post(
            "/v1/api-keys",
            json={"name": "support desk", "scopes": ["webhooks:read", "webhooks:read"]},
            headers=admin.headers,
        )
    )
    # Then the key itself is in this response only, with its scopes (deduplicated)
    secret, key = made["secret"], made["apiKey"]
    assert secret.startswith("sk_") and secret.startswith(key["prefix"])
    assert key["scopes"] == ["webhooks:read"] and key["name"] == "support desk"
    assert key["revokedAt"] is None and key["id"].startswith("key_")
    listed = ok(client.get("/v1/api-keys"))
    assert listed["apiKeys"][0]["id"] == key["id"]
    assert secret not in str(listed)
    # And it works, within its scopes
    notifier = notifier_app.test_client()
    ok(notifier.get("/v1/webhook-endpoints", headers=_bearer(secret)))
    assert_error(
        notifier.post("/v1/webhook-endpoints", json=HOOK, headers=_bearer(secret)),
        403,
        "insufficient_scope",
    )
    # When the admin revokes it (twice)
    for _ in range(2):
        assert client.delete(f"/v1/api-keys/{key['id']}", headers=admin.headers).status_code == 204
    # Then it is refused from the next request, listed as revoked, and one event says so
    assert_error(
        notifier.get("/v1/webhook-endpoints", headers=_bearer(secret)), 401, "unauthorized"
    )
    listed = ok(client.get("/v1/api-keys"))
    assert next(k for k in listed["apiKeys"] if k["id"] == key["id"])["revokedAt"] is not None
    revoked = outbox_events(pg_db, tenant.tenant_id, "tenant.api_key_revoked")
    assert [e["data"]["apiKeyId"] for e in revoked] == [key["id"]]


def test_a_key_never_makes_a_key_with_more_than_it_holds(
    core_app: Flask, tenant: TenantKeys
) -> None:
    # Given a key that may make keys and read webhooks, nothing else
    client = core_app.test_client()
    limited = tenant.key_with("api_keys:write", "webhooks:read")
    # When it asks for a key with a scope it lacks (alone, or among its own)
    for scopes in (["webhooks:write"], ["webhooks:read", "deposits:read"], list(SCOPES)):
        response = client.post("/v1/api-keys", json={"scopes": scopes}, headers=limited)
        # Then 403 forbidden, naming what it lacks, and no key was made
        body = assert_error(response, 403, "forbidden")
        assert "lack" in body["error"]
    assert len(ok(client.get("/v1/api-keys", headers=limited))["apiKeys"]) == 2
    # And within its own scopes it may
    ok(client.post("/v1/api-keys", json={"scopes": ["webhooks:read"]}, headers=limited))


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"scopes": []},
        {"scopes": ["root"]},
        {"scopes": "webhooks:read"},
        {"scopes": ["webhooks:read"], "name": ""},
        {"scopes": ["webhooks:read"], "name": "x" * 101},
        {"scopes": ["webhooks:read"], "name": "nul\x00"},
        {"scopes": ["webhooks:read"], "extra": 1},
    ],
)
def test_a_bad_key_request_is_400(core_app: Flask, tenant: TenantKeys, body: Any) -> None:
    response = core_app.test_client().post("/v1/api-keys", json=body, headers=tenant.headers)
    assert_error(response, 400, "invalid_request")


def test_below_admin_nobody_manages_access(core_app: Flask, tenant: TenantKeys) -> None:
    # Given a developer, signed in
    developer = tenant.signed_in("developer")
    client = developer.client(core_app)
    # Then every access route is 403 for them
    for method, url, body in (
        ("GET", "/v1/api-keys", None),
        ("POST", "/v1/api-keys", {"scopes": ["webhooks:read"]}),
        ("DELETE", f"/v1/api-keys/{tenant.api_key_id}", None),
        ("GET", "/v1/members", None),
        ("POST", "/v1/members", {"email": "x@example.com", "role": "viewer", "password": PASSWORD}),
        ("PATCH", f"/v1/members/{developer.member_id}", {"role": "owner"}),
        ("DELETE", f"/v1/members/{developer.member_id}", None),
        ("POST", "/v1/portal-links", {}),
    ):
        response = client.open(url, method=method, json=body, headers=developer.headers)
        assert_error(response, 403, "forbidden")
    # And they are still a developer, and the tenant's key still works
    assert ok(client.get("/v1/sessions/current"))["session"]["role"] == "developer"
    ok(core_app.test_client().get("/v1/deposit-accounts", headers=tenant.headers))


def test_another_tenants_key_is_404_and_keeps_working(
    core_app: Flask, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    owner = tenant.signed_in("owner")
    client = owner.client(core_app)
    # When the owner revokes the other tenant's key by id
    response = client.delete(f"/v1/api-keys/{other_tenant.api_key_id}", headers=owner.headers)
    # Then 404, as for a key that does not exist, and that key still works
    assert_error(response, 404, "not_found")
    ok(core_app.test_client().get("/v1/deposit-accounts", headers=other_tenant.headers))


# -- members ------------------------------------------------------------------------


def test_an_admin_adds_a_member_who_signs_in(core_app: Flask, tenant: TenantKeys) -> None:
    admin = tenant.signed_in("admin")
    client = admin.client(core_app)
    email = f"New.Person-{uuid.uuid4().hex[:8]}@Example.com"
    # When the admin adds a developer
    member = ok(
        client.post(
            "/v1/members",
            json={"email": email, "role": "developer", "password": PASSWORD},
            headers=admin.headers,
        )
    )["member"]
    # Then the member is listed (email lower-cased, no password anywhere) and signs in
    assert member["email"] == email.lower() and member["role"] == "developer"
    listed = ok(client.get("/v1/members"))
    assert member in listed["members"] and PASSWORD not in str(listed)
    session = ok(
        core_app.test_client().post("/v1/sessions", json={"email": email, "password": PASSWORD})
    )["session"]
    assert session["role"] == "developer" and session["tenantId"] == tenant.tenant_id
    # And the same email again is 409
    again = client.post(
        "/v1/members",
        json={"email": email, "role": "viewer", "password": PASSWORD},
        headers=admin.headers,
    )
    assert_error(again, 409, "conflict")


def _add_member(core_app: Flask, owner: SignedIn, email: str, password: str) -> Any:
    return owner.client(core_app).post(
        "/v1/members",
        json={"email": email, "role": "developer", "password": password},
        headers=owner.headers,
    )


def test_a_members_email_is_unique_within_its_tenant_only(
    core_app: Flask, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    email = f"shared-{uuid.uuid4().hex[:8]}@example.com"
    ours, theirs = tenant.signed_in("owner"), other_tenant.signed_in("owner")
    # Given a member of another tenant with this email
    ok(_add_member(core_app, theirs, email, PASSWORD))
    # When our tenant adds the same address (another person's account, their password)
    other_password = "another long password 42"
    added = _add_member(core_app, ours, email, other_password)
    # Then it is ours to add: no 409 telling us the address is someone's elsewhere
    assert added.status_code == 200, added.get_json()
    sign_in = core_app.test_client().post
    # And each password opens its own tenant's membership
    mine = ok(sign_in("/v1/sessions", json={"email": email, "password": other_password}))
    assert mine["session"]["tenantId"] == tenant.tenant_id
    first = ok(sign_in("/v1/sessions", json={"email": email, "password": PASSWORD}))
    assert first["session"]["tenantId"] == other_tenant.tenant_id
    # And the same address twice in one tenant stays a conflict
    assert_error(_add_member(core_app, ours, email, PASSWORD), 409, "conflict")


def test_one_person_in_two_tenants_says_which_at_sign_in(
    core_app: Flask, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    email = f"both-{uuid.uuid4().hex[:8]}@example.com"
    for keys in (tenant, other_tenant):
        ok(_add_member(core_app, keys.signed_in("owner"), email, PASSWORD))
    sign_in = core_app.test_client().post
    # Without tenantId, the right password matches two memberships: 400 naming the field
    ambiguous = sign_in("/v1/sessions", json={"email": email, "password": PASSWORD})
    assert_error(ambiguous, 400, "invalid_request")
    assert "tenantId" in ambiguous.get_json()["details"]["fields"]
    # With it, that tenant's membership; a wrong password stays the plain 401
    for keys in (tenant, other_tenant):
        body = {"email": email, "password": PASSWORD, "tenantId": keys.tenant_id}
        assert ok(sign_in("/v1/sessions", json=body))["session"]["tenantId"] == keys.tenant_id
    wrong = {"email": email, "password": "not the password at all", "tenantId": tenant.tenant_id}
    assert_error(sign_in("/v1/sessions", json=wrong), 401, "unauthorized")


def test_an_admin_neither_makes_nor_touches_an_owner(core_app: Flask, tenant: TenantKeys) -> None:
    admin, owner = tenant.signed_in("admin"), tenant.signed_in("owner")
    client = admin.client(core_app)
    email = f"boss-{uuid.uuid4().hex[:8]}@example.com"
    attempts = (
        ("POST", "/v1/members", {"email": email, "role": "owner", "password": PASSWORD}),
        ("PATCH", f"/v1/members/{owner.member_id}", {"role": "viewer"}),
        ("DELETE", f"/v1/members/{owner.member_id}", None),
        ("PATCH", f"/v1/members/{admin.member_id}", {"role": "owner"}),
    )
    for method, url, body in attempts:
        response = client.open(url, method=method, json=body, headers=admin.headers)
        assert_error(response, 403, "forbidden")
    # Then the owner is still an owner and the admin still an admin
    assert ok(owner.client(core_app).get("/v1/sessions/current"))["session"]["role"] == "owner"
    assert ok(client.get("/v1/sessions/current"))["session"]["role"] == "admin"


def test_an_admin_cannot_become_an_owner_through_a_key_it_makes(
    core_app: Flask, tenant: TenantKeys
) -> None:
    # Given an admin, who may make API keys with every scope
    admin = tenant.signed_in("admin")
    made = admin.client(core_app).post(
        "/v1/api-keys", json={"scopes": list(SCOPES)}, headers=admin.headers
    )
    full_key = _bearer(ok(made)["secret"])
    client = core_app.test_client()
    # When that key adds an owner, or makes the admin one
    email = f"me-too-{uuid.uuid4().hex[:8]}@example.com"
    add = client.post(
        "/v1/members",
        json={"email": email, "role": "owner", "password": PASSWORD},
        headers=full_key,
    )
    promote = client.patch(
        f"/v1/members/{admin.member_id}", json={"role": "owner"}, headers=full_key
    )
    # Then both are refused: only an owner makes an owner
    assert_error(add, 403, "forbidden")
    assert_error(promote, 403, "forbidden")
    assert ok(admin.client(core_app).get("/v1/sessions/current"))["session"]["role"] == "admin"


def test_a_key_makes_only_members_who_act_within_its_scopes(
    core_app: Flask, tenant: TenantKeys
) -> None:
    client = core_app.test_client()
    # Given a key that may manage members but reads nothing else
    narrow = tenant.key_with("members:write")
    body = {"email": f"v-{uuid.uuid4().hex[:8]}@example.com", "role": "viewer"}
    # When it adds a viewer (who would read every deposit), Then 403
    response = client.post("/v1/members", json={**body, "password": PASSWORD}, headers=narrow)
    assert_error(response, 403, "forbidden")
    # And the tenant's full-scope key may add an admin (never an owner: see above)
    full = client.post(
        "/v1/members", json={**body, "role": "admin", "password": PASSWORD}, headers=tenant.headers
    )
    assert ok(full)["member"]["role"] == "admin"


def test_a_removed_member_is_signed_out_at_once(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    owner, developer = tenant.signed_in("owner"), tenant.signed_in("developer")
    notifier = developer.client(notifier_app)
    ok(notifier.get("/v1/webhook-endpoints"))
    # When the owner removes the developer
    response = owner.client(core_app).delete(
        f"/v1/members/{developer.member_id}", headers=owner.headers
    )
    assert response.status_code == 204
    # Then the developer's session is refused by both services on the next request
    assert_error(notifier.get("/v1/webhook-endpoints"), 401, "unauthorized")
    assert_error(developer.client(core_app).get("/v1/sessions/current"), 401, "unauthorized")


def test_a_role_change_through_the_api_applies_at_once(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    admin, developer = tenant.signed_in("admin"), tenant.signed_in("developer")
    notifier = developer.client(notifier_app)
    ok(notifier.post("/v1/webhook-endpoints", json=HOOK, headers=developer.headers))
    changed = admin.client(core_app).patch(
        f"/v1/members/{developer.member_id}", json={"role": "viewer"}, headers=admin.headers
    )
    assert ok(changed)["member"]["role"] == "viewer"
    response = notifier.post("/v1/webhook-endpoints", json=HOOK, headers=developer.headers)
    assert_error(response, 403, "forbidden")


def test_the_last_owner_stays(core_app: Flask, tenant: TenantKeys) -> None:
    owner = tenant.signed_in("owner")
    client = owner.client(core_app)
    # When the only owner demotes or removes themselves, Then 409 and nothing changes
    demote = client.patch(
        f"/v1/members/{owner.member_id}", json={"role": "admin"}, headers=owner.headers
    )
    assert_error(demote, 409, "conflict")
    remove = client.delete(f"/v1/members/{owner.member_id}", headers=owner.headers)
    assert_error(remove, 409, "conflict")
    assert ok(client.get("/v1/sessions/current"))["session"]["role"] == "owner"


def test_two_owners_demoting_each_other_at_once_leave_one_owner(
    core_app: Flask, tenant: TenantKeys, pg_db: Database
) -> None:
    # Given exactly two owners
    first, second = tenant.signed_in("owner"), tenant.signed_in("owner")
    statuses: list[int] = []
    start = threading.Barrier(2)

    def demote(actor: SignedIn, target: SignedIn) -> None:
        client = actor.client(core_app)
        start.wait()
        response = client.patch(
            f"/v1/members/{target.member_id}", json={"role": "viewer"}, headers=actor.headers
        )
        statuses.append(response.status_code)

    # When each demotes the other at the same moment
    threads = [
        threading.Thread(target=demote, args=(first, second)),
        threading.Thread(target=demote, args=(second, first)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # Then one wins and the other, a viewer by the time it holds the lock, is refused:
    # the tenant still has an owner
    assert sorted(statuses) == [200, 403], statuses
    listed = ok(core_app.test_client().get("/v1/members", headers=tenant.headers))
    assert [m["role"] for m in listed["members"]].count("owner") == 1


def test_another_tenants_member_is_404(
    core_app: Flask, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    owner, theirs = tenant.signed_in("owner"), other_tenant.signed_in("viewer")
    client = owner.client(core_app)
    for method, body in (("PATCH", {"role": "developer"}), ("DELETE", None)):
        response = client.open(
            f"/v1/members/{theirs.member_id}", method=method, json=body, headers=owner.headers
        )
        assert_error(response, 404, "not_found")
    assert ok(theirs.client(core_app).get("/v1/sessions/current"))["session"]["role"] == "viewer"


# -- portal links -------------------------------------------------------------------


def _link(core_app: Flask, headers: dict[str, str], **body: Any) -> dict[str, Any]:
    made = ok(core_app.test_client().post("/v1/portal-links", json=body, headers=headers))
    link: dict[str, Any] = made["portalLink"]
    return link


def _token(link: dict[str, Any]) -> str:
    base, _, token = link["url"].partition("#")
    assert base.endswith("/portal/link") and token.startswith("plk_"), link
    return token


def test_a_link_opens_the_webhook_pages_once(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    # Given a link made with a key that has portal:write, for a developer's access
    link = _link(
        core_app,
        tenant.key_with("portal:write", "webhooks:read", "webhooks:write"),
        role="developer",
    )
    assert link["role"] == "developer"
    expires = link["expiresAt"]
    assert expires <= (utcnow() + timedelta(minutes=15, seconds=1)).isoformat()
    # When a browser opens it
    browser = core_app.test_client()
    session = ok(browser.post("/v1/sessions/portal-link", json={"token": _token(link)}))["session"]
    csrf = {"X-CSRF-Token": session["csrfToken"]}
    # Then it has a session of the tenant with the link's role and no member
    assert session["tenantId"] == tenant.tenant_id and session["role"] == "developer"
    assert session["memberId"] is None and session["email"] is None
    assert ok(browser.get("/v1/sessions/current"))["session"]["id"] == session["id"]
    # And the session reaches the webhook routes (the notifier checks it itself)
    cookie = browser.get_cookie("settle_session", path="/v1")
    assert cookie is not None
    notifier = notifier_app.test_client()
    notifier.set_cookie("settle_session", cookie.value, path="/v1")
    ok(notifier.post("/v1/webhook-endpoints", json=HOOK, headers=csrf))
    ok(notifier.get("/v1/webhook-deliveries"))
    # But nothing else: deposits, accounts, policy, access are 403
    for method, url in (
        ("GET", "/v1/deposits"),
        ("GET", "/v1/deposit-accounts"),
        ("GET", "/v1/destination-policy"),
        ("GET", f"/v1/tenants/{tenant.tenant_id}/destination-policy"),
        ("GET", "/v1/api-keys"),
        ("POST", "/v1/portal-links"),
    ):
        response = browser.open(
            url, method=method, json={} if method == "POST" else None, headers=csrf
        )
        assert_error(response, 403, "forbidden")
    # And the link is spent: opening it again is 401, even in another browser
    again = core_app.test_client().post("/v1/sessions/portal-link", json={"token": _token(link)})
    assert_error(again, 401, "unauthorized")


def test_a_viewer_link_reads_but_does_not_write(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    # Given a link made without a role (a viewer's), opened
    link = _link(core_app, tenant.headers)
    assert link["role"] == "viewer"
    opened = core_app.test_client().post("/v1/sessions/portal-link", json={"token": _token(link)})
    session = ok(opened)["session"]
    notifier = notifier_app.test_client()
    notifier.set_cookie("settle_session", _cookie_value(opened), path="/v1")
    # Then it reads the webhook routes and may not write them
    ok(notifier.get("/v1/webhook-endpoints"))
    response = notifier.post(
        "/v1/webhook-endpoints", json=HOOK, headers={"X-CSRF-Token": session["csrfToken"]}
    )
    assert_error(response, 403, "forbidden")


def _cookie_value(response: Any) -> str:
    for header in response.headers.getlist("Set-Cookie"):
        if header.startswith("settle_session="):
            return str(header.split(";", 1)[0].partition("=")[2])
    raise AssertionError("no session cookie")


def test_a_key_never_makes_a_link_that_does_more_than_it(
    core_app: Flask, tenant: TenantKeys
) -> None:
    client = core_app.test_client()
    # Given keys with portal:write and less than a developer's webhook scopes
    bare, reader = tenant.key_with("portal:write"), tenant.key_with("portal:write", "webhooks:read")
    # Then a viewer's link needs webhooks:read and a developer's webhooks:write too
    assert_error(client.post("/v1/portal-links", json={}, headers=bare), 403, "forbidden")
    forbidden = client.post("/v1/portal-links", json={"role": "developer"}, headers=reader)
    assert_error(forbidden, 403, "forbidden")
    assert _link(core_app, reader)["role"] == "viewer"


def test_two_browsers_racing_on_one_link_get_one_session(
    core_app: Flask, tenant: TenantKeys
) -> None:
    link = _link(core_app, tenant.headers)
    token = _token(link)
    statuses: list[int] = []
    start = threading.Barrier(4)

    def open_it() -> None:
        client = core_app.test_client()
        start.wait()
        statuses.append(client.post("/v1/sessions/portal-link", json={"token": token}).status_code)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [200, 401, 401, 401], statuses


def test_an_expired_link_opens_nothing(
    core_app: Flask, tenant: TenantKeys, pg_db: Database
) -> None:
    link = _link(core_app, tenant.headers, expiresInSeconds=60)
    with pg_db.transaction() as session:
        session.execute(
            sa.update(PortalLink)
            .where(PortalLink.id == link["id"])
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    response = core_app.test_client().post("/v1/sessions/portal-link", json={"token": _token(link)})
    assert_error(response, 401, "unauthorized")


@pytest.mark.parametrize(
    "body",
    [
        {"role": "owner"},
        {"role": "admin"},
        {"expiresInSeconds": 901},
        {"expiresInSeconds": 0},
        {"expiresInSeconds": "900"},
        {"extra": True},
    ],
)
def test_a_link_is_at_most_a_developer_for_at_most_15_minutes(
    core_app: Flask, tenant: TenantKeys, body: dict[str, Any]
) -> None:
    response = core_app.test_client().post("/v1/portal-links", json=body, headers=tenant.headers)
    assert_error(response, 400, "invalid_request")


@pytest.mark.parametrize("token", ["", "plk_unknown", "sst_x", "plk_" + "a" * 300, "x\x00"])
def test_a_forged_link_token_opens_nothing(core_app: Flask, token: str) -> None:
    response = core_app.test_client().post("/v1/sessions/portal-link", json={"token": token})
    assert response.status_code in (400, 401), response.get_json()
    assert response.get_json()["code"] in ("invalid_request", "unauthorized")


def test_the_link_url_starts_with_the_public_base_url(
    core_context: CoreContext, tenant: TenantKeys
) -> None:
    # Without SETTLE_PUBLIC_URL the link is on the host the request came to
    plain = create_app(context=core_context)
    link = _link(plain, tenant.headers)
    assert link["url"].startswith("http://localhost/portal/link#plk_")
    # With it, on that base (behind an ingress that terminates TLS, say)
    config = dataclasses.replace(core_context.config, public_url="https://settle.example.com")
    configured = create_app(context=dataclasses.replace(core_context, config=config))
    link = _link(configured, tenant.headers)
    assert link["url"].startswith("https://settle.example.com/portal/link#plk_")
