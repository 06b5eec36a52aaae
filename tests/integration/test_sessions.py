"""Portal sign-in, the current session and sign-out, on real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from services.core.app import create_app
from services.core.context import CoreContext
from shared.db import Database
from tests.conftest import core_config
from tests.integration.conftest import (
    PASSWORD,
    TIMESTAMP,
    Portal,
    assert_error,
    csrf_headers,
)

pytestmark = pytest.mark.integration


def _set_cookie(response: object) -> str:
    headers = response.headers.getlist("Set-Cookie")  # type: ignore[attr-defined]
    cookies = [h for h in headers if h.startswith("settle_session=")]
    assert len(cookies) == 1, headers
    return str(cookies[0])


def test_sign_in_read_and_sign_out(core_app: Flask, portal: Portal) -> None:
    client = core_app.test_client()

    # When a member signs in (the email in any case)
    response = client.post(
        "/v1/sessions",
        json={"email": portal.emails["developer"].upper(), "password": PASSWORD},
    )

    # Then the session comes back with a CSRF token and an HttpOnly cookie
    assert response.status_code == 200, response.get_json()
    session = response.get_json()["session"]
    assert set(session) == {
        "id",
        "tenantId",
        "memberId",
        "email",
        "role",
        "csrfToken",
        "createdAt",
        "expiresAt",
        "mfaEnabled",
        "mfaEnrolmentRequired",
        "stepUpExpiresAt",
    }
    assert session["tenantId"] == portal.tenant.tenant_id
    assert session["email"] == portal.emails["developer"]
    assert session["role"] == "developer"
    assert session["id"].startswith("ses_") and session["memberId"].startswith("mem_")
    assert TIMESTAMP.match(session["createdAt"]) and TIMESTAMP.match(session["expiresAt"])
    assert session["expiresAt"] > session["createdAt"]
    cookie = _set_cookie(response)
    attributes = [part.strip() for part in cookie.split(";")]
    assert attributes[0].startswith("settle_session=sst_")
    assert "HttpOnly" in attributes and "SameSite=Lax" in attributes and "Path=/v1" in attributes
    assert "Secure" not in attributes  # dev
    # The token is only in the cookie, never in the body
    assert attributes[0].split("=", 1)[1] not in response.get_data(as_text=True)

    # And the current session reads back without the CSRF token
    current = client.get("/v1/sessions/current")
    assert current.status_code == 200
    assert current.get_json() == {"session": {k: v for k, v in session.items() if k != "csrfToken"}}

    # When signing out without the CSRF header, then it is refused and the session lives
    assert_error(client.delete("/v1/sessions/current"), 403, "forbidden")
    assert client.get("/v1/sessions/current").status_code == 200

    # When signing out with it, then 204, the cookie is cleared and the session is over
    out = client.delete("/v1/sessions/current", headers=csrf_headers(session["csrfToken"]))
    assert out.status_code == 204 and out.get_data() == b""
    cleared = _set_cookie(out)
    assert cleared.startswith("settle_session=;") and "Path=/v1" in cleared
    assert "Max-Age=0" in cleared or "1970" in cleared
    assert_error(client.get("/v1/sessions/current"), 401, "unauthorized")


def test_the_old_cookie_is_dead_after_sign_out(core_app: Flask, portal: Portal) -> None:
    # Given a session whose cookie value an attacker kept
    client, csrf = portal.client(core_app, "viewer")
    token = client.get_cookie("settle_session", path="/v1")
    assert token is not None
    assert client.delete("/v1/sessions/current", headers=csrf_headers(csrf)).status_code == 204

    # When the kept cookie is replayed, then it is refused
    replay = core_app.test_client()
    replay.set_cookie("settle_session", token.value, path="/v1")
    assert_error(replay.get("/v1/sessions/current"), 401, "unauthorized")


@pytest.mark.parametrize(
    "body",
    [
        {"email": "nobody-here@example.com", "password": PASSWORD},
        {"email": "@viewer", "password": "wrong password, long enough"},
    ],
)
def test_bad_credentials_are_401(core_app: Flask, portal: Portal, body: dict[str, str]) -> None:
    email = portal.emails["viewer"] if body["email"] == "@viewer" else body["email"]
    response = core_app.test_client().post("/v1/sessions", json={**body, "email": email})
    assert_error(response, 401, "unauthorized")
    assert "settle_session=" not in " ".join(response.headers.getlist("Set-Cookie"))


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"email": "a@example.com"},
        {"email": 5, "password": "x"},
        [],
        {"email": "", "password": ""},
    ],
)
def test_malformed_sign_in_is_400(client: FlaskClient, body: object) -> None:
    assert_error(client.post("/v1/sessions", json=body), 400, "invalid_request")


def test_no_session_is_401(client: FlaskClient) -> None:
    assert_error(client.get("/v1/sessions/current"), 401, "unauthorized")
    assert_error(client.delete("/v1/sessions/current"), 401, "unauthorized")
    client.set_cookie("settle_session", "sst_forged", path="/v1")
    assert_error(client.get("/v1/sessions/current"), 401, "unauthorized")


def test_cookie_is_secure_outside_dev(
    pg_url: str, pg_db: Database, portal: Portal, tmp_path: Path
) -> None:
    # Given core configured for production
    config = core_config(pg_url, tmp_path, env="production")
    app = create_app(context=CoreContext.build(config, db=pg_db, identity_db=pg_db))

    # When a member signs in, then the cookie is Secure as well
    response = app.test_client().post(
        "/v1/sessions", json={"email": portal.emails["viewer"], "password": PASSWORD}
    )
    assert response.status_code == 200
    assert "Secure" in [part.strip() for part in _set_cookie(response).split(";")]
