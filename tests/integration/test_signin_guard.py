"""Sign-in cannot be used as a weapon: floods wait longer each time, hashing is bounded.

Core's real app as production configures it (`CoreConfig.from_env`), on the real
PostgreSQL; clients at different addresses are requests with their own REMOTE_ADDR
(what ProxyFix leaves there behind the ingress). Issue 11 item 4: sign-in was an
open, unthrottled argon2 oracle (8 parallel wrong logins took GET /v1/chains from a
10 ms to a 223 ms median).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask
from werkzeug.test import TestResponse

from services.core.app import create_app
from services.core.config import CoreConfig
from services.core.context import CoreContext
from shared.db import Database
from shared.identity import service as identity
from tests.conftest import PASSWORD, make_tenant
from tests.integration.conftest import assert_error
from tests.support.keys import test_xpub as deposit_xpub
from tests.support.services import require_service

pytestmark = pytest.mark.integration

WRONG = "not the password, but long enough"


def production_like_app(pg_url: str, pg_db: Database, data_dir: Path, **env: str) -> Flask:
    """Core's app configured from the environment, as `settle core api` makes it."""
    config = CoreConfig.from_env(
        {
            "SETTLE_ENV": "dev",
            "SETTLE_DATABASE_URL": pg_url,
            "SETTLE_DATA_DIR": str(data_dir),
            "SETTLE_DEPOSIT_XPUB": deposit_xpub(),
            **env,
        }
    )
    return create_app(context=CoreContext.build(config, db=pg_db, identity_db=pg_db))


@pytest.fixture
def app(pg_url: str, pg_db: Database, tmp_path: Path) -> Flask:
    # A fresh app per test: its in-process store starts with no failures counted.
    return production_like_app(pg_url, pg_db, tmp_path)


@pytest.fixture(scope="module")
def members(pg_db: Database) -> Iterator[Callable[[], str]]:
    """Makes a member of one tenant (with PASSWORD) and returns their email."""
    tenant = make_tenant(pg_db)

    def make() -> str:
        email = f"member-{uuid.uuid4().hex[:10]}@example.com"
        with pg_db.transaction() as session:
            identity.add_member(session, tenant.tenant_id, email, "viewer", PASSWORD)
        return email

    yield make


def sign_in(app: Flask, email: str, password: str, address: str) -> TestResponse:
    return app.test_client().post(
        "/v1/sessions",
        json={"email": email, "password": password},
        environ_base={"REMOTE_ADDR": address},
    )


def retry_after(response: TestResponse) -> int:
    assert_error(response, 429, "rate_limited")
    return int(response.headers["Retry-After"])


def test_a_flood_of_wrong_passwords_waits_and_the_member_still_signs_in_elsewhere(
    app: Flask, members: Callable[[], str]
) -> None:
    email = members()
    attacker, member = "198.51.100.66", "203.0.113.7"

    # Given an attacker at one address trying wrong passwords for one member
    answers = [sign_in(app, email, WRONG, attacker) for _ in range(5)]
    # Then the first five are ordinary failures
    assert [a.status_code for a in answers] == [401] * 5

    # When they keep going, each further try is refused with Retry-After, and cheaply:
    # no password is checked (a check costs ~0.15 s of CPU)
    started = time.perf_counter()
    refused = [sign_in(app, email, WRONG, attacker) for _ in range(20)]
    elapsed = time.perf_counter() - started
    waits = [retry_after(r) for r in refused]
    assert all(1 <= w <= 2 for w in waits), waits
    assert elapsed < 20 * 0.05, elapsed
    assert "failed sign-ins" in refused[0].get_json()["error"]

    # And guessing right from there does not get around the wait
    assert retry_after(sign_in(app, email, PASSWORD, attacker)) >= 1

    # Then the member, at their own address, signs in at once
    assert sign_in(app, email, PASSWORD, member).status_code == 200


def test_waits_grow_after_each_failure_beyond_the_free_ones(
    app: Flask, members: Callable[[], str]
) -> None:
    email, address = members(), "198.51.100.67"
    for _ in range(5):
        assert sign_in(app, email, WRONG, address).status_code == 401
    # The sixth try is allowed once a second has passed, fails, and doubles the wait
    time.sleep(1.05)
    assert sign_in(app, email, WRONG, address).status_code == 401
    assert retry_after(sign_in(app, email, WRONG, address)) == 2
    time.sleep(2.05)
    assert sign_in(app, email, WRONG, address).status_code == 401
    assert retry_after(sign_in(app, email, WRONG, address)) == 4


def test_a_success_clears_the_failures_of_its_address(
    app: Flask, members: Callable[[], str]
) -> None:
    # Given a member who mistyped four times
    email, address = members(), "198.51.100.68"
    for _ in range(4):
        assert sign_in(app, email, WRONG, address).status_code == 401
    # When they sign in, then their next typos start counting from zero again
    assert sign_in(app, email, PASSWORD, address).status_code == 200
    answers = [sign_in(app, email, WRONG, address).status_code for _ in range(5)]
    assert answers == [401] * 5


def test_one_address_spraying_many_accounts_waits(app: Flask, members: Callable[[], str]) -> None:
    # Given one address trying one password against many emails (credential stuffing)
    address = "198.51.100.69"
    answers = [
        sign_in(app, f"nobody-{n}-{uuid.uuid4().hex[:6]}@example.com", WRONG, address)
        for n in range(21)
    ]
    # Then twenty are checked, and the next one waits
    assert [a.status_code for a in answers[:20]] == [401] * 20
    assert retry_after(answers[20]) >= 1
    # And another address is not affected
    assert sign_in(app, members(), PASSWORD, "203.0.113.8").status_code == 200


def test_many_addresses_against_one_account_wait_but_not_the_members_usual_address(
    app: Flask, members: Callable[[], str]
) -> None:
    email = members()
    # Given the member signed in before from their usual address
    usual = "203.0.113.9"
    assert sign_in(app, email, PASSWORD, usual).status_code == 200

    # When 20 addresses each try a wrong password once (a distributed guess)
    answers = [sign_in(app, email, WRONG, f"192.0.2.{n}") for n in range(1, 21)]
    assert [a.status_code for a in answers] == [401] * 20

    # Then a 21st address waits, never longer than the account's cap
    wait = retry_after(sign_in(app, email, PASSWORD, "192.0.2.200"))
    assert 1 <= wait <= 60
    # And the member at their usual address signs in at once
    assert sign_in(app, email, PASSWORD, usual).status_code == 200


def test_password_checks_at_once_are_bounded_and_the_rest_refused_quickly(
    app: Flask, members: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a probe on the real password check that counts how many run at once
    real = identity.check_password
    lock = threading.Lock()
    running, most = 0, 0

    def counted(password_hash: str | None, password: str) -> bool:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            return real(password_hash, password)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(identity, "check_password", counted)

    # When 8 clients at 8 addresses send wrong passwords for 8 emails at the same moment
    go = threading.Barrier(8)
    results: list[tuple[int, float, Any]] = []

    def client(n: int) -> None:
        go.wait()
        started = time.perf_counter()
        answer = sign_in(app, f"flood-{n}-{uuid.uuid4().hex[:6]}@example.com", WRONG, f"10.9.0.{n}")
        with lock:
            results.append((answer.status_code, time.perf_counter() - started, answer))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    # Then one process checks one password at a time (SETTLE_SIGNIN_CONCURRENCY, default 1)
    assert most == 1
    statuses = sorted(status for status, _, _ in results)
    assert len(statuses) == 8 and 401 in statuses and 503 in statuses, statuses
    # And the others are refused at once, not queued, and told when to come back
    for status, elapsed, answer in results:
        if status == 503:
            assert_error(answer, 503, "service_unavailable")
            assert answer.headers["Retry-After"] == "1"
            assert elapsed < 0.1, elapsed


def test_the_bound_is_a_setting(
    pg_url: str, pg_db: Database, tmp_path: Path, members: Callable[[], str]
) -> None:
    app = production_like_app(pg_url, pg_db, tmp_path, SETTLE_SIGNIN_CONCURRENCY="3")
    config = app.extensions["settle.core"].config
    assert config.signin.concurrency == 3
    assert replace(config.signin, concurrency=1).concurrency == 1
    assert sign_in(app, members(), PASSWORD, "203.0.113.10").status_code == 200


def test_two_api_processes_on_one_redis_count_failures_once(
    pg_url: str, pg_db: Database, tmp_path: Path, members: Callable[[], str]
) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    prefix = f"settle-test:{uuid.uuid4().hex}:"
    env = {"SETTLE_REDIS_URL": "redis://127.0.0.1:6379/0", "SETTLE_REDIS_PREFIX": prefix}
    # Given two API processes (apps) sharing one Redis
    a = production_like_app(pg_url, pg_db, tmp_path / "a", **env)
    b = production_like_app(pg_url, pg_db, tmp_path / "b", **env)
    email, address = members(), "198.51.100.70"
    try:
        # When one address's wrong passwords alternate between them
        answers = [sign_in(a if n % 2 else b, email, WRONG, address) for n in range(6)]
        # Then the five free failures are spent once, not five per process
        assert [r.status_code for r in answers[:5]] == [401] * 5
        assert retry_after(answers[5]) >= 1
    finally:
        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)
        client.close()


def test_metrics_count_each_outcome(app: Flask, members: Callable[[], str]) -> None:
    email, address = members(), "198.51.100.71"
    # Given one success, six failures and one attempt made to wait
    assert sign_in(app, email, PASSWORD, address).status_code == 200
    for _ in range(5):
        assert sign_in(app, email, WRONG, address).status_code == 401
    retry_after(sign_in(app, email, WRONG, address))
    # Then /metrics counts them by result (ops see a flood as it happens)
    text = app.test_client().get("/metrics").get_data(as_text=True)
    found = dict(
        re.findall(r'^settle_signin_attempts_total\{result="(\w+)"\} ([0-9.]+)$', text, re.M)
    )
    assert found == {"succeeded": "1.0", "failed": "5.0", "throttled": "1.0", "busy": "0.0"}
