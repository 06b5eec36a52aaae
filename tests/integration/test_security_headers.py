"""Headers a browser needs to keep pages and sessions safe (issue 23).

Every HTML page either service serves (the portal, `/v1/docs`, even a redirect's
little body) forbids framing (CSP `frame-ancestors 'none'`, `X-Frame-Options: DENY`)
and sniffing; every answer about a session (sign-in, step-up, the session read, a
portal link's session, second-factor enrolment) is `Cache-Control: no-store` and
`nosniff`, failures included, so no cache keeps a CSRF token or recovery codes.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from tests.conftest import PASSWORD, TenantKeys
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    notifier_app_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration


def _assert_page_protected(response: Any, what: str) -> None:
    csp = response.headers.get("Content-Security-Policy", "")
    assert "frame-ancestors 'none'" in csp, (what, csp)
    assert response.headers.get("X-Frame-Options") == "DENY", what
    assert response.headers.get("X-Content-Type-Options") == "nosniff", what


def _assert_not_stored(response: Any, what: str) -> None:
    assert response.headers.get("Cache-Control") == "no-store", (what, response.headers)
    assert response.headers.get("X-Content-Type-Options") == "nosniff", what


@pytest.mark.parametrize("service", ["core", "notifier"])
def test_every_html_page_forbids_framing(
    service: str, core_app: Flask, notifier_app: Flask
) -> None:
    app = core_app if service == "core" else notifier_app
    client = app.test_client()
    pages = 0
    for rule in app.url_map.iter_rules():
        if "GET" not in (rule.methods or set()) or "<" in rule.rule:
            continue
        response = client.get(rule.rule)
        if response.mimetype == "text/html":
            pages += 1
            _assert_page_protected(response, rule.rule)
    if service == "core":
        assert pages >= 4  # /, /portal, /portal/, /portal/link, /v1/docs
    for path in ("/portal/static/style.css", "/v1/docs/assets/swagger-ui.css", "/v1/chains"):
        response = client.get(path)
        assert response.headers.get("X-Content-Type-Options") == "nosniff", path


def test_the_docs_page_names_its_inline_script(core_app: Flask) -> None:
    # The reference's one inline script runs under the CSP by its hash, nothing else does
    response = core_app.test_client().get("/v1/docs")
    csp = response.headers["Content-Security-Policy"]
    assert (
        "script-src 'self' 'sha256-" in csp and "'unsafe-inline'" not in csp.split("style-src")[0]
    )


def test_every_session_answer_is_not_stored(core_app: Flask, tenant: TenantKeys) -> None:
    member = tenant.signed_in("admin")
    client = core_app.test_client()
    # Sign-in, right and wrong
    signed = client.post("/v1/sessions", json={"email": member.email, "password": PASSWORD})
    assert signed.status_code == 200, signed.get_json()
    _assert_not_stored(signed, "sign-in")
    csrf = {"X-CSRF-Token": signed.get_json()["session"]["csrfToken"]}
    wrong = core_app.test_client().post(
        "/v1/sessions", json={"email": member.email, "password": "wrong password!"}
    )
    assert wrong.status_code == 401
    _assert_not_stored(wrong, "failed sign-in")
    # The session read, a step-up, enrolment of a second factor
    _assert_not_stored(client.get("/v1/sessions/current"), "session read")
    stepped = client.post("/v1/sessions/current/step-up", json={"password": PASSWORD}, headers=csrf)
    assert stepped.status_code == 200, stepped.get_json()
    _assert_not_stored(stepped, "step-up")
    _assert_not_stored(client.get("/v1/me/mfa"), "mfa read")
    enrolment = client.post("/v1/me/mfa/enrolment", headers=csrf)
    assert enrolment.status_code == 200, enrolment.get_json()
    _assert_not_stored(enrolment, "mfa enrolment")
    # A portal link's session
    link = core_app.test_client().post("/v1/portal-links", json={}, headers=tenant.headers)
    token = link.get_json()["portalLink"]["url"].partition("#")[2]
    opened = core_app.test_client().post("/v1/sessions/portal-link", json={"token": token})
    assert opened.status_code == 200
    _assert_not_stored(opened, "portal link session")
    # Signing out
    _assert_not_stored(client.delete("/v1/sessions/current", headers=csrf), "sign-out")
