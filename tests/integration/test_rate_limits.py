"""Abuse limits on the real apps: 429 with Retry-After, the budget in headers, 413."""

from __future__ import annotations

from dataclasses import replace

import pytest
from flask.testing import FlaskClient

from services.core.app import create_app
from services.core.context import CoreContext
from shared.ratelimit import RateLimitConfig
from tests.conftest import TenantKeys

pytestmark = pytest.mark.integration


@pytest.fixture
def limited_client(core_context: CoreContext) -> FlaskClient:
    # A core app whose keys may make 3 requests at once, then one a second.
    context = replace(
        core_context,
        config=replace(
            core_context.config,
            rate_limits=RateLimitConfig(per_key_rate=1, per_key_burst=3, per_ip_rate=0),
        ),
    )
    return create_app(context=context).test_client()


def test_an_api_key_over_its_budget_gets_429_with_retry_after(
    limited_client: FlaskClient, tenant: TenantKeys
) -> None:
    # Given a key that spends its burst, the budget counts down in the headers
    answers = [
        limited_client.get("/v1/destination-policy", headers=tenant.headers) for _ in range(3)
    ]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.headers["RateLimit-Remaining"] for a in answers] == ["2", "1", "0"]
    # When it asks once more at once, it is refused in the error format with Retry-After
    refused = limited_client.get("/v1/destination-policy", headers=tenant.headers)
    assert refused.status_code == 429
    assert refused.json["code"] == "rate_limited"
    assert refused.json["error"].startswith("rate_limited: ")
    assert int(refused.headers["Retry-After"]) >= 1
    # Then another tenant's key is not affected
    other = {"Authorization": "Bearer sk_someone_else_entirely"}
    assert limited_client.get("/v1/destination-policy", headers=other).status_code == 401


def test_a_body_over_256_kib_is_413_in_the_error_format(
    client: FlaskClient, tenant: TenantKeys
) -> None:
    body = b'{"externalUserId": "' + b"x" * (256 * 1024) + b'"}'
    answer = client.post(
        "/v1/deposit-accounts",
        data=body,
        headers={**tenant.headers, "Content-Type": "application/json"},
    )
    assert answer.status_code == 413
    assert answer.json == {
        "error": "payload_too_large: body exceeds 256 KiB",
        "code": "payload_too_large",
    }
