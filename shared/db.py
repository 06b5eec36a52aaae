"""Database helpers both services use: engines, sessions, column types.

No module-level engine: each app factory or process builds a `Database` from its
config and keeps it on the app (`app.extensions`) or passes it down.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

#: JSON column: JSONB on PostgreSQL, JSON text elsewhere.
JSONType = sa.JSON().with_variant(JSONB(), "postgresql")

#: Autoincrement big integer that SQLite also treats as its rowid alias.
BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain `postgresql://` URLs."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str, *, pool_size: int = 10, echo: bool = False) -> Engine:
    """An engine tuned per backend (SQLite: WAL + immediate transactions)."""
    url = normalize_url(url)
    if is_sqlite(url):
        engine = sa.create_engine(
            url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": 30, "isolation_level": None},
        )

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _sqlite_begin(conn: sa.Connection) -> None:
            # Writers queue on the lock up front instead of failing on upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return sa.create_engine(
        url,
        echo=echo,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
    )


class Database:
    """An engine and its session factory."""

    def __init__(self, url: str, *, pool_size: int = 10, echo: bool = False) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, pool_size=pool_size, echo=echo)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def is_sqlite(self) -> bool:
        return is_sqlite(self.url)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose work commits on success and rolls back on error."""
        session = self.sessions()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextmanager
    def reader(self) -> Iterator[Session]:
        """A session for reads only; nothing is committed.

        Closing (not rolling back) ends the transaction without expiring what was
        loaded, so rows stay readable, detached, after the block.
        """
        session = self.sessions()
        try:
            yield session
        finally:
            session.close()

    def dispose(self) -> None:
        self.engine.dispose()


def is_unique_violation(exc: BaseException) -> bool:
    """True when a DBAPI error is a unique-constraint failure (PostgreSQL or SQLite)."""
    orig = getattr(exc, "orig", exc)
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if sqlstate == "23505":
        return True
    return "UNIQUE constraint failed" in str(orig)
