"""`settle listen` leaves nothing behind: its endpoint is ephemeral.

`settle listen` runs as a real process against core and the notifier served on
127.0.0.1 (the dev server's path split, SETTLE_WEBHOOK_ALLOW_PRIVATE on, the real
PostgreSQL). It is killed with SIGKILL, so it cannot clean up: its endpoint must be
gone within the ttl it asked for, and must never have counted against the limit.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa
from flask import Flask
from werkzeug.serving import make_server

from services.dev import PathDispatcher
from services.notifier import webhook_endpoints
from services.notifier.app import create_app
from services.notifier.context import NotifierContext
from services.notifier.models import Endpoint
from shared.db import Database
from tests.conftest import TenantKeys, make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    notifier_context_fixture,
)
from tests.support.pipeline import wait_until

pytestmark = pytest.mark.integration

SETTLE = str(Path(sys.executable).parent / "settle")
#: The ttl the test's listen asks for (the default is 300 s).
TTL_S = 6


@pytest.fixture(scope="module")
def dev_context(notifier_context: NotifierContext) -> NotifierContext:
    config = dataclasses.replace(notifier_context.config, allow_private=True)
    return dataclasses.replace(notifier_context, config=config, max_endpoints_per_tenant=3)


@pytest.fixture(scope="module")
def api_url(core_app: Flask, dev_context: NotifierContext) -> Iterator[str]:
    app = PathDispatcher(core_app, create_app(context=dev_context))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def _listen(api_url: str, tenant: TenantKeys) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    proc = subprocess.Popen(
        [SETTLE, "listen", "--api", api_url, "--api-key", tenant.api_key, "--ttl", str(TTL_S)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd="/",
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "Ready" in line:
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"settle listen did not start: {proc.stdout.read()}")


def _endpoints(api_url: str, tenant: TenantKeys) -> list[dict[str, Any]]:
    answer = requests.get(f"{api_url}/v1/webhook-endpoints", headers=tenant.headers, timeout=10)
    answer.raise_for_status()
    return list(answer.json()["webhookEndpoints"])


def _create(api_url: str, tenant: TenantKeys, n: int) -> requests.Response:
    body = {"name": f"permanent {n}", "url": f"http://127.0.0.1:9/{n}", "eventTypes": ["*"]}
    return requests.post(
        f"{api_url}/v1/webhook-endpoints", json=body, headers=tenant.headers, timeout=10
    )


def test_a_killed_listen_leaves_no_endpoint_and_never_counted(
    api_url: str, dev_context: NotifierContext, pg_db: Database
) -> None:
    # Given `settle listen` running for a tenant whose limit is 3 endpoints
    tenant = make_tenant(pg_db)
    listen = _listen(api_url, tenant)
    try:
        (mine,) = _endpoints(api_url, tenant)
        assert mine["ephemeral"] is True and mine["expiresAt"] is not None
        # Then its endpoint does not count: 3 permanent ones still fit, a 4th does not
        for n in range(3):
            assert _create(api_url, tenant, n).status_code == 200
        refused = _create(api_url, tenant, 3)
        assert refused.status_code == 409, refused.json()
        # And while listen runs, it renews the endpoint past its first ttl
        time.sleep(TTL_S + 2)
        assert mine["id"] in [e["id"] for e in _endpoints(api_url, tenant)]
    finally:
        # When listen is killed with SIGKILL (no chance to delete its endpoint)
        killed_at = time.monotonic()
        listen.send_signal(signal.SIGKILL)
        listen.wait(10)

    # Then the endpoint is gone within its ttl (checked every 0.2 s)
    wait_until(
        lambda: mine["id"] not in [e["id"] for e in _endpoints(api_url, tenant)],
        TTL_S + 2,
        "the killed listen's endpoint to expire",
        interval=0.2,
    )
    gone_after = time.monotonic() - killed_at
    assert gone_after <= TTL_S + 1.5, gone_after
    got = requests.get(
        f"{api_url}/v1/webhook-endpoints/{mine['id']}", headers=tenant.headers, timeout=10
    )
    assert got.status_code == 404
    # And the sweeper's pass deletes it for good (its unfinished deliveries stop)
    with pg_db.transaction() as session:
        expired = webhook_endpoints.expire_endpoints(session)
    assert mine["id"] in expired
    with pg_db.reader() as session:
        row = session.scalar(sa.select(Endpoint).where(Endpoint.id == mine["id"]))
        assert row is not None and row.deleted_at is not None


def test_renewing_and_the_ephemeral_cap(api_url: str, pg_db: Database) -> None:
    tenant = make_tenant(pg_db)
    base = f"{api_url}/v1/webhook-endpoints"
    permanent = _create(api_url, tenant, 0).json()["webhookEndpoint"]
    # A permanent endpoint cannot be renewed (409), an unknown one is 404
    renew = requests.post(f"{base}/{permanent['id']}/renew", headers=tenant.headers, timeout=10)
    assert renew.status_code == 409
    assert (
        requests.post(f"{base}/we_nope/renew", headers=tenant.headers, timeout=10).status_code
        == 404
    )
    # Bad ttls are 400s naming the field
    for bad in (0, 4, 3601, "60", True, 1.5):
        body = {"name": "x", "url": "http://127.0.0.1:9/x", "eventTypes": ["*"]}
        answer = requests.post(
            base, json={**body, "ephemeralTtlSeconds": bad}, headers=tenant.headers, timeout=10
        )
        assert answer.status_code == 400 and "ephemeralTtlSeconds" in answer.json()["error"], bad
    # At most MAX_EPHEMERAL_ENDPOINTS ephemeral ones at once
    body = {"url": "http://127.0.0.1:9/e", "eventTypes": ["*"], "ephemeralTtlSeconds": 60}
    made = [
        requests.post(base, json={**body, "name": f"e{n}"}, headers=tenant.headers, timeout=10)
        for n in range(webhook_endpoints.MAX_EPHEMERAL_ENDPOINTS + 1)
    ]
    assert [m.status_code for m in made[:-1]] == [200] * webhook_endpoints.MAX_EPHEMERAL_ENDPOINTS
    assert made[-1].status_code == 409
    # And a renewal moves expiresAt forward
    first = made[0].json()["webhookEndpoint"]
    renewed = requests.post(
        f"{base}/{first['id']}/renew", json={"ttlSeconds": 600}, headers=tenant.headers, timeout=10
    ).json()["webhookEndpoint"]
    assert renewed["expiresAt"] > first["expiresAt"]
