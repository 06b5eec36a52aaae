"""Fuzz every operation of core's OpenAPI document (see tests/fuzz/harness.py)."""

from __future__ import annotations

import pytest
from flask import Flask

from shared.db import Database
from tests.conftest import TenantKeys, make_tenant
from tests.fuzz import harness

pytestmark = pytest.mark.fuzz

OPENAPI = "/v1/openapi.json"
#: USDC on Base to a plain wallet.
SEED_DESTINATION = {
    "chainId": 8453,
    "address": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
    "tokenAddress": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
}


def _seed(app: Flask, tenant: TenantKeys) -> None:
    """An account with a sandbox deposit, made through the API."""
    client = app.test_client()
    account = client.post(
        "/v1/deposit-accounts",
        json={"externalUserId": "fuzz-seed", "destination": SEED_DESTINATION},
        headers=tenant.headers,
    )
    assert account.status_code == 200, account.get_json()
    address = account.get_json()["depositAccount"]["depositAddresses"][0]
    deposit = client.post(
        "/v1/sandbox/deposits",
        json={
            "depositAddress": address["address"],
            "chainId": address["chainId"],
            "asset": "USDC",
            "amount": "125.50",
        },
        headers=tenant.headers,
    )
    assert deposit.status_code == 200, deposit.get_json()


def _run(request: pytest.FixtureRequest, app: Flask, variant: harness.Variant) -> None:
    report = harness.fuzz(app, OPENAPI, "core", variant)
    harness.remember(request.config, report)
    print(report.summary())
    if not variant.expect_unauthorized:
        for label, statuses in report.never_seen().items():
            print(f"  never answered: {label}: {', '.join(statuses)}")
    problems = report.problems()
    assert not problems, "\n\n".join(problems[:20])


# 26 operations with stateful links: minutes on a loaded 2-core machine.
@pytest.mark.timeout(900)
def test_core_with_a_full_scope_key_and_an_owner_session(
    request: pytest.FixtureRequest, core_app: Flask, pg_db: Database
) -> None:
    # Given a fresh sandbox tenant, its full-scope key and an owner's session, with an
    # account and a deposit already there (the fuzzer follows the ids lists give it)
    tenant = make_tenant(pg_db, sandbox=True)
    _seed(core_app, tenant)
    variant = harness.Variant(
        "full-scope key",
        harness.valid_credentials(pg_db, tenant),
        max_examples=harness.max_examples(100),
        # The member routes take the tenant id in the path: aim them at the member's own.
        parameters={"tenantId": tenant.tenant_id},
    )
    # When schemathesis fuzzes every operation, Then no check fails
    _run(request, core_app, variant)


# 26 operations with stateful links: minutes on a loaded 2-core machine.
@pytest.mark.timeout(900)
def test_core_with_an_owner_session_alone(
    request: pytest.FixtureRequest, core_app: Flask, pg_db: Database
) -> None:
    # Given a fresh sandbox tenant with an account and a deposit, and its owner signed
    # in (cookie and CSRF token, no API key)
    tenant = make_tenant(pg_db, sandbox=True)
    _seed(core_app, tenant)
    variant = harness.Variant(
        "owner session",
        harness.session_credentials(pg_db, tenant),
        max_examples=harness.max_examples(30),
        parameters={"tenantId": tenant.tenant_id},
    )
    # When schemathesis fuzzes every operation by session, Then no check fails
    _run(request, core_app, variant)


@pytest.mark.parametrize("credentials", ["none", "bad"])
def test_core_without_a_valid_key(
    request: pytest.FixtureRequest, core_app: Flask, credentials: str
) -> None:
    # Given no credentials, or an unknown key, session and CSRF token
    variant = harness.Variant(
        f"{credentials} key",
        None if credentials == "none" else harness.bad_credentials(),
        max_examples=harness.max_examples(10),
        phases=("examples", "fuzzing"),
        expect_unauthorized=True,
    )
    # When every operation is fuzzed, Then each protected one answers 401 in our format
    _run(request, core_app, variant)


def test_core_bodies_over_the_limit_answer_a_documented_413(
    core_app: Flask, pg_db: Database
) -> None:
    # Given valid credentials of a fresh tenant
    tenant = make_tenant(pg_db, sandbox=True)
    credentials = harness.valid_credentials(pg_db, tenant)
    # When every POST/PUT/PATCH gets a body over 256 KiB
    probed, problems = harness.oversized_body_problems(
        core_app, OPENAPI, credentials, {"tenantId": tenant.tenant_id}
    )
    # Then each answers 413 payload_too_large, and documents it
    assert probed >= 7
    assert not problems, "\n".join(problems)
