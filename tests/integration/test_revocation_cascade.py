"""Revoking a key or removing a member ends, at once, every portal link it handed out
and every session those links opened (issue 23: they used to outlive their grantor)."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event as sa_event

from shared.db import Database
from shared.identity import portal_links, service
from shared.timefmt import utcnow
from tests.conftest import TenantKeys
from tests.integration.conftest import assert_error
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    PUBLIC_URL,
    notifier_app_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration

HOOK = {"name": "support", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}


def _ok(response: Any) -> dict[str, Any]:
    assert response.status_code in (200, 204), (response.status_code, response.get_json())
    body: dict[str, Any] = response.get_json(silent=True) or {}
    return body


def _token(client: FlaskClient, headers: dict[str, str]) -> str:
    made = _ok(client.post("/v1/portal-links", json={"role": "developer"}, headers=headers))
    return str(made["portalLink"]["url"].partition("#")[2])


def _opened(core_app: Flask, notifier_app: Flask, token: str) -> tuple[FlaskClient, str]:
    """A notifier client carrying the session the link opened, and its CSRF token."""
    browser = core_app.test_client()
    session = _ok(browser.post("/v1/sessions/portal-link", json={"token": token}))["session"]
    cookie = browser.get_cookie("settle_session", path="/v1")
    assert cookie is not None
    notifier = notifier_app.test_client()
    notifier.set_cookie("settle_session", cookie.value, path="/v1")
    return notifier, str(session["csrfToken"])


def _assert_ended(core_app: Flask, notifier: FlaskClient, csrf: str, unopened: str) -> None:
    # The session no longer reads nor writes, and the unopened link no longer opens
    assert_error(notifier.get("/v1/webhook-endpoints"), 401, "unauthorized")
    wrote = notifier.post("/v1/webhook-endpoints", json=HOOK, headers={"X-CSRF-Token": csrf})
    assert_error(wrote, 401, "unauthorized")
    opened = core_app.test_client().post("/v1/sessions/portal-link", json={"token": unopened})
    assert_error(opened, 401, "unauthorized")


def test_revoking_a_key_ends_its_links_and_their_sessions(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    # Given a key that made two links, one opened (its session writes) and one not
    client = core_app.test_client()
    made = _ok(
        client.post(
            "/v1/api-keys",
            json={"scopes": ["portal:write", "webhooks:read", "webhooks:write"]},
            headers=tenant.headers,
        )
    )
    key = {"Authorization": f"Bearer {made['secret']}"}
    notifier, csrf = _opened(core_app, notifier_app, _token(client, key))
    unopened = _token(client, key)
    _ok(notifier.post("/v1/webhook-endpoints", json=HOOK, headers={"X-CSRF-Token": csrf}))
    # When the key is revoked
    _ok(client.delete(f"/v1/api-keys/{made['apiKey']['id']}", headers=tenant.headers))
    # Then the link's session and the unopened link end with it, at once
    _assert_ended(core_app, notifier, csrf, unopened)


def test_removing_a_member_ends_their_sessions_links_and_the_links_sessions(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    # Given an admin, signed in, who made two links, one opened
    admin = tenant.signed_in("admin")
    browser = admin.client(core_app)
    notifier, csrf = _opened(core_app, notifier_app, _token(browser, admin.headers))
    unopened = _token(browser, admin.headers)
    # When the admin is removed
    client = core_app.test_client()
    _ok(client.delete(f"/v1/members/{admin.member_id}", headers=tenant.headers))
    # Then their own session has ended
    assert_error(browser.get("/v1/sessions/current"), 401, "unauthorized")
    # And so have their links and the links' sessions
    _assert_ended(core_app, notifier, csrf, unopened)


def test_a_link_opened_while_its_key_is_revoked_never_outlives_the_revocation(
    core_app: Flask,
    notifier_app: Flask,
    tenant: TenantKeys,
    pg_db: Database,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a key's unopened link, and someone opening it: their clock is read just
    # before the key's revocation reads its own, and their UPDATE reaches the link's
    # row while the revocation holds it
    client = core_app.test_client()
    made = _ok(
        client.post(
            "/v1/api-keys",
            json={"scopes": ["portal:write", "webhooks:read", "webhooks:write"]},
            headers=tenant.headers,
        )
    )
    key = {"Authorization": f"Bearer {made['secret']}"}
    token = _token(client, key)
    clock_read = threading.Event()

    def slow_clock() -> datetime:
        now = utcnow()
        clock_read.set()
        time.sleep(0.5)  # the revocation takes the row meanwhile
        return now

    monkeypatch.setattr(portal_links, "utcnow", slow_clock)
    opened: list[Any] = []
    browser = core_app.test_client()
    opener = threading.Thread(
        target=lambda: opened.append(
            browser.post("/v1/sessions/portal-link", json={"token": token})
        )
    )
    opener.start()
    assert clock_read.wait(10)
    # When the key is revoked (its transaction holds the link's row for a moment)
    with pg_db.transaction() as session:
        service.revoke_api_key(session, made["apiKey"]["id"])
        time.sleep(1.0)
    opener.join(10)

    # Then either the link did not open, or the session it opened is ended with it
    (answer,) = opened
    if answer.status_code == 200:
        cookie = browser.get_cookie("settle_session", path="/v1")
        assert cookie is not None
        notifier = notifier_app.test_client()
        notifier.set_cookie("settle_session", cookie.value, path="/v1")
        assert_error(notifier.get("/v1/webhook-endpoints"), 401, "unauthorized")
    else:
        assert_error(answer, 401, "unauthorized")


def test_the_cascade_finds_links_and_sessions_by_index_not_by_reading_the_tables(
    pg_db: Database,
) -> None:
    """end_grants runs under the revocation's locks: its statements must be able to
    reach a grantor's links and their sessions by index (identity_0005), whatever the
    size of the tables. Each statement it runs is explained with sequential scans
    priced out: a table with no usable index still shows a Seq Scan."""
    statements: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    with pg_db.transaction() as session:
        connection = session.connection()
        sa_event.listen(connection, "before_cursor_execute", capture)
        try:
            service.end_grants(session, "key_nobody", now=utcnow())
        finally:
            sa_event.remove(connection, "before_cursor_execute", capture)
        assert len(statements) == 2
        raw = connection.connection.driver_connection
        assert raw is not None
        raw.execute("SET LOCAL enable_seqscan = off")
        for statement, parameters in statements:
            plan = "\n".join(r[0] for r in raw.execute("EXPLAIN " + statement, parameters))
            assert "Seq Scan" not in plan, plan
        session.rollback()
