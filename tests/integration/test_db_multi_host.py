"""libpq's multi-host URLs reach every pool: a host that refuses is skipped for the next."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from shared.db import Database

pytestmark = pytest.mark.integration


def _forms(pg_url: str) -> dict[str, str]:
    """The test database behind a first host that refuses (nothing listens on port 1)."""
    url = sa.engine.make_url(pg_url)
    user, host, port, name = url.username, url.host, url.port or 5432, url.database
    return {
        "url": (
            f"postgresql://{user}@{host}:1,{host}:{port}/{name}?target_session_attrs=read-write"
        ),
        "conninfo": (
            f"host={host},{host} port=1,{port} dbname={name} user={user} "
            "target_session_attrs=read-write"
        ),
    }


@pytest.fixture(params=["url", "conninfo"])
def db(pg_url: str, request: pytest.FixtureRequest) -> Iterator[Database]:
    database = Database(_forms(pg_url)[request.param], pool_size=1)
    yield database
    database.dispose()


def _port(conn: psycopg.Connection) -> int:  # type: ignore[type-arg]
    return int(conn.info.port)


def test_every_way_to_the_database_fails_over_to_the_next_host(db: Database) -> None:
    # The ORM session (SQLAlchemy's pool)
    with db.transaction() as session:
        assert session.execute(sa.text("SELECT 1")).scalar_one() == 1
    # The fast executor's pool (psycopg_pool) and a pooled driver transaction
    with db.driver_autocommit() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert _port(conn) != 1
        assert conn.info.get_parameters().get("target_session_attrs") == "read-write"
    with db.driver_transaction() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # A plain connection on the libpq URL (LISTEN/NOTIFY, admin work)
    with psycopg.connect(db.libpq_url, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert _port(conn) != 1
