"""A write the database failover cuts, through the real idempotency decorator, on a real
primary and synchronous standby (tests/support/pg_cluster.py): cut before its COMMIT it
rolled back whole and is retried with the same Idempotency-Key, running once; cut AT its
COMMIT (committed on the server, the answer lost) its outcome is unknown, and a retry
with the same key replays that answer instead of running the work a second time.

To hold a commit between "committed on the primary" and "acknowledged" the route asks
for `synchronous_commit = remote_apply` and the standby's replay is paused: the commit
is durable on both servers, waiting for an acknowledgement that never comes; promoting
stopping the primary cuts the waiting session, as a primary dying at that moment would,
and the promoted standby has the commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from flask import Flask, g
from flask.testing import FlaskClient
from sqlalchemy.orm import DeclarativeBase
from werkzeug.test import TestResponse

from shared import idempotency
from shared.api import make_api
from shared.db import Database
from shared.identity.principal import Principal
from tests.support.pg_cluster import PgCluster

pytestmark = pytest.mark.integration

#: How long the test waits for a request to reach the point where the switch cuts it.
WAIT_S = 30.0


class _Base(DeclarativeBase):
    pass


class _Record(_Base, idempotency.IdempotencyRecordMixin):
    __tablename__ = "idempotency_records"


def _app(db: Database, work: Callable[[], None]) -> Flask:
    """A scratch API with one idempotent POST that runs `work` (writing one probe row)."""
    app = Flask("outcome")
    make_api(app, title="t", version="1", openapi_path="/v1/openapi.json")
    idempotency.install(app, db, "s" * 32)

    @app.post("/v1/things")
    def create() -> tuple[dict[str, str], int]:
        g.principal = Principal(tenant_id="ten_1", sandbox=False, api_key_id="key_1")
        return _create()

    @idempotency.idempotent(_Record)
    def _create() -> tuple[dict[str, str], int]:
        work()
        return {"id": "thing"}, 201

    return app


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as pg:
        yield pg


@pytest.fixture
def db(cluster: PgCluster) -> Iterator[Database]:
    database = Database(cluster.create_database("outcome"), pool_size=4)
    _Base.metadata.create_all(database.engine)
    with database.transaction() as session:
        session.execute(sa.text("CREATE TABLE probe (n serial PRIMARY KEY, tag text)"))
    cluster.wait_replicated()
    yield database
    database.dispose()


def _rows(db: Database) -> int:
    with db.reader() as session:
        return int(session.execute(sa.text("SELECT count(*) FROM probe")).scalar_one())


def _post(client: FlaskClient, key: str | None) -> TestResponse:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/v1/things", json={"name": "a"}, headers=headers)


def _in_background(call: Callable[[], TestResponse]) -> Callable[[], TestResponse]:
    """Run `call` in a thread; the returned function waits for its answer."""
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(call()), daemon=True)
    thread.start()

    def result() -> TestResponse:
        thread.join(WAIT_S)
        assert answer, "the request did not finish"
        return answer[0]  # type: ignore[no-any-return]

    return result


def _switch(cluster: PgCluster) -> None:
    """The primary dies (its sessions end), then the standby is promoted: in this
    order, a commit the standby has but never acknowledged stays unacknowledged."""
    cluster.stop("primary")
    cluster.promote_standby()


def _wait_for_commit_waiting(cluster: PgCluster) -> None:
    """Until a session on the primary has committed and waits for the standby (for
    longer than an ordinary commit, which waits a moment for the standby's flush)."""
    deadline = time.monotonic() + WAIT_S
    with psycopg.connect(cluster.node_url("primary"), autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                "AND query_start < clock_timestamp() - interval '0.5 s'"
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.02)
    raise AssertionError("no commit waited for the standby")


def _hold_commits_unacknowledged(cluster: PgCluster) -> None:
    with psycopg.connect(cluster.node_url("standby"), autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")


def test_a_write_cut_at_its_commit_never_runs_twice(cluster: PgCluster, db: Database) -> None:
    def work() -> None:
        with db.transaction() as session:
            session.execute(sa.text("SET LOCAL synchronous_commit = remote_apply"))
            session.execute(sa.text("INSERT INTO probe (tag) VALUES ('cut at commit')"))

    client = _app(db, work).test_client()
    # Given a write whose COMMIT reached the primary (and the standby) but whose
    # acknowledgement never came back
    _hold_commits_unacknowledged(cluster)
    answer = _in_background(lambda: _post(client, "k-1"))
    _wait_for_commit_waiting(cluster)
    # When the switch cuts it there
    _switch(cluster)
    first = answer()
    # Then the client learns the outcome is unknown, not "retry": the row IS written
    assert first.status_code == 503, first.get_data(as_text=True)
    assert first.json is not None and first.json["code"] == "outcome_unknown"
    assert first.json["error"].startswith("outcome_unknown: ")
    assert "Retry-After" not in first.headers
    assert _rows(db) == 1
    # And the retry with the same key answers the same, never running the work again
    again = _post(client, "k-1")
    assert again.status_code == 503
    assert again.json == first.json
    assert again.headers["Idempotent-Replayed"] == "true"
    assert _rows(db) == 1


def test_a_fast_executor_write_cut_by_the_switch_never_runs_twice(
    cluster: PgCluster, db: Database
) -> None:
    """One autocommitted statement on the fast executor (as account creation writes):
    cut while its commit waits, it may have committed."""

    def work() -> None:
        with db.driver_autocommit() as conn:
            conn.execute("SET synchronous_commit = remote_apply")
            conn.execute("INSERT INTO probe (tag) VALUES ('fast')")

    client = _app(db, work).test_client()
    _hold_commits_unacknowledged(cluster)
    answer = _in_background(lambda: _post(client, "k-fast"))
    _wait_for_commit_waiting(cluster)
    _switch(cluster)
    first = answer()
    assert first.status_code == 503, first.get_data(as_text=True)
    assert first.json is not None and first.json["code"] == "outcome_unknown"
    again = _post(client, "k-fast")
    assert again.json == first.json
    assert _rows(db) == 1


def test_a_write_cut_before_its_commit_is_retried_with_the_same_key_and_runs_once(
    cluster: PgCluster, db: Database
) -> None:
    inside, go = threading.Event(), threading.Event()

    def work() -> None:
        with db.transaction() as session:
            session.execute(sa.text("INSERT INTO probe (tag) VALUES ('first statement')"))
            if not go.is_set():  # only the first attempt is cut
                inside.set()
                go.wait(WAIT_S)
            session.execute(sa.text("INSERT INTO probe (tag) VALUES ('second statement')"))

    client = _app(db, work).test_client()
    # Given a transaction in flight, its COMMIT not sent yet
    answer = _in_background(lambda: _post(client, "k-2"))
    assert inside.wait(WAIT_S)
    # When the switch cuts it
    _switch(cluster)
    go.set()
    first = answer()
    # Then it rolled back whole: 503 with Retry-After, nothing written, the key released
    assert first.status_code == 503, first.get_data(as_text=True)
    assert first.json is not None and first.json["code"] == "service_unavailable"
    assert first.headers["Retry-After"]
    assert _rows(db) == 0
    # And the retry with the same key runs the work, once
    again = _post(client, "k-2")
    assert again.status_code == 201, again.get_data(as_text=True)
    assert "Idempotent-Replayed" not in again.headers
    assert _rows(db) == 2
    assert _post(client, "k-2").headers["Idempotent-Replayed"] == "true"
    assert _rows(db) == 2


def test_a_key_whose_outcome_no_primary_could_record_stays_in_progress(
    cluster: PgCluster, db: Database
) -> None:
    """The primary dies at the commit and no server takes writes for longer than the
    decorator tries to record the outcome: the claim stays, and says why."""

    def work() -> None:
        with db.transaction() as session:
            session.execute(sa.text("SET LOCAL synchronous_commit = remote_apply"))
            session.execute(sa.text("INSERT INTO probe (tag) VALUES ('unrecorded')"))

    client = _app(db, work).test_client()
    _hold_commits_unacknowledged(cluster)
    answer = _in_background(lambda: _post(client, "k-3"))
    _wait_for_commit_waiting(cluster)
    cluster.stop("primary")
    first = answer()  # after idempotency.SETTLE_RETRY_S without a primary
    assert first.status_code == 503
    assert first.json is not None and first.json["code"] == "outcome_unknown"
    cluster.promote_standby()
    again = _post(client, "k-3")
    assert again.status_code == 409, again.get_data(as_text=True)
    assert again.json is not None and "cut by a database switch" in again.json["error"]
    assert _rows(db) == 1
