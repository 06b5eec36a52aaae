"""Every route of both services, classified: who may call it and what another tenant sees.

The table ROUTES names each (service, method, rule) of the apps' url_maps, so a
new route fails `test_every_route_is_classified` until someone decides its auth,
scope and isolation here. For each route:

- without credentials: 401 unauthorized (public routes excepted);
- a tenant route (API key or session): a key with every scope but the route's is
  403 insufficient_scope, a key with only that scope passes;
- every route a member reaches: a session of each role below the route's is 403
  forbidden, one at or above passes; an unsafe request without the session's own
  CSRF token is 403;
- a members-only route: an API key alone is 401; a member of another tenant gets
  404 for that tenant's id;
- tenant B, with a full-scope key and with its owner's session, asks for tenant A's
  objects (policy, account, deposit, webhook endpoint, delivery): 404 for ids, empty
  lists, its own singleton; and A's objects are exactly as they were afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from services.notifier.context import NotifierContext
from shared.db import Database
from shared.identity import service as identity
from shared.identity.auth import CSRF_HEADER, SESSION_COOKIE
from shared.identity.models import LINK_ROLES, LINK_SCOPES, ROLES, SCOPES, Member, PortalSession
from shared.identity.secrets import token_hash
from shared.timefmt import iso_ms, utcnow
from tests.conftest import SignedIn, TenantKeys, make_tenant
from tests.integration.conftest import (
    PASSWORD,
    USDC_POLYGON,
    WALLET_2,
    assert_error,
    destination,
)
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    PUBLIC_URL,
    EnqueueRecorder,
    notifier_app_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration

CORE, NOTIFIER = "core", "notifier"


@dataclass(frozen=True)
class Route:
    """How one route is reached, and what tenant B must see of tenant A through it.

    `url` and `body` are filled from the World (`{account}`, `{deposit}`, ...).
    `isolation`: "not_found" (A's id answers 404), "empty:<key>" (B's list under
    <key> is empty), "own" (B reads or writes its own singleton or new object),
    "none" (no tenant objects: fee quotes, B's own session).
    """

    auth: str  # "public", "tenant" (an API key or a session) or "session" (members only)
    url: str
    scope: str | None = None
    min_role: str | None = None
    body: dict[str, Any] | None = None
    isolation: str = "none"


NEW_DESTINATION = destination(137, WALLET_2, USDC_POLYGON)
HOOK = {"name": "B's hook", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}

#: Every route of both apps. Keys are (service, method, werkzeug rule).
ROUTES: dict[tuple[str, str, str], Route] = {
    # -- core: public
    (CORE, "GET", "/v1/openapi.json"): Route("public", "/v1/openapi.json"),
    (CORE, "GET", "/v1/chains"): Route("public", "/v1/chains"),
    (CORE, "GET", "/v1/event-types"): Route("public", "/v1/event-types"),
    (CORE, "GET", "/v1/docs"): Route("public", "/v1/docs"),
    (CORE, "GET", "/v1/docs/assets/<name>"): Route("public", "/v1/docs/assets/swagger-ui.css"),
    (CORE, "GET", "/v1/status"): Route("public", "/v1/status"),
    # The key that verifies statements: an auditor has no API key.
    (CORE, "GET", "/v1/statements/key"): Route("public", "/v1/statements/key"),
    (CORE, "POST", "/v1/sessions"): Route("public", "/v1/sessions", body={}),
    # Ops scrape /metrics on the service port; the ingress does not route it.
    (CORE, "GET", "/metrics"): Route("public", "/metrics"),
    # -- core: API key or session
    (CORE, "GET", "/v1/destination-policy"): Route(
        "tenant", "/v1/destination-policy", "destination_policy:read", "viewer", isolation="own"
    ),
    (CORE, "PUT", "/v1/destination-policy"): Route(
        "tenant",
        "/v1/destination-policy",
        "destination_policy:write",
        "developer",
        body={"destination": NEW_DESTINATION},
        isolation="own",
    ),
    (CORE, "GET", "/v1/deposit-accounts"): Route(
        "tenant",
        "/v1/deposit-accounts",
        "deposit_accounts:read",
        "viewer",
        isolation="empty:depositAccounts",
    ),
    (CORE, "POST", "/v1/deposit-accounts"): Route(
        "tenant",
        "/v1/deposit-accounts",
        "deposit_accounts:write",
        "developer",
        # A's externalUserId: B gets an account of its own, never account_exists.
        body={"externalUserId": "{account}", "destination": NEW_DESTINATION},
        isolation="own",
    ),
    (CORE, "GET", "/v1/deposit-accounts/<path:externalUserId>"): Route(
        "tenant",
        "/v1/deposit-accounts/{account}",
        "deposit_accounts:read",
        "viewer",
        isolation="not_found",
    ),
    (CORE, "PATCH", "/v1/deposit-accounts/<path:externalUserId>/destination"): Route(
        "tenant",
        "/v1/deposit-accounts/{account}/destination",
        "deposit_accounts:write",
        "developer",
        body={"destination": NEW_DESTINATION},
        isolation="not_found",
    ),
    (CORE, "POST", "/v1/fee-preview"): Route(
        "tenant", "/v1/fee-preview", "fees:read", "viewer", body={"amount": "100"}
    ),
    (CORE, "GET", "/v1/deposits"): Route(
        "tenant",
        "/v1/deposits?externalUserId={account}",
        "deposits:read",
        "viewer",
        isolation="empty:deposits",
    ),
    (CORE, "GET", "/v1/deposits/<string:depositId>"): Route(
        "tenant", "/v1/deposits/{deposit}", "deposits:read", "viewer", isolation="not_found"
    ),
    (CORE, "GET", "/v1/deposits/<string:depositId>/timeline"): Route(
        "tenant",
        "/v1/deposits/{deposit}/timeline",
        "deposits:read",
        "viewer",
        isolation="not_found",
    ),
    (CORE, "GET", "/v1/statements"): Route(
        "tenant",
        "/v1/statements?from={recent}",
        "deposits:read",
        "viewer",
        # B's own statement (its tenant id, its deposits: none), never A's
        isolation="own",
    ),
    (CORE, "POST", "/v1/sandbox/deposits"): Route(
        "tenant",
        "/v1/sandbox/deposits",
        "sandbox:write",
        "developer",
        # A's deposit address: not B's, so 404.
        body={
            "depositAddress": "{address}",
            "chainId": "{chain}",
            "asset": "USDC",
            "amount": "10",
        },
        isolation="not_found",
    ),
    # -- core: the portal's pages (static files; their data comes from the APIs)
    (CORE, "GET", "/"): Route("page", "/"),
    (CORE, "GET", "/portal"): Route("page", "/portal"),
    (CORE, "GET", "/portal/"): Route("page", "/portal/"),
    (CORE, "GET", "/portal/link"): Route("page", "/portal/link"),
    (CORE, "GET", "/portal/static/<path:name>"): Route("page", "/portal/static/js/app.js"),
    # -- core: access (API keys, members, portal links): admin and up
    (CORE, "GET", "/v1/api-keys"): Route(
        "tenant", "/v1/api-keys", "api_keys:write", "admin", isolation="own"
    ),
    (CORE, "POST", "/v1/api-keys"): Route(
        "tenant",
        "/v1/api-keys",
        "api_keys:write",
        "admin",
        # A scope every caller that passes holds (a key never gives one it lacks).
        body={"name": "made by the matrix", "scopes": ["api_keys:write"]},
        isolation="own",
    ),
    (CORE, "DELETE", "/v1/api-keys/<apiKeyId>"): Route(
        "tenant", "/v1/api-keys/{key}", "api_keys:write", "admin", isolation="not_found"
    ),
    (CORE, "GET", "/v1/members"): Route(
        "tenant", "/v1/members", "members:write", "admin", isolation="own"
    ),
    (CORE, "POST", "/v1/members"): Route(
        "tenant",
        "/v1/members",
        "members:write",
        "admin",
        body={"email": "matrix-{nonce}@example.com", "role": "viewer", "password": PASSWORD},
        isolation="own",
    ),
    (CORE, "PATCH", "/v1/members/<memberId>"): Route(
        "tenant",
        "/v1/members/{member}",
        "members:write",
        "admin",
        body={"role": "developer"},
        isolation="not_found",
    ),
    (CORE, "DELETE", "/v1/members/<memberId>"): Route(
        "tenant", "/v1/members/{member}", "members:write", "admin", isolation="not_found"
    ),
    (CORE, "POST", "/v1/portal-links"): Route(
        "tenant", "/v1/portal-links", "portal:write", "admin", body={}, isolation="own"
    ),
    (CORE, "POST", "/v1/sessions/portal-link"): Route(
        "public", "/v1/sessions/portal-link", body={}
    ),
    (CORE, "DELETE", "/v1/members/<memberId>/mfa"): Route(
        "tenant", "/v1/members/{member}/mfa", "members:write", "admin", isolation="not_found"
    ),
    # -- core: the audit log (admins and owners read it)
    (CORE, "GET", "/v1/audit-events"): Route(
        "tenant", "/v1/audit-events", "audit:read", "admin", isolation="empty:auditEvents"
    ),
    # -- core: portal session
    (CORE, "GET", "/v1/tenants/<tenantId>/destination-policy"): Route(
        "session", "/v1/tenants/{tenant}/destination-policy", min_role="viewer"
    ),
    (CORE, "PUT", "/v1/tenants/<tenantId>/destination-policy"): Route(
        "session",
        "/v1/tenants/{tenant}/destination-policy",
        min_role="developer",
        body={"destination": NEW_DESTINATION},
    ),
    (CORE, "GET", "/v1/sessions/current"): Route(
        "session", "/v1/sessions/current", min_role="viewer"
    ),
    (CORE, "DELETE", "/v1/sessions/current"): Route(
        "session", "/v1/sessions/current", min_role="viewer"
    ),
    (CORE, "POST", "/v1/sessions/current/step-up"): Route(
        "session", "/v1/sessions/current/step-up", min_role="viewer", body={"password": PASSWORD}
    ),
    # -- core: a member's own second factor, and the tenant's rule (owners set it)
    (CORE, "GET", "/v1/me/mfa"): Route("session", "/v1/me/mfa", min_role="viewer"),
    (CORE, "DELETE", "/v1/me/mfa"): Route("session", "/v1/me/mfa", min_role="viewer"),
    (CORE, "POST", "/v1/me/mfa/enrolment"): Route(
        "session", "/v1/me/mfa/enrolment", min_role="viewer"
    ),
    (CORE, "POST", "/v1/me/mfa/enrolment/confirm"): Route(
        "session", "/v1/me/mfa/enrolment/confirm", min_role="viewer", body={"code": "000000"}
    ),
    (CORE, "POST", "/v1/me/mfa/recovery-codes"): Route(
        "session", "/v1/me/mfa/recovery-codes", min_role="viewer"
    ),
    (CORE, "GET", "/v1/tenants/<tenantId>/security"): Route(
        "session", "/v1/tenants/{tenant}/security", min_role="viewer"
    ),
    (CORE, "PUT", "/v1/tenants/<tenantId>/security"): Route(
        "session",
        "/v1/tenants/{tenant}/security",
        min_role="owner",
        body={"requireMfa": False},
    ),
    # -- notifier: public
    (NOTIFIER, "GET", "/v1/notifier/openapi.json"): Route("public", "/v1/notifier/openapi.json"),
    (NOTIFIER, "GET", "/v1/notifier/status"): Route("public", "/v1/notifier/status"),
    (NOTIFIER, "GET", "/metrics"): Route("public", "/metrics"),
    # -- notifier: API key or session
    (NOTIFIER, "GET", "/v1/webhook-endpoints"): Route(
        "tenant",
        "/v1/webhook-endpoints",
        "webhooks:read",
        "viewer",
        isolation="empty:webhookEndpoints",
    ),
    (NOTIFIER, "POST", "/v1/webhook-endpoints"): Route(
        "tenant", "/v1/webhook-endpoints", "webhooks:write", "developer", body=HOOK, isolation="own"
    ),
    (NOTIFIER, "GET", "/v1/webhook-endpoints/<endpointId>"): Route(
        "tenant",
        "/v1/webhook-endpoints/{endpoint}",
        "webhooks:read",
        "viewer",
        isolation="not_found",
    ),
    (NOTIFIER, "GET", "/v1/webhook-endpoints/<endpointId>/stats"): Route(
        "tenant",
        "/v1/webhook-endpoints/{endpoint}/stats",
        "webhooks:read",
        "viewer",
        isolation="not_found",
    ),
    (NOTIFIER, "PATCH", "/v1/webhook-endpoints/<endpointId>"): Route(
        "tenant",
        "/v1/webhook-endpoints/{endpoint}",
        "webhooks:write",
        "developer",
        body={"status": "disabled"},
        isolation="not_found",
    ),
    (NOTIFIER, "DELETE", "/v1/webhook-endpoints/<endpointId>"): Route(
        "tenant",
        "/v1/webhook-endpoints/{endpoint}",
        "webhooks:write",
        "developer",
        isolation="not_found",
    ),
    (NOTIFIER, "POST", "/v1/webhook-endpoints/<endpointId>/rotate-secret"): Route(
        "tenant",
        "/v1/webhook-endpoints/{endpoint}/rotate-secret",
        "webhooks:write",
        "developer",
        body={},
        isolation="not_found",
    ),
    (NOTIFIER, "POST", "/v1/webhook-endpoints/<endpointId>/test"): Route(
        "tenant",
        "/v1/webhook-endpoints/{endpoint}/test",
        "webhooks:write",
        "developer",
        isolation="not_found",
    ),
    (NOTIFIER, "POST", "/v1/webhook-endpoints/<endpointId>/recover"): Route(
        "tenant",
        "/v1/webhook-endpoints/{endpoint}/recover",
        "webhooks:write",
        "developer",
        body={"since": "{recent}"},
        isolation="not_found",
    ),
    (NOTIFIER, "POST", "/v1/webhook-endpoints/<endpointId>/renew"): Route(
        "tenant",
        "/v1/webhook-endpoints/{endpoint}/renew",
        "webhooks:write",
        "developer",
        body={},
        isolation="not_found",
    ),
    (NOTIFIER, "GET", "/v1/webhook-deliveries"): Route(
        "tenant",
        "/v1/webhook-deliveries?endpointId={endpoint}",
        "webhooks:read",
        "viewer",
        isolation="empty:webhookDeliveries",
    ),
    (NOTIFIER, "GET", "/v1/webhook-deliveries/<deliveryId>"): Route(
        "tenant",
        "/v1/webhook-deliveries/{delivery}",
        "webhooks:read",
        "viewer",
        isolation="not_found",
    ),
    (NOTIFIER, "POST", "/v1/webhook-deliveries/<deliveryId>/replay"): Route(
        "tenant",
        "/v1/webhook-deliveries/{delivery}/replay",
        "webhooks:write",
        "developer",
        isolation="not_found",
    ),
}

#: Routes that take an API key with their scope, or a session of their role.
TENANT_ROUTES = [key for key, route in ROUTES.items() if route.auth == "tenant"]
#: Routes only a signed-in member reaches.
SESSION_ROUTES = [key for key, route in ROUTES.items() if route.auth == "session"]
PUBLIC_ROUTES = [key for key, route in ROUTES.items() if route.auth == "public"]
#: The portal's files: no tenant data, no credentials.
PAGE_ROUTES = [key for key, route in ROUTES.items() if route.auth == "page"]
#: Session routes that take the tenant id in the path.
PATH_TENANT_ROUTES = [key for key in SESSION_ROUTES if "<tenantId>" in key[2]]
#: Every route a signed-in member reaches.
MEMBER_ROUTES = TENANT_ROUTES + SESSION_ROUTES
UNSAFE_MEMBER_ROUTES = [key for key in MEMBER_ROUTES if key[1] != "GET"]
#: What a session a portal link opened reaches: the webhook routes and the session itself.
LINK_ROUTES = {key for key in TENANT_ROUTES if ROUTES[key].scope in LINK_SCOPES} | {
    (CORE, "GET", "/v1/sessions/current"),
    (CORE, "DELETE", "/v1/sessions/current"),
}


def _id(key: tuple[str, str, str]) -> str:
    return f"{key[0]} {key[1]} {key[2]}"


# -- the world: tenant A's objects, tenant B, members -------------------------------


@dataclass
class World:
    a: TenantKeys
    values: dict[str, str]
    #: Members' emails: A's viewer and owner, B's owner.
    emails: dict[str, str]


@pytest.fixture(scope="module")
def notifier_enqueue(notifier_context: NotifierContext) -> Iterator[EnqueueRecorder]:
    """Deliveries made by these tests are recorded, never sent."""
    recorder = EnqueueRecorder()
    previous = notifier_context.enqueue
    notifier_context.enqueue = recorder
    yield recorder
    notifier_context.enqueue = previous


@pytest.fixture(scope="module")
def world(
    core_app: Flask, notifier_app: Flask, pg_db: Database, notifier_enqueue: EnqueueRecorder
) -> World:
    """Tenant A with a policy, an account, a sandbox deposit, an endpoint and a delivery."""
    a, b = make_tenant(pg_db, sandbox=True), make_tenant(pg_db, sandbox=True)
    # B's member belongs to a tenant of its own; B's API-key requests come from a fresh
    # tenant per test (tenant_b), so no test sees objects another made.
    core, notifier = core_app.test_client(), notifier_app.test_client()
    ok(core.put("/v1/destination-policy", json={"destination": destination()}, headers=a.headers))
    account_id = f"user/{uuid.uuid4().hex[:8]} é"  # "/", " " and "é" travel URL-encoded
    account = ok(
        core.post("/v1/deposit-accounts", json={"externalUserId": account_id}, headers=a.headers)
    )["depositAccount"]
    address = account["depositAddresses"][0]
    deposit = ok(
        core.post(
            "/v1/sandbox/deposits",
            json={
                "depositAddress": address["address"],
                "chainId": address["chainId"],
                "asset": "USDC",
                "amount": "125.50",
            },
            headers=a.headers,
        )
    )["deposit"]
    hook = {"name": "A's hook", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}
    endpoint = ok(notifier.post("/v1/webhook-endpoints", json=hook, headers=a.headers))
    endpoint_id = endpoint["webhookEndpoint"]["id"]
    delivery = ok(notifier.post(f"/v1/webhook-endpoints/{endpoint_id}/test", headers=a.headers))
    emails = {
        name: f"{name}-{uuid.uuid4().hex[:10]}@example.com" for name in ("a_viewer", "a", "b")
    }
    with pg_db.transaction() as session:
        viewer = identity.add_member(session, a.tenant_id, emails["a_viewer"], "viewer", PASSWORD)
        identity.add_member(session, a.tenant_id, emails["a"], "owner", PASSWORD)
        identity.add_member(session, b.tenant_id, emails["b"], "owner", PASSWORD)
        member_ids = {"a_viewer": viewer.id}
    values = {
        "tenant": a.tenant_id,
        "account": quote(account_id, safe=""),
        "account_raw": account_id,
        "deposit": deposit["id"],
        "address": address["address"],
        "chain": str(address["chainId"]),
        "endpoint": endpoint_id,
        "delivery": delivery["webhookDelivery"]["id"],
        "recent": iso_ms(utcnow() - timedelta(days=1)),
        "key": a.api_key_id,
        "member": member_ids["a_viewer"],
    }
    return World(a, values, emails)


@pytest.fixture
def tenant_b(pg_db: Database) -> TenantKeys:
    """Tenant B: a fresh sandbox tenant with a full-scope key, nothing of its own yet."""
    return make_tenant(pg_db, sandbox=True)


def ok(response: TestResponse) -> dict[str, Any]:
    assert response.status_code == 200, (response.status_code, response.get_json())
    body: dict[str, Any] = response.get_json()
    return body


def client_for(key: tuple[str, str, str], core_app: Flask, notifier_app: Flask) -> FlaskClient:
    return (core_app if key[0] == CORE else notifier_app).test_client()


def send(
    client: FlaskClient,
    key: tuple[str, str, str],
    world: World,
    headers: dict[str, str] | None = None,
    *,
    tenant: str | None = None,
) -> TestResponse:
    """The route's request, filled with A's objects (and `tenant` in the path, if given)."""
    route = ROUTES[key]
    url = route.url.format(**{**world.values, "tenant": tenant or world.values["tenant"]})
    body = None
    if route.body is not None:
        body = {
            name: _fill(value, world) if isinstance(value, str) else value
            for name, value in route.body.items()
        }
    return client.open(url, method=key[1], json=body, headers=headers or {})


def _fill(value: str, world: World) -> Any:
    if value == "{chain}":
        return int(world.values["chain"])
    if value == "{account}":
        return world.values["account_raw"]
    return value.format(**world.values, nonce=uuid.uuid4().hex[:12])


def sign_in(client: FlaskClient, email: str) -> dict[str, str]:
    """Sign `client` in (it keeps the cookie); the CSRF header for unsafe requests."""
    session = ok(client.post("/v1/sessions", json={"email": email, "password": PASSWORD}))
    return {CSRF_HEADER: session["session"]["csrfToken"]}


def snapshot(core_app: Flask, notifier_app: Flask, world: World) -> dict[str, Any]:
    """What tenant A sees of its objects (endpoint `updatedAt` included)."""
    core, notifier, headers = core_app.test_client(), notifier_app.test_client(), world.a.headers
    values = world.values
    return {
        "policy": ok(core.get("/v1/destination-policy", headers=headers)),
        "accounts": ok(core.get("/v1/deposit-accounts", headers=headers)),
        "deposits": ok(core.get("/v1/deposits", headers=headers)),
        "endpoint": ok(
            notifier.get(f"/v1/webhook-endpoints/{values['endpoint']}", headers=headers)
        ),
        "deliveries": ok(notifier.get("/v1/webhook-deliveries", headers=headers)),
        "apiKeys": ok(core.get("/v1/api-keys", headers=headers)),
        "members": ok(core.get("/v1/members", headers=headers)),
        "audit": ok(core.get("/v1/audit-events", headers=headers)),
    }


# -- classification -----------------------------------------------------------------


def test_every_route_is_classified(core_app: Flask, notifier_app: Flask) -> None:
    # Given both apps' url_maps
    served = {
        (service, method, rule.rule)
        for service, app in ((CORE, core_app), (NOTIFIER, notifier_app))
        for rule in app.url_map.iter_rules()
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}
    }
    # Then the table names exactly these routes (a new one must be classified here)
    assert served - set(ROUTES) == set(), "routes missing from ROUTES"
    assert set(ROUTES) - served == set(), "ROUTES names routes the apps do not serve"
    # And every tenant route names a known scope and the role a session needs for it;
    # the public ones are the agreed few
    for key in TENANT_ROUTES:
        assert ROUTES[key].scope in SCOPES, key
    for key in MEMBER_ROUTES:
        assert ROUTES[key].min_role in ROLES, key
    assert {(method, rule) for _, method, rule in PUBLIC_ROUTES} == {
        ("GET", "/v1/chains"),
        ("GET", "/v1/event-types"),
        ("GET", "/v1/docs"),
        ("GET", "/v1/docs/assets/<name>"),
        ("GET", "/v1/status"),
        ("GET", "/v1/statements/key"),
        ("GET", "/v1/notifier/status"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/v1/notifier/openapi.json"),
        ("POST", "/v1/sessions"),
        ("POST", "/v1/sessions/portal-link"),
        ("GET", "/metrics"),
    }


#: Scopes that hand out access, and the audit log: an admin's (DESIGN.md: admin also API
#: keys and members; issue 23: the audit log for admins and owners).
ADMIN_SCOPES = {"api_keys:write", "members:write", "portal:write", "audit:read"}


def test_roles_follow_design(core_app: Flask) -> None:
    # The roles of DESIGN.md: a viewer reads everything; a developer also writes
    # (policy, destinations, endpoints, tests, replays, recoveries, sandbox deposits);
    # an admin also manages API keys, members and portal links
    for key in TENANT_ROUTES:
        route = ROUTES[key]
        scope = str(route.scope)
        expected = (
            "admin"
            if scope in ADMIN_SCOPES
            else "viewer"
            if scope.endswith(":read")
            else "developer"
        )
        assert route.min_role == expected, key


# -- authentication and scopes ------------------------------------------------------


@pytest.mark.parametrize("key", MEMBER_ROUTES, ids=_id)
def test_without_credentials_a_private_route_is_401(
    key: tuple[str, str, str], core_app: Flask, notifier_app: Flask, world: World
) -> None:
    # When the route is called with no key and no session
    response = send(client_for(key, core_app, notifier_app), key, world)
    # Then 401 unauthorized
    assert_error(response, 401, "unauthorized")


@pytest.mark.parametrize("key", PUBLIC_ROUTES, ids=_id)
def test_a_public_route_needs_no_credentials(
    key: tuple[str, str, str], core_app: Flask, notifier_app: Flask, world: World
) -> None:
    # When a public route is called with no credentials
    response = send(client_for(key, core_app, notifier_app), key, world)
    # Then it answers (sign-in with an empty body: 400 naming the fields), never 401
    expected = 400 if key[2].startswith("/v1/sessions") else 200
    assert response.status_code == expected, response.get_json()


@pytest.mark.parametrize("key", PAGE_ROUTES, ids=_id)
def test_a_portal_page_is_a_file_with_no_data(
    key: tuple[str, str, str], core_app: Flask, world: World
) -> None:
    # When a page route is asked with no credentials, and with A's owner's session
    signed = core_app.test_client()
    sign_in(signed, world.emails["a"])
    for client in (core_app.test_client(), signed):
        response = send(client, key, world)
        # Then it is a redirect to /portal/ or the same static file for both
        if key[2] in ("/", "/portal"):
            assert response.status_code in (301, 302)
            assert response.headers["Location"].endswith("/portal/")
            continue
        assert response.status_code == 200
        assert "default-src 'none'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        text = response.get_data(as_text=True)
        assert world.a.tenant_id not in text and world.emails["a"] not in text
    # And nothing outside the app's folder is served
    for escape in (
        "/portal/static/../web.py",
        "/portal/static/%2e%2e/web.py",
        "/portal/static//etc/passwd",
    ):
        response = core_app.test_client().get(escape, follow_redirects=True)
        assert response.status_code == 404, escape


@pytest.mark.parametrize("key", TENANT_ROUTES, ids=_id)
def test_a_key_without_the_routes_scope_is_403_and_with_it_passes(
    key: tuple[str, str, str],
    core_app: Flask,
    notifier_app: Flask,
    world: World,
    tenant_b: TenantKeys,
) -> None:
    scope = ROUTES[key].scope
    client = client_for(key, core_app, notifier_app)
    # Given tenant B's key with every scope but the route's
    others = tenant_b.key_with(*[s for s in SCOPES if s != scope])
    # When it calls the route, Then 403 insufficient_scope naming the scope
    body = assert_error(send(client, key, world, others), 403, "insufficient_scope")
    assert str(scope) in body["error"]
    # And a key with only that scope gets past authentication and the scope check (a
    # key with members:write alone may still not make a member who reads more than it:
    # that is 403 forbidden, never insufficient_scope)
    only = tenant_b.key_with(str(scope))
    response = send(client, key, world, only)
    assert response.status_code != 401, response.get_json()
    assert (response.get_json(silent=True) or {}).get("code") != "insufficient_scope"


@pytest.mark.parametrize("key", SESSION_ROUTES, ids=_id)
def test_an_api_key_alone_does_not_open_a_session_route(
    key: tuple[str, str, str], core_app: Flask, notifier_app: Flask, world: World
) -> None:
    # When tenant A's full-scope key calls a route only members reach, Then 401
    response = send(client_for(key, core_app, notifier_app), key, world, world.a.headers)
    assert_error(response, 401, "unauthorized")


# -- sessions: roles and CSRF -------------------------------------------------------


@pytest.fixture(scope="module")
def tenant_c(pg_db: Database) -> TenantKeys:
    """Tenant C: its members of each role try every route (on A's ids: 404 when allowed)."""
    return make_tenant(pg_db, sandbox=True)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("key", MEMBER_ROUTES, ids=_id)
def test_a_session_of_each_role_is_allowed_or_refused(
    key: tuple[str, str, str],
    role: str,
    core_app: Flask,
    notifier_app: Flask,
    world: World,
    tenant_c: TenantKeys,
) -> None:
    route = ROUTES[key]
    app = core_app if key[0] == CORE else notifier_app
    # Given a signed-in member of tenant C with `role` (C's own tenant id in the path)
    member = tenant_c.signed_in(role)
    client = member.client(app)
    # When the member calls the route with the session's CSRF token
    response = send(client, key, world, member.headers, tenant=tenant_c.tenant_id)
    # Then a role at or above the route's passes authorization; a lower one is 403
    if ROLES.index(role) >= ROLES.index(str(route.min_role)):
        assert response.status_code not in (401, 403), response.get_json()
    else:
        body = assert_error(response, 403, "forbidden")
        assert f"{route.min_role} role" in body["error"], body


def link_session(core_app: Flask, tenant: TenantKeys, role: str) -> SignedIn:
    """A portal link of `tenant` with `role`, opened: the session it gives a browser."""
    core = core_app.test_client()
    made = ok(core.post("/v1/portal-links", json={"role": role}, headers=tenant.headers))
    token = made["portalLink"]["url"].partition("#")[2]
    session = ok(core.post("/v1/sessions/portal-link", json={"token": token}))["session"]
    cookie = core.get_cookie(SESSION_COOKIE, path="/v1")
    assert cookie is not None
    return SignedIn(tenant.tenant_id, "", "", role, cookie.value, session["csrfToken"])


@pytest.mark.parametrize("role", LINK_ROLES)
@pytest.mark.parametrize("key", MEMBER_ROUTES, ids=_id)
def test_a_portal_link_session_reaches_the_webhook_routes_only(
    key: tuple[str, str, str],
    role: str,
    core_app: Flask,
    notifier_app: Flask,
    world: World,
    tenant_c: TenantKeys,
) -> None:
    route = ROUTES[key]
    app = core_app if key[0] == CORE else notifier_app
    # Given a portal link of tenant C with `role`, opened in a browser
    link = link_session(core_app, tenant_c, role)
    # When the browser calls the route (C's tenant id in the path) with its CSRF token
    response = send(link.client(app), key, world, link.headers, tenant=tenant_c.tenant_id)
    # Then a webhook route answers as for a member of that role; anything else is 403
    if key in LINK_ROUTES and ROLES.index(role) >= ROLES.index(str(route.min_role)):
        assert response.status_code not in (401, 403), response.get_json()
    else:
        assert_error(response, 403, "forbidden")


@pytest.mark.parametrize("key", UNSAFE_MEMBER_ROUTES, ids=_id)
def test_an_unsafe_session_request_needs_its_own_csrf_token(
    key: tuple[str, str, str],
    core_app: Flask,
    notifier_app: Flask,
    world: World,
    tenant_c: TenantKeys,
) -> None:
    app = core_app if key[0] == CORE else notifier_app
    # Given C's owner, signed in, and another session of C (its token is no stand-in)
    owner, other = tenant_c.signed_in("owner"), tenant_c.signed_in("owner")
    client = owner.client(app)
    for headers in ({}, {CSRF_HEADER: ""}, {CSRF_HEADER: "csrf_forged"}, other.headers):
        # When an unsafe request carries no token, a forged one or another session's
        response = send(client, key, world, headers, tenant=tenant_c.tenant_id)
        # Then 403 forbidden, before anything is read or written
        assert_error(response, 403, "forbidden")
    # And the session itself still works (the refusals did not end it)
    assert owner.client(core_app).get("/v1/sessions/current").status_code == 200


def test_the_notifier_takes_the_session_core_signed_in(
    core_app: Flask, notifier_app: Flask, world: World
) -> None:
    # Given A's viewer signs in through core's sign-in route (a password, a cookie)
    signed = core_app.test_client()
    csrf = sign_in(signed, world.emails["a_viewer"])
    cookie = signed.get_cookie(SESSION_COOKIE, path="/v1")
    assert cookie is not None and cookie.path == "/v1"
    # When the notifier (another app: it reads identity, it never calls core) gets it
    notifier = notifier_app.test_client()
    notifier.set_cookie(SESSION_COOKIE, cookie.value, path="/v1")
    listed = ok(notifier.get(f"/v1/webhook-deliveries?endpointId={world.values['endpoint']}"))
    # Then it lists A's deliveries
    assert [d["id"] for d in listed["webhookDeliveries"]] == [world.values["delivery"]]
    # And once the member signs out through core, the notifier refuses the same cookie
    assert signed.delete("/v1/sessions/current", headers=csrf).status_code == 204
    assert_error(notifier.get("/v1/webhook-endpoints"), 401, "unauthorized")


def test_a_signed_out_or_expired_session_opens_nothing(
    core_app: Flask, notifier_app: Flask, pg_db: Database, tenant_c: TenantKeys
) -> None:
    # Given two signed-in developers of C
    gone, expired = tenant_c.signed_in("developer"), tenant_c.signed_in("developer")
    core, notifier = gone.client(core_app), gone.client(notifier_app)
    assert notifier.get("/v1/webhook-endpoints").status_code == 200
    # When one signs out and the other's session passes its expiry
    assert core.delete("/v1/sessions/current", headers=gone.headers).status_code == 204
    with pg_db.transaction() as session:
        session.execute(
            sa.update(PortalSession)
            .where(PortalSession.token_hash == token_hash(expired.token))
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    # Then neither opens a route of either service, with or without its CSRF token
    for member in (gone, expired):
        for app, url in (
            (core_app, "/v1/deposit-accounts"),
            (notifier_app, "/v1/webhook-endpoints"),
        ):
            client = member.client(app)
            assert_error(client.get(url), 401, "unauthorized")
            assert_error(client.post(url, json={}, headers=member.headers), 401, "unauthorized")


def test_a_role_change_applies_to_the_next_request(
    core_app: Flask, notifier_app: Flask, pg_db: Database, tenant_c: TenantKeys
) -> None:
    # Given a signed-in developer of C who can register endpoints
    member = tenant_c.signed_in("developer")
    client = member.client(notifier_app)
    hook = {"name": "C's hook", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}
    ok(client.post("/v1/webhook-endpoints", json=hook, headers=member.headers))
    # When the member is made a viewer
    with pg_db.transaction() as session:
        session.execute(
            sa.update(Member).where(Member.id == member.member_id).values(role="viewer")
        )
    # Then the same session is refused the write on its next request, and still reads
    assert_error(
        client.post("/v1/webhook-endpoints", json=hook, headers=member.headers), 403, "forbidden"
    )
    assert client.get("/v1/webhook-endpoints").status_code == 200


def test_a_key_decides_whatever_cookie_rides_along(
    core_app: Flask, notifier_app: Flask, world: World, tenant_b: TenantKeys
) -> None:
    # Given A's owner's session cookie on the client
    signed = core_app.test_client()
    csrf = sign_in(signed, world.emails["a"])
    cookie = signed.get_cookie(SESSION_COOKIE, path="/v1")
    assert cookie is not None
    notifier = notifier_app.test_client()
    notifier.set_cookie(SESSION_COOKIE, cookie.value, path="/v1")
    endpoint = f"/v1/webhook-endpoints/{world.values['endpoint']}"
    # When the request also carries B's key, Then it is B's request: A's endpoint is 404
    assert_error(notifier.get(endpoint, headers=tenant_b.headers), 404, "not_found")
    # And an unknown or malformed key is 401, never a fall-back to the cookie
    for header in ("Bearer sk_unknown", "Bearer ", "Basic abc", "sk_nobearer"):
        response = notifier.get(endpoint, headers={"Authorization": header, **csrf})
        assert_error(response, 401, "unauthorized")
    # And the cookie alone is A's owner's
    assert notifier.get(endpoint).status_code == 200


# -- isolation ----------------------------------------------------------------------


@pytest.mark.parametrize("credential", ["key", "session", "link"])
@pytest.mark.parametrize("key", TENANT_ROUTES, ids=_id)
def test_tenant_b_never_reaches_tenant_a_objects(
    key: tuple[str, str, str],
    credential: str,
    core_app: Flask,
    notifier_app: Flask,
    world: World,
    tenant_b: TenantKeys,
) -> None:
    route = ROUTES[key]
    before = snapshot(core_app, notifier_app, world)
    client = client_for(key, core_app, notifier_app)
    headers = tenant_b.headers
    if credential == "session":
        # B's owner, signed in, instead of B's full-scope key
        owner = tenant_b.signed_in("owner")
        client, headers = owner.client(client.application), owner.headers
    if credential == "link":
        # A developer's portal link of B, opened, instead of B's full-scope key
        link = link_session(core_app, tenant_b, "developer")
        client, headers = link.client(client.application), link.headers
    # When tenant B asks the route about A's objects
    response = send(client, key, world, headers)
    if credential == "link" and key not in LINK_ROUTES:
        # (a link opens the webhook routes only: the rest refuse before any lookup)
        assert_error(response, 403, "forbidden")
        assert snapshot(core_app, notifier_app, world) == before
        return
    # Then A's ids answer exactly as ids that do not exist, and lists show nothing of A
    if route.isolation == "not_found":
        assert_error(response, 404, "not_found")
    elif route.isolation.startswith("empty:"):
        listed = ok(response)[route.isolation.partition(":")[2]]
        assert listed == [], listed
    elif route.isolation == "own":
        body = ok(response)
        text = str(body)
        for name in ("tenant", "endpoint", "key", "member"):
            assert world.values[name] not in text, name
        if key[2] == "/v1/destination-policy":
            # B's own (B has none to read; B's write makes B's), never A's
            policy = body["destinationPolicy"]
            assert (policy is None) == (key[1] == "GET")
            assert policy is None or policy["tenantId"] == tenant_b.tenant_id
    else:
        assert response.status_code == 200, response.get_json()
    # And nothing of A changed
    assert snapshot(core_app, notifier_app, world) == before


@pytest.mark.parametrize("key", PATH_TENANT_ROUTES, ids=_id)
def test_a_member_of_b_reaches_nothing_of_a(
    key: tuple[str, str, str], core_app: Flask, world: World
) -> None:
    # Given B's owner, signed in
    client = core_app.test_client()
    csrf = sign_in(client, world.emails["b"])
    # When the member asks for tenant A's destination policy by A's tenant id
    response = send(client, key, world, csrf)
    # Then 404, exactly as for a tenant that does not exist
    assert_error(response, 404, "not_found")
    # And A's own member reads it (the 404 is isolation, not a wrong URL)
    own = core_app.test_client()
    sign_in(own, world.emails["a"])
    assert own.get(ROUTES[key].url.format(**world.values)).status_code == 200


def test_b_session_shows_b_only(core_app: Flask, world: World) -> None:
    # Given B's owner, signed in
    client = core_app.test_client()
    sign_in(client, world.emails["b"])
    # When it reads the current session, Then it is B's
    session = ok(client.get("/v1/sessions/current"))["session"]
    assert session["tenantId"] != world.a.tenant_id
    assert session["email"] == world.emails["b"]


def test_the_world_is_what_b_is_denied(core_app: Flask, notifier_app: Flask, world: World) -> None:
    # Given A's own key, Then every object B was refused exists for A (the 404s above
    # are isolation, not typos in the table)
    core, notifier, headers = core_app.test_client(), notifier_app.test_client(), world.a.headers
    values = world.values
    ok(core.get(f"/v1/deposit-accounts/{values['account']}", headers=headers))
    ok(core.get(f"/v1/deposits/{values['deposit']}", headers=headers))
    ok(core.get(f"/v1/deposits?externalUserId={values['account']}", headers=headers))
    ok(notifier.get(f"/v1/webhook-endpoints/{values['endpoint']}", headers=headers))
    ok(notifier.get(f"/v1/webhook-deliveries/{values['delivery']}", headers=headers))
    listed = ok(
        notifier.get(f"/v1/webhook-deliveries?endpointId={values['endpoint']}", headers=headers)
    )
    assert [d["id"] for d in listed["webhookDeliveries"]] == [values["delivery"]]
    policy = ok(core.get("/v1/destination-policy", headers=headers))["destinationPolicy"]
    assert policy["destination"] == destination()
