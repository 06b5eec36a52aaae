"""Pooled connections the server ended are replaced on checkout, without a ping per checkout."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import shared.db
from shared.db import Database
from tests.support.pipeline import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    database = Database(pg_url, pool_size=2)
    yield database
    database.dispose()


def _admin(pg_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        pg_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    )


def _backend_pids(db: Database, n: int) -> list[int]:
    """Open `n` pooled connections at once (so the pool keeps n) and return their pids."""
    pids: list[int] = []
    barrier = threading.Barrier(n, timeout=10)

    def use() -> None:
        with db.transaction() as session:
            pids.append(session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
            barrier.wait()

    threads = [threading.Thread(target=use) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return pids


def test_connections_killed_by_the_server_are_replaced_without_a_failed_request(
    db: Database, pg_url: str
) -> None:
    # Given a pool holding two idle connections
    old = _backend_pids(db, 2)
    assert len(set(old)) == 2
    # When the server ends both (what a restart or pg_terminate_backend does)
    _kill(pg_url, old)
    # Then the next requests succeed, on fresh connections
    for _ in range(3):
        with db.transaction() as session:
            pid = session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        assert pid not in old


def test_a_healthy_checkout_sends_no_ping(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a warm pool, and the dialect's ping counted
    with db.transaction() as session:
        session.execute(sa.text("SELECT 1"))
    dialect = db.engine.dialect
    pings: list[object] = []
    ping = dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        pings.append(dbapi_conn)
        return ping(dbapi_conn)

    monkeypatch.setattr(dialect, "do_ping", counted)
    # When connections are checked out 50 times
    for _ in range(50):
        with db.transaction() as session:
            session.execute(sa.text("SELECT 1"))
    # Then no round trip was spent on pings (pool_pre_ping would have sent 50)
    assert pings == []


def _kill(pg_url: str, pids: list[int]) -> None:
    """End these backends (what a restart or pg_terminate_backend does) and wait for it."""
    with _admin(pg_url) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        wait_until(
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
                ).fetchone()
            ),
            5,
            "the backends to exit",
        )


def _autocommit_pids(db: Database, n: int) -> list[int]:
    """Hold `n` of the fast executor's connections at once (so it keeps n); their pids."""
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(db.driver_autocommit()) for _ in range(n)]
        return [_backend_pid(conn) for conn in conns]


def _backend_pid(conn: Any) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("mode", "hold"),
    [("driver_transaction", _backend_pids), ("driver_autocommit", _autocommit_pids)],
    ids=["driver_transaction", "driver_autocommit (the fast executor's own pool)"],
)
def test_driver_connections_the_server_ended_are_replaced(
    mode: str, hold: Callable[[Database, int], list[int]], db: Database, pg_url: str
) -> None:
    # Given the pool this mode draws from holding two idle connections, ended by the server
    old = hold(db, 2)
    assert len(set(old)) == 2
    _kill(pg_url, old)
    # Then the next uses get fresh ones, and nothing fails
    use = getattr(db, mode)
    for _ in range(3):
        with use() as conn:
            assert _backend_pid(conn) not in old


def test_the_fast_executor_reuses_a_warm_connection_without_a_ping(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.driver_autocommit() as conn:
        first = _backend_pid(conn)
    statements: list[str] = []
    execute = psycopg.Connection.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    for _ in range(20):
        with db.driver_autocommit() as conn:
            assert _backend_pid(conn) == first
    # Only the test's own statements: no ping per checkout
    assert statements == ["SELECT pg_backend_pid()"] * 20


def test_the_fast_executor_opens_at_most_twice_its_size_and_then_waits(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared.db, "POOL_TIMEOUT_S", 0.3)
    # Given a Database of pool size 2: four connections may be open at once
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(db.driver_autocommit()) for _ in range(4)]
        assert len({_backend_pid(conn) for conn in held}) == 4
        # Then a fifth caller waits, and gives up with an error rather than opening more
        started = time.monotonic()
        with pytest.raises(sa.exc.TimeoutError), db.driver_autocommit():
            pass
        assert time.monotonic() - started >= 0.3
    # And once they are given back, two stay open for the next callers
    assert len({pid for pid in _autocommit_pids(db, 2)}) == 2


def test_a_forked_child_never_uses_its_parents_connections(db: Database) -> None:
    # Given a parent whose fast executor holds an idle connection
    with db.driver_autocommit() as conn:
        parent_pid = _backend_pid(conn)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its own connection, then exit without cleanup
        try:
            with db.driver_autocommit() as conn:
                os.write(write, str(_backend_pid(conn)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        child_backend = int(answer.read() or 0)
    os.waitpid(child, 0)
    # Then the child used a connection of its own
    assert child_backend and child_backend != parent_pid
    # And the parent's connection still works, the same session as before
    with db.driver_autocommit() as conn:
        assert _backend_pid(conn) == parent_pid


def test_a_driver_connection_left_inside_a_transaction_is_not_pooled(db: Database) -> None:
    def backend_pid(conn: Any) -> int:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])

    # Given a connection that goes back to the pool idle: it is used again
    with db.driver_autocommit() as conn:
        first = backend_pid(conn)
    with db.driver_autocommit() as conn:
        assert backend_pid(conn) == first
    # When a caller leaves one inside a transaction
    with db.driver_autocommit() as conn:
        conn.execute("BEGIN")
        left = backend_pid(conn)
    # Then it is dropped: the next caller gets another connection, in autocommit
    with db.driver_autocommit() as conn:
        assert backend_pid(conn) != left
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # And a session is a non-autocommit connection whose failed work commits nothing
    with pytest.raises(RuntimeError), db.transaction() as session:
        assert session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() != left
        session.execute(sa.text("CREATE TABLE leaked_by_autocommit (id int)"))
        raise RuntimeError("roll back")
    with db.reader() as session:
        assert (
            session.execute(sa.text("SELECT to_regclass('leaked_by_autocommit')")).scalar() is None
        )


def test_a_connection_the_server_ends_while_in_use_is_not_given_back(
    db: Database, pg_url: str
) -> None:
    # Given a caller whose connection the server ends mid-use (its statement fails)
    with db.driver_autocommit() as conn:
        lost = _backend_pid(conn)
        _kill(pg_url, [lost])
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    # Then the next caller gets a live connection, not the broken one
    with db.driver_autocommit() as conn:
        assert _backend_pid(conn) != lost


def test_a_connection_given_back_out_of_autocommit_is_not_reused(db: Database) -> None:
    """Found by review: one given back idle but with autocommit off was kept, and the
    next caller's single-statement write opened a transaction that was rolled back."""
    with db.driver_autocommit() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS fast_executor_writes (x int)")
        conn.execute("TRUNCATE fast_executor_writes")
        conn.autocommit = False
    with db.driver_autocommit() as conn:
        conn.execute("INSERT INTO fast_executor_writes VALUES (1)")
    with db.driver_autocommit() as conn:
        assert conn.execute("SELECT count(*) FROM fast_executor_writes").fetchone() == (1,)
        conn.execute("DROP TABLE fast_executor_writes")


def test_after_dispose_the_fast_executor_still_keeps_its_connections(db: Database) -> None:
    with db.driver_autocommit() as conn:
        before = _backend_pid(conn)
    db.dispose()
    pids = set()
    for _ in range(3):
        with db.driver_autocommit() as conn:
            pids.add(_backend_pid(conn))
    assert len(pids) == 1 and before not in pids


def test_a_child_forked_inside_the_block_leaves_the_parents_session_alone(db: Database) -> None:
    with db.driver_autocommit() as conn:
        parent_pid = _backend_pid(conn)
        child = os.fork()
    if child == 0:  # the child has left the block (given the connection "back")
        os._exit(0)
    os.waitpid(child, 0)
    # The parent's session survived the child's exit from the block
    with db.driver_autocommit() as conn:
        assert _backend_pid(conn) == parent_pid


def test_a_child_forked_while_a_slot_is_held_has_all_its_slots(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared.db, "POOL_TIMEOUT_S", 1.0)
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with db.driver_autocommit():
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    child = os.fork()
    if child == 0:  # all 4 slots of a pool of size 2, at once
        code = 1
        try:
            with contextlib.ExitStack() as stack:
                for _ in range(4):
                    stack.enter_context(db.driver_autocommit())
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    done.set()
    thread.join(10)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_server_that_refuses_is_reported_at_once_not_after_the_pools_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a database URL where nothing listens, and the pool's full wait of 30 s
    monkeypatch.setattr(shared.db, "POOL_TIMEOUT_S", 30.0)
    database = Database("postgresql://postgres@127.0.0.1:1/settle", pool_size=2)
    try:
        # When the fast executor is asked for a connection
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError), database.driver_autocommit():
            pass
        # Then the server's own error comes within the pool's first check, not as a
        # "busy" timeout after 30 s (bound generous for a loaded machine)
        assert time.monotonic() - started < 10.0
    finally:
        database.dispose()
