"""The relay's wake-up: NOTIFY sent after the commit, from the notifier's own connection."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from services.core import outbox
from services.core.outbox_wakeup import ATTACHMENT, MIN_GAP_S, NOTIFY_CHANNEL, RelayWaker
from shared import events
from shared.db import Database
from tests.support.pipeline import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    """A Database of its own, so its notifier counts only this test's commits."""
    database = Database(pg_url, pool_size=2)
    yield database
    database.dispose()


@pytest.fixture
def listener(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    conn = psycopg.connect(
        pg_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    )
    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
    yield conn
    conn.close()


def _waker(db: Database) -> RelayWaker:
    return db.attachment(ATTACHMENT, RelayWaker)


def _emit(session: Any) -> None:
    outbox.emit(session, events.DEPOSIT_CREDITED, str(uuid.uuid4()), {"n": 1})


def _woken(listener: psycopg.Connection[Any], timeout: float) -> bool:
    return any(True for _ in listener.notifies(timeout=timeout, stop_after=1))


def test_the_notify_comes_after_the_commit_not_inside_the_transaction(
    db: Database, listener: psycopg.Connection[Any]
) -> None:
    notifier = _waker(db)
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(db.engine, "before_cursor_execute", record)
    # Given a transaction that wrote an outbox row and is still open
    with db.transaction() as session:
        _emit(session)
        time.sleep(0.2)
        # Then nothing was sent yet
        assert notifier.sent == 0
    sa.event.remove(db.engine, "before_cursor_execute", record)
    # And the writer itself never sent NOTIFY (it would serialise every writer's commit)
    assert statements and not any("NOTIFY" in s.upper() for s in statements)
    # When it commits, then the relay's channel hears about it at once
    started = time.monotonic()
    assert _woken(listener, 2.0)
    assert time.monotonic() - started < 0.5
    wait_until(lambda: notifier.sent >= 1, 2, "the notifier to count its NOTIFY")


def test_a_rolled_back_transaction_sends_nothing(db: Database) -> None:
    notifier = _waker(db)
    session = db.sessions()
    try:
        # Given an outbox write that rolls back
        _emit(session)
        session.rollback()
        # When the same session then commits other work
        session.execute(sa.text("SELECT 1"))
        session.commit()
    finally:
        session.close()
    # Then no wake-up is sent for the rolled-back event
    time.sleep(0.2)
    assert notifier.sent == 0


def test_a_released_savepoint_waits_for_the_outer_commit(
    db: Database, listener: psycopg.Connection[Any]
) -> None:
    notifier = _waker(db)
    # Given an event written inside a SAVEPOINT that is released
    with db.transaction() as session:
        with session.begin_nested():
            _emit(session)
        time.sleep(0.2)
        # Then the outer transaction has not committed, so nothing is sent
        assert notifier.sent == 0
    # And the commit sends it
    assert _woken(listener, 2.0)


def test_an_event_survives_a_rolled_back_savepoint_after_it(
    db: Database, listener: psycopg.Connection[Any]
) -> None:
    # Given an event, then a SAVEPOINT that rolls back (a durable event already written)
    with db.transaction() as session:
        _emit(session)
        with pytest.raises(RuntimeError), session.begin_nested():
            raise RuntimeError("savepoint rolled back")
    # Then the committed event still wakes the relay
    assert _woken(listener, 2.0)


def test_the_notifier_reconnects_when_its_connection_was_killed(
    db: Database, listener: psycopg.Connection[Any], pg_url: str
) -> None:
    # Given a notifier that has sent once (its connection is open)
    with db.transaction() as session:
        _emit(session)
    assert _woken(listener, 2.0)
    wait_until(lambda: _waker(db).sent >= 1, 2, "the first NOTIFY")
    # When the server ends that connection (restart, idle timeout, an operator)
    admin = psycopg.connect(
        pg_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    )
    try:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            (RelayWaker.APPLICATION_NAME,),
        ).fetchall()
        assert killed
    finally:
        admin.close()
    # Then the next commit still wakes the relay (a fresh connection, no poll wait)
    with db.transaction() as session:
        _emit(session)
    assert _woken(listener, 2.0)


def test_a_burst_of_commits_shares_notifies_and_the_last_one_is_still_covered(
    db: Database, listener: psycopg.Connection[Any]
) -> None:
    """A busy API process: one NOTIFY per `MIN_GAP_S` at most, not one per commit (each
    costs a thread switch, a round trip and server CPU); the last commit of the burst
    still gets a NOTIFY sent after it."""
    notifier = _waker(db)
    # Given a quiet notifier whose first NOTIFY has been sent
    notifier.poke()
    assert _woken(listener, 2.0)
    wait_until(lambda: notifier.sent == 1, 2, "the first NOTIFY")
    # When 200 commits' pokes arrive over about 0.2 s (a NOTIFY takes ~0.2 ms: the old
    # notifier sent nearly one per poke)
    started = time.monotonic()
    for _ in range(200):
        notifier.poke()
        time.sleep(0.001)
    burst_s = time.monotonic() - started
    # Then the last poke is covered by a NOTIFY that started after it
    wait_until(lambda: not notifier._owed, 2, "the last poke's NOTIFY")
    wait_until(lambda: notifier.sent >= 2, 2, "the burst's NOTIFYs")
    # And they were at most one per gap (plus the gap the burst started in)
    sent = notifier.sent - 1
    assert sent <= burst_s / MIN_GAP_S + 2, (sent, burst_s)
    assert sent >= 2
