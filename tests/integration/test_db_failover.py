"""A PostgreSQL failover under Settle's pools, on real servers: a primary and its
streaming standby (tests/support/pg_cluster.py), one multi-host URL with
target_session_attrs=read-write. The standby is promoted and the old primary stopped:
the pools reconnect to the new primary, idempotent work is retried across the switch,
a transaction the switch cut fails cleanly (nothing of it written), and a connection
to a server that no longer takes writes is dropped with its whole pool."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from shared import failover
from shared.db import Database
from tests.support.pg_cluster import PgCluster
from tests.support.services import create_database, drop_database

pytestmark = pytest.mark.integration

_INSERT = sa.text("INSERT INTO probe (id) VALUES (:id) ON CONFLICT DO NOTHING")


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with PgCluster() as pg:
        yield pg


def _port(db: Database) -> int:
    with db.autocommit() as conn:
        return int(conn.execute(sa.text("SELECT current_setting('port')")).scalar_one())


def _ids(db: Database) -> set[str]:
    with db.autocommit() as conn:
        return set(conn.execute(sa.text("SELECT id FROM probe")).scalars())


def test_the_pools_follow_the_primary_and_a_cut_transaction_writes_nothing(
    cluster: PgCluster,
) -> None:
    db = Database(cluster.create_database("failover"), pool_size=4)
    try:
        with db.transaction() as session:
            session.execute(sa.text("CREATE TABLE probe (id text PRIMARY KEY)"))
            session.execute(_INSERT, {"id": "before"})
        with db.driver_autocommit() as conn:
            conn.execute("INSERT INTO probe (id) VALUES ('before-fast')")
        assert _port(db) == cluster.ports["primary"]
        # Given a transaction in flight on the primary
        with pytest.raises(sa.exc.DBAPIError) as cut, db.transaction() as session:
            session.execute(_INSERT, {"id": "cut"})
            # When the standby is promoted and the old primary stopped under it
            promoted_s = cluster.promote_standby()
            stopped_s = cluster.stop("primary")
            session.execute(_INSERT, {"id": "cut-2"})
        # Then it fails as a failover, not as a fault of the work
        assert failover.is_failover(cut.value)
        # And idempotent work is retried across the switch, on the new primary
        started = time.monotonic()
        failover.retry_idempotent(lambda: _write(db, "after"), what="probe")
        switch_s = time.monotonic() - started
        assert _port(db) == cluster.ports["standby"]
        with db.driver_autocommit() as conn:
            conn.execute("INSERT INTO probe (id) VALUES ('after-fast')")
        # Nothing of the cut transaction was written; everything acknowledged before is there
        assert _ids(db) == {"before", "before-fast", "after", "after-fast"}
        print(
            f"\nfailover: promote {promoted_s:.2f} s, stop old primary {stopped_s:.2f} s, "
            f"first write on the new primary {switch_s:.2f} s after"
        )
    finally:
        db.dispose()


def _write(db: Database, probe_id: str) -> None:
    with db.transaction() as session:
        session.execute(_INSERT, {"id": probe_id})


def test_a_connection_to_a_server_that_refuses_writes_is_dropped_with_its_pool() -> None:
    """A demoted primary answers, but read-only (25006): every pooled connection to it is
    useless, and new ones find the server that takes writes. Simulated on one server:
    the pooled connections are made read-only, as a demoted primary's would be."""
    name = f"settle_test_readonly_{int(time.time() * 1000) % 10**9}"
    url = create_database(name)
    db = Database(url, pool_size=2)
    try:
        with db.transaction() as session:
            session.execute(sa.text("CREATE TABLE probe (id text PRIMARY KEY)"))
        # Given pooled connections (both pools) that the server now refuses writes on
        with db.engine.connect() as conn:
            conn.execute(sa.text("SET SESSION default_transaction_read_only = on"))
            conn.commit()
        with db.driver_autocommit() as fast:
            fast.execute("SET SESSION default_transaction_read_only = on")
        # When a write is refused as read-only
        with pytest.raises(sa.exc.DBAPIError) as refused:
            _write(db, "a")
        assert failover.sqlstate(refused.value) == failover.READ_ONLY
        assert failover.is_failover(refused.value)
        with pytest.raises(Exception) as refused_fast, db.driver_autocommit() as fast:
            fast.execute("INSERT INTO probe (id) VALUES ('b')")
        assert failover.sqlstate(refused_fast.value) == failover.READ_ONLY
        # Then the next write gets a new connection, which takes it
        _write(db, "a")
        with db.driver_autocommit() as fast:
            fast.execute("INSERT INTO probe (id) VALUES ('b')")
        assert _ids(db) == {"a", "b"}
    finally:
        db.dispose()
        drop_database(name)
