"""Step-up: sensitive changes on a session need a password or code from the last 5 minutes.

Each action is refused (403 step_up_required, nothing changed, nothing recorded) on a
session whose last factor is older; it goes through after `POST
/v1/sessions/current/step-up`. API keys are never asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyotp
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from shared.db import Database
from shared.identity.models import AuditEvent, PortalSession
from shared.identity.secrets import token_hash
from shared.timefmt import utcnow
from tests.conftest import PASSWORD, SignedIn, TenantKeys
from tests.integration.conftest import WALLET_2, assert_error, destination
from tests.integration.notifier_fixtures import (  # noqa: F401  (fixtures)
    notifier_app_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration

HOOK = "https://hooks.example.com/settle"


def age_factor(db: Database, token: str, minutes: float = 6) -> None:
    """The session's last password or code given `minutes` ago."""
    with db.transaction() as session:
        session.execute(
            sa.update(PortalSession)
            .where(PortalSession.token_hash == token_hash(token))
            .values(factor_at=utcnow() - timedelta(minutes=minutes))
        )


def audit_count(db: Database, tenant_id: str) -> int:
    with db.reader() as session:
        return int(
            session.scalar(
                sa.select(sa.func.count())
                .select_from(AuditEvent)
                .where(AuditEvent.tenant_id == tenant_id)
            )
            or 0
        )


@dataclass
class Action:
    """A sensitive change: which app serves it, and the call (given a client and headers)."""

    name: str
    notifier: bool
    call: Callable[[FlaskClient, dict[str, str]], Any]
    ok_status: int = 200
    #: A session-only route (keys have the other one).
    sessions_only: bool = False


def actions(tenant: TenantKeys, setup: dict[str, str]) -> list[Action]:
    policy = {"destination": destination(address=WALLET_2)}
    account = setup["account"]
    return [
        Action(
            "PUT /v1/destination-policy",
            False,
            lambda c, h: c.put("/v1/destination-policy", json=policy, headers=h),
        ),
        Action(
            "PUT /v1/tenants/{id}/destination-policy",
            False,
            lambda c, h: c.put(
                f"/v1/tenants/{tenant.tenant_id}/destination-policy", json=policy, headers=h
            ),
            sessions_only=True,
        ),
        Action(
            "PATCH an account's destination",
            False,
            lambda c, h: c.patch(
                f"/v1/deposit-accounts/{account}/destination", json=policy, headers=h
            ),
        ),
        Action(
            "POST /v1/api-keys",
            False,
            lambda c, h: c.post("/v1/api-keys", json={"scopes": ["fees:read"]}, headers=h),
        ),
        Action(
            "PATCH a member's role",
            False,
            lambda c, h: c.patch(
                f"/v1/members/{setup['member']}", json={"role": "developer"}, headers=h
            ),
        ),
        Action(
            "POST rotate-secret",
            True,
            lambda c, h: c.post(
                f"/v1/webhook-endpoints/{setup['endpoint']}/rotate-secret", json={}, headers=h
            ),
        ),
    ]


@pytest.fixture
def setup(client: FlaskClient, notifier_app: Flask, tenant: TenantKeys) -> dict[str, str]:
    """An account, a viewer member and an endpoint of the tenant to act on."""
    account = f"user-{tenant.tenant_id[:8]}"
    made = client.post(
        "/v1/deposit-accounts",
        json={"externalUserId": account, "destination": destination()},
        headers=tenant.headers,
    )
    assert made.status_code == 200, made.get_json()
    member = tenant.signed_in("viewer").member_id
    endpoint = notifier_app.test_client().post(
        "/v1/webhook-endpoints",
        json={"name": "hook", "url": HOOK, "eventTypes": ["webhook.test"]},
        headers=tenant.headers,
    )
    assert endpoint.status_code == 200, endpoint.get_json()
    return {
        "account": account,
        "member": member,
        "endpoint": endpoint.get_json()["webhookEndpoint"]["id"],
    }


def test_each_step_up_action_is_refused_without_a_fresh_factor(
    core_app: Flask,
    notifier_app: Flask,
    pg_db: Database,
    tenant: TenantKeys,
    setup: dict[str, str],
) -> None:
    # Given an owner whose last password was given six minutes ago
    owner = tenant.signed_in("owner")
    age_factor(pg_db, owner.token)
    for action in actions(tenant, setup):
        app = notifier_app if action.notifier else core_app
        client = owner.client(app)
        recorded = audit_count(pg_db, tenant.tenant_id)
        # When the owner makes the change: 403 step_up_required, and nothing happened
        refused = action.call(client, owner.headers)
        body = assert_error(refused, 403, "step_up_required")
        assert "step-up" in body["error"], body
        assert audit_count(pg_db, tenant.tenant_id) == recorded, action.name
        # Then after giving the password again, the same change goes through
        stepped = owner.client(core_app).post(
            "/v1/sessions/current/step-up", json={"password": PASSWORD}, headers=owner.headers
        )
        assert stepped.status_code == 200, stepped.get_json()
        assert stepped.get_json()["session"]["stepUpExpiresAt"] > utcnow().isoformat()[:19]
        done = action.call(owner.client(app), owner.headers)
        assert done.status_code == action.ok_status, (action.name, done.get_json())
        age_factor(pg_db, owner.token)


def test_api_keys_are_never_asked(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys, setup: dict[str, str]
) -> None:
    for action in actions(tenant, setup):
        if action.sessions_only:
            continue
        app = notifier_app if action.notifier else core_app
        response = action.call(app.test_client(), tenant.headers)
        assert response.status_code == action.ok_status, (action.name, response.get_json())


def test_a_wrong_password_does_not_step_up(
    core_app: Flask, pg_db: Database, tenant: TenantKeys, setup: dict[str, str]
) -> None:
    owner = tenant.signed_in("owner")
    age_factor(pg_db, owner.token)
    client = owner.client(core_app)
    wrong = client.post(
        "/v1/sessions/current/step-up", json={"password": "not the password"}, headers=owner.headers
    )
    assert_error(wrong, 401, "unauthorized")
    policy = {"destination": destination(address=WALLET_2)}
    still = client.put("/v1/destination-policy", json=policy, headers=owner.headers)
    assert_error(still, 403, "step_up_required")
    # and exactly one of password and code, with a CSRF token
    for body in ({}, {"password": PASSWORD, "code": "123456"}):
        assert_error(
            client.post("/v1/sessions/current/step-up", json=body, headers=owner.headers),
            400,
            "invalid_request",
        )
    no_csrf = client.post("/v1/sessions/current/step-up", json={"password": PASSWORD})
    assert_error(no_csrf, 403, "forbidden")


def test_a_member_with_two_factor_steps_up_with_a_code(
    core_app: Flask, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a member with an authenticator app, their factor aged
    owner: SignedIn = tenant.signed_in("owner")
    client = owner.client(core_app)
    enrolment = client.post("/v1/me/mfa/enrolment", headers=owner.headers).get_json()["enrolment"]
    totp = pyotp.TOTP(enrolment["secret"])
    confirmed = client.post(
        "/v1/me/mfa/enrolment/confirm", json={"code": totp.now()}, headers=owner.headers
    )
    assert confirmed.status_code == 200, confirmed.get_json()
    age_factor(pg_db, owner.token)
    # Then the password alone does not step up; a code does, a recovery code too
    step = "/v1/sessions/current/step-up"
    password = client.post(step, json={"password": PASSWORD}, headers=owner.headers)
    assert_error(password, 401, "mfa_required")
    code = totp.at(utcnow().timestamp() + 30)
    assert client.post(step, json={"code": code}, headers=owner.headers).status_code == 200
    age_factor(pg_db, owner.token)
    assert_error(client.post(step, json={"code": code}, headers=owner.headers), 401, "unauthorized")
    recovery = confirmed.get_json()["recoveryCodes"][0]
    assert client.post(step, json={"code": recovery}, headers=owner.headers).status_code == 200


def test_a_portal_link_session_steps_up_only_by_opening_a_new_link(
    client: FlaskClient,
    notifier_app: Flask,
    pg_db: Database,
    tenant: TenantKeys,
    setup: dict[str, str],
) -> None:
    # Given a developer link's session, opened (its token given) just now
    link = client.post("/v1/portal-links", json={"role": "developer"}, headers=tenant.headers)
    token = link.get_json()["portalLink"]["url"].split("#", 1)[1]
    opened = client.post("/v1/sessions/portal-link", json={"token": token})
    cookie = opened.headers["Set-Cookie"].split(";", 1)[0].split("=", 1)[1]
    csrf = {"X-CSRF-Token": opened.get_json()["session"]["csrfToken"]}
    hooks = notifier_app.test_client()
    hooks.set_cookie("settle_session", cookie, path="/v1")
    rotate = f"/v1/webhook-endpoints/{setup['endpoint']}/rotate-secret"
    # Then it may rotate within 5 minutes of opening, not after
    assert hooks.post(rotate, json={}, headers=csrf).status_code == 200
    age_factor(pg_db, cookie)
    assert_error(hooks.post(rotate, json={}, headers=csrf), 403, "step_up_required")
