"""A request that finds every pooled database connection busy is answered 503, not 500."""

from __future__ import annotations

import contextlib

import pytest
from flask.testing import FlaskClient

import shared.db
from shared.db import Database
from tests.conftest import TenantKeys

pytestmark = pytest.mark.integration


def test_a_request_that_waits_out_the_pool_is_answered_503_in_the_error_format(
    client: FlaskClient, tenant: TenantKeys, pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert client.get("/v1/deposit-accounts", headers=tenant.headers).status_code == 200
    monkeypatch.setattr(shared.db, "POOL_TIMEOUT_S", 0.2)
    # Given every connection of the fast executor's pool held (pool_size 5: 10 open)
    with contextlib.ExitStack() as stack:
        for _ in range(10):
            stack.enter_context(pg_db.driver_autocommit())
        # When a request needs one (every authenticated request looks its key up there)
        response = client.get("/v1/deposit-accounts", headers=tenant.headers)
    # Then it is refused as a saturated service, in the error format, with a retry hint
    assert response.status_code == 503, response.get_json()
    assert response.get_json() == {
        "error": "service_unavailable: every database connection is busy; retry in 1 s",
        "code": "service_unavailable",
    }
    assert response.headers["Retry-After"] == "1"
    # And once they are given back, requests are served again
    assert client.get("/v1/deposit-accounts", headers=tenant.headers).status_code == 200
