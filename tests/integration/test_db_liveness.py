"""Pooled connections the server ended are replaced on checkout, without a ping per checkout."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

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
    with _admin(pg_url) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (old,))
        wait_until(
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (old,)
                ).fetchone()
            ),
            5,
            "the backends to exit",
        )
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


@pytest.mark.parametrize("mode", ["driver_autocommit", "driver_transaction"])
def test_driver_connections_the_server_ended_are_replaced_too(
    mode: str, db: Database, pg_url: str
) -> None:
    # Given a pool holding two idle connections, ended by the server
    old = _backend_pids(db, 2)
    with _admin(pg_url) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (old,))
        wait_until(
            lambda: (
                not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (old,)
                ).fetchone()
            ),
            5,
            "the backends to exit",
        )
    # Then the hot paths' driver connections are fresh ones, and nothing fails
    use = getattr(db, mode)
    for _ in range(3):
        with use() as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None and row[0] not in old


def test_a_driver_connection_left_inside_a_transaction_is_not_pooled(db: Database) -> None:
    def backend_pid(conn: Any) -> int:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])

    # Given a connection that goes back to the pool idle: it is used again, reset
    with db.driver_autocommit() as conn:
        first = backend_pid(conn)
    with db.driver_autocommit() as conn:
        assert backend_pid(conn) == first
    # When a caller leaves one inside a transaction
    with db.driver_autocommit() as conn:
        conn.execute("BEGIN")
        left = backend_pid(conn)
    # Then it is dropped, and the next session is a fresh, non-autocommit connection
    # whose failed work commits nothing
    with pytest.raises(RuntimeError), db.transaction() as session:
        assert session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() != left
        session.execute(sa.text("CREATE TABLE leaked_by_autocommit (id int)"))
        raise RuntimeError("roll back")
    with db.reader() as session:
        assert (
            session.execute(sa.text("SELECT to_regclass('leaked_by_autocommit')")).scalar() is None
        )
