"""What the API answers while the database changes hands: a safe request is run again,
anything the failover still cuts is a 503 with Retry-After in the error format (never a
500), and any other database error stays a 500."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from flask import Flask

from shared import failover
from shared.api import make_api


def _cut(sqlstate: str | None = None) -> Exception:
    """The error a statement raises when its connection is cut (or its server is not the
    primary): SQLAlchemy's wrapper around psycopg's, as a view sees it."""
    err: psycopg.Error = psycopg.OperationalError("server closed the connection unexpectedly")
    if sqlstate == failover.READ_ONLY:
        err = psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only tx")
    return sa.exc.OperationalError("INSERT ...", {}, err)


@pytest.fixture
def app() -> Flask:
    app = Flask("failover")
    make_api(app, title="t", version="1", openapi_path="/v1/openapi.json")
    calls = {"get": 0}

    @app.get("/v1/thing")
    def get_thing() -> dict[str, int]:
        calls["get"] += 1
        if calls["get"] < 3:
            raise _cut()
        return {"calls": calls["get"]}

    @app.post("/v1/thing")
    def post_thing() -> dict[str, int]:
        raise _cut(failover.READ_ONLY)

    @app.post("/v1/committing")
    def committing() -> dict[str, int]:
        raise failover.CommitOutcomeUnknown.of(_cut())

    @app.post("/v1/broken")
    def broken() -> dict[str, int]:
        raise sa.exc.IntegrityError("INSERT ...", {}, psycopg.errors.UniqueViolation("dup"))

    return app


def test_a_safe_request_is_run_again_across_the_failover(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(failover.time, "sleep", lambda _s: None)
    answer = app.test_client().get("/v1/thing")
    assert answer.status_code == 200
    assert answer.get_json() == {"calls": 3}


def test_a_write_cut_by_the_failover_is_a_503_to_retry_never_a_500(app: Flask) -> None:
    answer = app.test_client().post("/v1/thing", json={})
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "2"
    assert answer.get_json()["code"] == "service_unavailable"
    # Any other database error is still ours: a 500, not an invitation to retry
    answer = app.test_client().post("/v1/broken", json={})
    assert answer.status_code == 500
    assert answer.get_json()["code"] == "internal_error"


def test_what_counts_as_a_failover() -> None:
    assert failover.is_failover(_cut())
    assert failover.is_failover(_cut(failover.READ_ONLY))
    assert failover.is_failover(psycopg.errors.AdminShutdown("terminating connection"))
    assert failover.is_failover(psycopg.errors.CannotConnectNow("the database is starting"))
    assert not failover.is_failover(psycopg.errors.UniqueViolation("duplicate key"))
    assert not failover.is_failover(ValueError("no"))


def test_retry_gives_up_after_its_time_and_never_retries_other_errors() -> None:
    slept: list[float] = []
    calls = {"n": 0}

    def always_cut() -> None:
        calls["n"] += 1
        raise _cut()

    with pytest.raises(sa.exc.OperationalError):
        failover.retry_idempotent(always_cut, what="t", retry_for_s=0.0, sleep=slept.append)
    assert calls["n"] == 1 and slept == []

    def wrong() -> None:
        calls["n"] += 1
        raise psycopg.errors.UniqueViolation("dup")

    with pytest.raises(psycopg.errors.UniqueViolation):
        failover.retry_idempotent(wrong, what="t", sleep=slept.append)
    assert calls["n"] == 2 and slept == []


def test_a_write_cut_while_it_committed_is_a_503_outcome_unknown_without_retry_after(
    app: Flask,
) -> None:
    answer = app.test_client().post("/v1/committing", json={})
    assert answer.status_code == 503
    assert "Retry-After" not in answer.headers
    body = answer.get_json()
    assert body["code"] == "outcome_unknown"
    assert body["error"].startswith("outcome_unknown: ") and "new Idempotency-Key" in body["error"]


def test_which_cut_writes_leave_their_outcome_unknown() -> None:
    # At COMMIT: any failover (the server may have committed before the socket broke)
    assert failover.outcome_unknown(_cut(), committing=True)
    assert failover.outcome_unknown(psycopg.errors.AdminShutdown("bye"), committing=True)
    # An autocommitted statement: only a connection that broke with no answer
    assert failover.outcome_unknown(_cut(), committing=False)
    assert not failover.outcome_unknown(_cut(failover.READ_ONLY), committing=False)
    assert not failover.outcome_unknown(psycopg.errors.AdminShutdown("bye"), committing=False)
    # Not a failover, or already classified: never
    assert not failover.outcome_unknown(psycopg.errors.UniqueViolation("dup"), committing=True)
    unknown = failover.CommitOutcomeUnknown.of(_cut())
    assert not failover.outcome_unknown(unknown, committing=True)
    # Still a failover (idempotent work is retried) and a DBAPIError (handled as one)
    assert failover.is_failover(unknown) and isinstance(unknown, sa.exc.DBAPIError)
