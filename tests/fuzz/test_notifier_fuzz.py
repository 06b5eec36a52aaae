"""Fuzz every operation of the notifier's OpenAPI document (see tests/fuzz/harness.py)."""

from __future__ import annotations

import pytest
from flask import Flask

from shared.db import Database
from tests.conftest import make_tenant
from tests.fuzz import harness

pytestmark = pytest.mark.fuzz

OPENAPI = "/v1/notifier/openapi.json"


def _run(request: pytest.FixtureRequest, app: Flask, variant: harness.Variant) -> None:
    report = harness.fuzz(app, OPENAPI, "notifier", variant)
    harness.remember(request.config, report)
    print(report.summary())
    if not variant.expect_unauthorized:
        for label, statuses in report.never_seen().items():
            print(f"  never answered: {label}: {', '.join(statuses)}")
    problems = report.problems()
    assert not problems, "\n\n".join(problems[:20])


def test_notifier_with_a_full_scope_key(
    request: pytest.FixtureRequest, notifier_fuzz_app: Flask, pg_db: Database
) -> None:
    # Given a fresh tenant and its full-scope key
    tenant = make_tenant(pg_db)
    variant = harness.Variant(
        "full-scope key", harness.valid_credentials(pg_db, tenant), harness.max_examples(100)
    )
    # When schemathesis fuzzes every operation, Then no check fails
    _run(request, notifier_fuzz_app, variant)


def test_notifier_with_an_owner_session_alone(
    request: pytest.FixtureRequest, notifier_fuzz_app: Flask, pg_db: Database
) -> None:
    # Given a fresh tenant's owner signed in (cookie and CSRF token, no API key): the
    # session core issued, which the notifier checks against identity itself
    tenant = make_tenant(pg_db)
    variant = harness.Variant(
        "owner session", harness.session_credentials(pg_db, tenant), harness.max_examples(30)
    )
    # When schemathesis fuzzes every operation by session, Then no check fails
    _run(request, notifier_fuzz_app, variant)


@pytest.mark.parametrize("credentials", ["none", "bad"])
def test_notifier_without_a_valid_key(
    request: pytest.FixtureRequest, notifier_fuzz_app: Flask, credentials: str
) -> None:
    # Given no credentials, or an unknown key
    variant = harness.Variant(
        f"{credentials} key",
        None if credentials == "none" else harness.bad_credentials(),
        max_examples=harness.max_examples(10),
        phases=("examples", "fuzzing"),
        expect_unauthorized=True,
    )
    # When every operation is fuzzed, Then each protected one answers 401 in our format
    _run(request, notifier_fuzz_app, variant)


def test_notifier_bodies_over_the_limit_answer_a_documented_413(
    notifier_fuzz_app: Flask, pg_db: Database
) -> None:
    # Given a fresh tenant's full-scope key
    tenant = make_tenant(pg_db)
    credentials = harness.Credentials(tenant.api_key)
    # When every POST/PATCH gets a body over 256 KiB
    probed, problems = harness.oversized_body_problems(notifier_fuzz_app, OPENAPI, credentials, {})
    # Then each answers 413 payload_too_large, and documents it
    assert probed >= 6
    assert not problems, "\n".join(problems)
