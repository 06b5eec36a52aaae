"""Database helpers both services use: engines, sessions, column types.

No module-level engine: each app factory or process builds a `Database` from its
config and keeps it on the app (`app.extensions`) or passes it down.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo
import psycopg.rows
import psycopg.types.json
import sqlalchemy as sa
from psycopg_pool import ConnectionPool, PoolTimeout
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, SessionTransaction, make_transient_to_detached, sessionmaker

from shared import embedded_postgres, failover

T = TypeVar("T")
log = logging.getLogger(__name__)

#: A pooled connection unused for this long is replaced (a cap on server-side state).
POOL_RECYCLE_S = 1800
#: How long a caller waits for a connection when every one is in use (SQLAlchemy's default).
POOL_TIMEOUT_S = 30.0
#: How long a caller waits on the fast executor's pool while it is not full before it
#: connects itself (`AutocommitConnections._take`).
CONNECT_CHECK_S = 0.5
#: Session.info keys: the owning Database; callbacks to run after the commit.
_DATABASE = "settle.database"
_AFTER_COMMIT = "settle.after_commit"

#: JSON column (JSONB).
JSONType = JSONB()

#: Autoincrement big integer primary key.
BigIntPK = sa.BigInteger()


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes: naive values are refused, values read come back in UTC."""

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
    """The SQLAlchemy URL for `url`: psycopg 3 for `postgresql://` URLs; an embedded URL
    (`embedded_postgres.URL_SCHEME`) starts or joins the embedded server it names."""
    if embedded_postgres.is_embedded_url(url):
        url = embedded_postgres.resolve(url)
    if _is_libpq_only(url):
        return _sqlalchemy_url(url)
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def _is_libpq_only(url: str) -> bool:
    """True for what libpq reads but SQLAlchemy's URL parser does not: a key=value
    conninfo (`host=a,b dbname=settle`) or a URL naming several hosts
    (`postgresql://a:5432,b:5433/settle?target_session_attrs=read-write`)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "=" in url
    if scheme not in ("postgresql", "postgres"):
        return False
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    return "," in authority.rpartition("@")[2]


def _sqlalchemy_url(conninfo: str) -> str:
    """A libpq conninfo or multi-host URL as a SQLAlchemy psycopg URL: several hosts go
    as `?host=a:5432&host=b:5433` (which SQLAlchemy's psycopg dialect gives back to
    libpq as `host=a,b port=5432,5433`), every other parameter as a query option."""
    params = {key: str(value) for key, value in psycopg.conninfo.conninfo_to_dict(conninfo).items()}
    hosts = params.pop("host", "").split(",")
    ports = params.pop("port", "").split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    if len(ports) != len(hosts):
        raise ValueError(f"{len(hosts)} hosts but {len(ports)} ports in the database URL")
    user, password = params.pop("user", None), params.pop("password", None)
    dbname = params.pop("dbname", None)
    query: dict[str, str | tuple[str, ...]] = dict(params)
    host: str | None = None
    port: int | None = None
    if len(hosts) > 1:
        query["host"] = tuple(f"{h}:{p}" if p else h for h, p in zip(hosts, ports, strict=True))
    elif hosts[0].startswith("/"):
        query["host"] = hosts[0]  # a Unix socket directory
        if ports[0]:
            query["port"] = ports[0]
    else:
        host, port = hosts[0] or None, int(ports[0]) if ports[0] else None
    url = sa.engine.URL.create(
        "postgresql+psycopg",
        username=user,
        password=password,
        host=host,
        port=port,
        database=dbname,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def make_engine(url: str, *, pool_size: int = 10, echo: bool = False) -> Engine:
    """A PostgreSQL engine with a liveness check on checkout instead of a ping."""
    url = normalize_url(url)
    if not url.startswith("postgresql"):
        raise ValueError(f"Settle runs on PostgreSQL only; not a PostgreSQL URL: {url!r}")
    engine = sa.create_engine(
        url,
        echo=echo,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=POOL_RECYCLE_S,
    )
    _check_liveness_on_checkout(engine)
    return engine


def _check_liveness_on_checkout(engine: Engine) -> None:
    """Replace pooled connections the server has closed, for the price of a poll(2).

    `pool_pre_ping` costs a round trip on every checkout. Instead: a healthy idle
    connection has nothing to read, while one the server ended (restart, shutdown,
    pg_terminate_backend, idle timeout) has its FATAL message or EOF waiting. Only
    then is it pinged; a dead one invalidates the whole pool (after a restart every
    pooled connection is dead) and SQLAlchemy checks out a fresh one, so the
    request does not fail. A connection that dies silently (host lost, no FIN) is
    not detected here; neither would a ping be before TCP gives up.
    """
    dialect = engine.dialect

    @sa.event.listens_for(engine, "checkout")
    def _liveness(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if dbapi_conn.closed or dbapi_conn.broken:
            raise sa.exc.InvalidatePoolError("connection closed")
        if not _has_input(dbapi_conn.fileno()):
            return
        try:
            dialect.do_ping(dbapi_conn)
        except dialect.loaded_dbapi.Error as err:
            if dialect.is_disconnect(err, dbapi_conn, None):
                raise sa.exc.InvalidatePoolError(f"server closed the connection: {err}") from err
            raise


def _return_driver_connection(pooled: Any, conn: Any) -> None:
    """Give a driver connection back to the pool idle, or drop it.

    Only an idle, live connection goes back: one the server ended, or one a caller left
    inside a transaction, is invalidated, so no later session inherits its state.
    """
    idle = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if idle:
        pooled.close()
    else:
        pooled.invalidate()


class AutocommitConnections:
    """The fast executor's connections: a psycopg_pool pool of autocommit connections.

    `Database.driver_autocommit` runs the hottest statements (API-key lookup, account
    creation, the webhook worker's claims and records) on psycopg's own connections,
    without SQLAlchemy's checkout and reset. The pool (psycopg_pool) does the sizing
    (opened on demand up to `2 * size`, the engine's pool_size plus max_overflow; idle
    ones closed after its max_idle), the wait of at most POOL_TIMEOUT_S for one (then
    `sa.exc.TimeoutError`, as the engine's pool raises, which the API answers 503),
    replacement after POOL_RECYCLE_S, and reconnection in its background workers.

    Ours on top: the liveness check on checkout costs a poll(2) unless the server has
    ended the connection (see `_check_liveness_on_checkout`); a dead one drains the
    pool (after a restart every pooled connection is dead) and the caller is served
    at once by a fresh one (the pool's own `check` retries after a second's backoff).
    One given back inside a transaction, out of autocommit, closed or broken is closed,
    never handed to the next caller (the pool would roll it back and keep its session
    state). Fork: a child starts a pool of its own on first use and never uses or
    closes its parent's (closing a connection would end the parent's session on the
    shared socket; the parent's pool threads do not exist in the child). After
    `close()` the next use opens a new pool.
    """

    def __init__(self, conninfo: str, size: int) -> None:
        self._conninfo = conninfo
        self._size = max(1, size)
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._lock = threading.Lock()
        #: What a forked child inherited (the parent's pool, connections lent at fork
        #: time): kept referenced, never used or closed.
        self._inherited: list[object] = []
        #: id() of connections `_take` opened itself (closed when given back, not pooled).
        self._unpooled: set[int] = set()
        after_fork_in_child(self._forked)

    def get(self) -> tuple[psycopg.Connection[Any], ConnectionPool[psycopg.Connection[Any]]]:
        """A live autocommit connection and the pool it came from; `put` it back."""
        pool = self._current()
        deadline = time.monotonic() + POOL_TIMEOUT_S
        # Bounded: a drain replaces every idle connection, so a second dead one is rare.
        for _ in range(2 * self._size + 1):
            conn = self._take(pool, deadline)
            if id(conn) in self._unpooled or _usable(conn):
                return conn, pool
            _close_quietly(conn)
            pool.putconn(conn)
            pool.drain()
        raise sa.exc.TimeoutError("no live database connection: the server ends each one")

    def _take(
        self, pool: ConnectionPool[psycopg.Connection[Any]], deadline: float
    ) -> psycopg.Connection[Any]:
        """A connection from `pool` before `deadline`, or, when the pool is not full yet
        gives none for CONNECT_CHECK_S, one this caller opens (or its error).

        The pool opens connections in the background and, after a failed attempt (the
        server down or restarting, no primary yet), tries again only after a growing
        backoff: a caller would wait out POOL_TIMEOUT_S for a server that is long back,
        or for one that refuses, and then read "busy". Connecting once itself, it gets
        the server's own error at once (psycopg's OperationalError, which the CLI
        explains and `shared.failover` tells a failover by), or a connection, used once
        and closed (the pool's next attempt refills it). A full pool is only busy: then
        the caller waits for one given back, up to the deadline.
        """
        while True:
            remaining = deadline - time.monotonic()
            try:
                return pool.getconn(max(0.0, min(remaining, CONNECT_CHECK_S)))
            except PoolTimeout as err:
                stats = pool.get_stats()
                if stats.get("pool_size", 0) < stats.get("pool_max", 0):
                    conn = psycopg.connect(
                        self._conninfo,
                        autocommit=True,
                        connect_timeout=max(2, math.ceil(remaining)),
                    )
                    self._unpooled.add(id(conn))
                    return conn
                if remaining <= CONNECT_CHECK_S:
                    raise sa.exc.TimeoutError(
                        f"no database connection free after {POOL_TIMEOUT_S:.0f} s "
                        f"({2 * self._size} in use)"
                    ) from err

    def put(
        self, conn: psycopg.Connection[Any], pool: ConnectionPool[psycopg.Connection[Any]]
    ) -> None:
        """Give back a connection `get` gave; closed unless idle, live and in autocommit."""
        if any(pool is inherited for inherited in self._inherited):
            # Lent before a fork: the parent's session; never closed, never pooled here.
            self._inherited.append(conn)
            return
        if id(conn) in self._unpooled:
            self._unpooled.discard(id(conn))
            _close_quietly(conn)
            return
        idle = (
            not conn.closed
            and not conn.broken
            and conn.autocommit
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
        if not idle:
            _close_quietly(conn)
        # A pool closed since (`close()`) closes it; an open one replaces a closed one.
        pool.putconn(conn)

    def close(self) -> None:
        """Close the pool: idle connections now, those in use when given back."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _current(self) -> ConnectionPool[psycopg.Connection[Any]]:
        pool = self._pool
        if pool is None:
            with self._lock:
                pool = self._pool
                if pool is None:
                    # Opened on first use: no threads or connections at construction.
                    pool = ConnectionPool(
                        self._conninfo,
                        kwargs={"autocommit": True},
                        min_size=0,
                        max_size=2 * self._size,
                        timeout=POOL_TIMEOUT_S,
                        max_lifetime=POOL_RECYCLE_S,
                        name="settle-autocommit",
                        open=False,
                    )
                    pool.open()
                    self._pool = pool
        return pool

    def _forked(self) -> None:
        # In the child, one thread: a fresh lock, and the next use opens a new pool.
        self._lock = threading.Lock()
        if self._pool is not None:
            self._inherited.append(self._pool)
        self._pool = None


def after_fork_in_child(reset: Callable[[], None]) -> None:
    """Run the bound method `reset` in every forked child of this process, before any of
    the child's threads, for as long as its object lives (held weakly).

    For per-process state (connections, locks, numbers drawn from a sequence) that a
    child must not share with its parent: a lock a parent's thread held at fork time
    would never be released in the child.
    """
    method = weakref.WeakMethod(reset)  # type: ignore[arg-type]

    def in_child() -> None:
        bound = method()
        if bound is not None:
            bound()

    os.register_at_fork(after_in_child=in_child)


def _usable(conn: psycopg.Connection[Any]) -> bool:
    """False for a connection the server has ended; a ping only when it has sent something."""
    if conn.closed or conn.broken:
        return False
    if not _has_input(conn.fileno()):
        return True
    try:
        conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    with suppress(psycopg.Error):
        conn.close()


def _has_input(fd: int) -> bool:
    """True when the socket has bytes (or EOF) waiting; never blocks."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


class DriverStatement:
    """A Core statement compiled once, to run on the driver's own connection.

    SQLAlchemy's execution machinery (compiled-cache lookup, execution context,
    result wrapping) costs more CPU per statement than psycopg's own work; hot paths
    with fixed statements compile them here once and run `sql` with `bind(values)`
    on `Database.driver_transaction()` / `driver_autocommit()` connections. Every bind
    must be named; those given a value in the statement (literals, NULLs) are kept,
    the others are taken from `values`. No SQLAlchemy type processing runs: values go
    to psycopg as they are, so datetimes must be timezone-aware (as UTCDateTime
    demands) and JSON wrapped (psycopg.types.json.Jsonb).
    """

    def __init__(self, statement: sa.Executable, dialect: sa.Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        prefetch = [*getattr(compiled, "insert_prefetch", ()), *compiled.update_prefetch]
        if prefetch or compiled.positiontup:
            # Python-side column defaults or positional binds need SQLAlchemy's execution.
            raise ValueError(f"statement needs SQLAlchemy to execute: {compiled.string}")
        self.sql: str = compiled.string
        self.required = tuple(name for name, bind in compiled.binds.items() if bind.required)
        self.fixed = {
            name: value for name, value in compiled.params.items() if name not in self.required
        }

    def bind(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The statement's parameters: its fixed values, then the required ones from `values`."""
        params = dict(self.fixed)
        for name in self.required:
            params[name] = values[name]
        return params


def execute_many(
    session: Session, statement: DriverStatement, rows: Sequence[Mapping[str, Any]]
) -> list[tuple[Any, ...]]:
    """Run a statement once per row in the session's transaction, on its driver connection.

    psycopg pipelines the rows (one round trip) and parses the short statement once,
    where a multi-row VALUES statement is parsed anew for every batch. Pending ORM
    changes are flushed first. Returns what RETURNING gave, in row order (a row that
    returned nothing, e.g. skipped by ON CONFLICT DO NOTHING, adds nothing).
    """
    if not rows:
        return []
    conn = driver_connection(session)
    returned: list[tuple[Any, ...]] = []
    with conn.cursor() as cur:
        cur.executemany(statement.sql, [statement.bind(row) for row in rows], returning=True)
        while True:
            if cur.description is not None:
                returned.extend(cur.fetchall())
            if not cur.nextset():
                break
    return returned


def json_rows_insert(table: sa.Table, columns: Sequence[str]) -> postgresql.Insert:
    """`INSERT INTO table (columns) SELECT columns FROM json_populate_recordset(NULL::table,
    :rows)`: many rows in one statement, sent as one JSON array of objects keyed by column
    (`execute_json_rows`). Add ON CONFLICT / RETURNING as to any PostgreSQL insert.

    A batch is then one statement, parsed and planned once whatever its size, where
    `execute_many` costs the client and the server a statement per row; and the rows
    are encoded by the json module's C encoder, where array binds (`unnest`) are dumped
    element by element in Python. Columns not listed get their server default (no
    Python-side default applies); a listed column whose value is None (or absent) is NULL.
    """
    row_type = postgresql.dialect().identifier_preparer.format_table(table)
    rows = sa.select(*[sa.column(c) for c in columns]).select_from(
        sa.func.json_populate_recordset(
            sa.literal_column(f"NULL::{row_type}"), sa.bindparam("rows", type_=sa.JSON)
        )
    )
    return postgresql.insert(table).from_select(list(columns), rows, include_defaults=False)


def _json_value(value: Any) -> Any:
    """What `execute_json_rows` sends for a value JSON has no type for: the text
    PostgreSQL reads back as the column's value."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, psycopg.types.json.Json | psycopg.types.json.Jsonb):
        return value.obj
    raise TypeError(f"{type(value).__name__} is not a column value execute_json_rows can send")


#: JSON for `execute_json_rows`. Not ASCII-escaped: text goes in the connection's
#: encoding as a text parameter would (PostgreSQL refuses \u escapes of non-ASCII
#: characters in a database that is not UTF-8).
_JSON_ROWS = json.JSONEncoder(default=_json_value, ensure_ascii=False)


def execute_json_rows(
    session: Session, statement: DriverStatement, rows: Sequence[Mapping[str, Any]]
) -> list[tuple[Any, ...]]:
    """Run a statement built on `json_rows_insert` once for all `rows` (dicts keyed by
    column), in the session's transaction on its driver connection (pending ORM changes
    flushed first). Values as psycopg would take them: str, int, bool, None, Decimal,
    timezone-aware datetimes (a naive one is read in the server's zone), and lists or
    dicts for JSON columns (bare or wrapped in Json/Jsonb); floats go as their repr
    (not NaN or infinities). Returns what RETURNING gave (a row skipped, e.g. by ON
    CONFLICT DO NOTHING, adds nothing)."""
    if not rows:
        return []
    payload = _JSON_ROWS.encode(
        [{name: value for name, value in row.items() if value is not None} for row in rows]
    )
    conn = driver_connection(session)
    with conn.cursor() as cur:
        cur.execute(statement.sql, statement.bind({"rows": payload}))
        return cur.fetchall() if cur.description is not None else []


def driver_rows(conn: Any, statement: DriverStatement, values: Mapping[str, Any]) -> list[Any]:
    """Run a DriverStatement once on a driver connection (`driver_connection(session)`,
    `driver_autocommit()`); its rows as named tuples (read by attribute, as SQLAlchemy's
    rows are), [] for a statement that returns none."""
    with conn.cursor(row_factory=psycopg.rows.namedtuple_row) as cur:
        cur.execute(statement.sql, statement.bind(values))
        return cur.fetchall() if cur.description is not None else []


def driver_connection(session: Session) -> Any:
    """The psycopg connection of the session's transaction, pending ORM changes flushed.

    For statements compiled once (DriverStatement) that must commit with the session's
    own work; `adopt` makes the rows they wrote ORM objects of the session.
    """
    session.flush()
    return session.connection().connection.driver_connection


def adopt(session: Session, objects: Iterable[object]) -> None:
    """Make `objects`, whose rows a driver statement just wrote in the session's
    transaction, persistent in `session` as they are (no SELECT, no INSERT)."""
    for instance in objects:
        make_transient_to_detached(instance)
        session.add(instance)


class Database:
    """An engine, its session factory, and helpers that live as long as it does."""

    def __init__(self, url: str, *, pool_size: int = 10, echo: bool = False) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, pool_size=pool_size, echo=echo)
        failover.watch(self.engine)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False, info={_DATABASE: self})
        sa.event.listen(self.sessions, "after_commit", _run_after_commit)
        sa.event.listen(self.sessions, "after_soft_rollback", _forget_after_commit)
        self._attachments: dict[str, Any] = {}
        self._attachments_lock = threading.Lock()
        self._autocommit = AutocommitConnections(self.libpq_url, pool_size)

    @property
    def libpq_url(self) -> str:
        """This database's URL for a plain psycopg connection (LISTEN/NOTIFY, admin work)."""
        url = self.engine.url
        if isinstance(url.query.get("host"), tuple):
            # Several hosts: libpq takes them only as `host=a,b port=1,2` (or in its own URL
            # form, which SQLAlchemy does not write); the dialect builds exactly that.
            _, params = self.engine.dialect.create_connect_args(url)
            params.pop("context", None)  # the dialect's adapters, not a libpq option
            return psycopg.conninfo.make_conninfo("", **params)
        return url.set(drivername="postgresql").render_as_string(hide_password=False)

    @contextmanager
    def driver_transaction(self) -> Iterator[Any]:
        """One transaction on a pooled connection's own psycopg connection (PostgreSQL).

        For the few hot paths where SQLAlchemy's own cost per session and per statement
        (about 0.1 ms each, docs/PERFORMANCE.md) is most of the request: run statements
        compiled once by `driver_statement`. Commits on success, rolls back on error;
        the connection goes back to the pool, or is dropped if it died meanwhile.
        """
        pooled = self.engine.raw_connection()
        conn = pooled.driver_connection
        committing = False
        try:
            with conn.transaction():
                yield conn
                committing = True  # leaving the block sends COMMIT
        except Exception as err:
            if failover.outcome_unknown(err, committing=committing):
                raise failover.CommitOutcomeUnknown.of(err) from err
            raise
        finally:
            _return_driver_connection(pooled, conn)

    @contextmanager
    def driver_autocommit(self, *, writes: bool = True) -> Iterator[Any]:
        """A psycopg connection in autocommit, from the fast executor's own pool.

        For hot statements that are atomic alone (reads, or one statement that writes
        everything), without SQLAlchemy's layers (see AutocommitConnections). A write
        whose connection breaks under it may have committed: `CommitOutcomeUnknown`
        (`writes=False` for reads only, which a caller may simply run again).
        """
        conn, pool = self._autocommit.get()
        try:
            yield conn
        except BaseException as err:
            if failover.sqlstate(err) == failover.READ_ONLY:
                # A demoted primary: every pooled connection is to it; new ones find the
                # server that takes writes (target_session_attrs=read-write).
                _close_quietly(conn)
                pool.drain()
            if writes and failover.outcome_unknown(err, committing=False):
                raise failover.CommitOutcomeUnknown.of(err) from err
            raise
        finally:
            self._autocommit.put(conn, pool)

    def driver_statement(self, statement: sa.Executable) -> DriverStatement:
        """`statement` compiled for this engine's driver (see DriverStatement)."""
        return DriverStatement(statement, self.engine.dialect)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session whose work commits on success and rolls back on error.

        A failover before COMMIT is sent rolls it back whole (the error as raised); one
        that cuts the COMMIT raises `CommitOutcomeUnknown`: it may have committed.
        """
        session = self.sessions()
        committing = False
        try:
            yield session
            session.flush()  # pending rows are sent before the COMMIT, not with it
            committing = True
            session.commit()
        except BaseException as err:
            session.rollback()
            if failover.outcome_unknown(err, committing=committing):
                raise failover.CommitOutcomeUnknown.of(err) from err
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

    @contextmanager
    def autocommit(self) -> Iterator[sa.Connection]:
        """A pooled connection on which each statement is its own transaction.

        For single-statement reads on hot paths: no BEGIN and ROLLBACK round trips
        around them. Use `reader()` when several reads must see one snapshot.
        """
        with self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def attachment(self, key: str, factory: Callable[[Database], T]) -> T:
        """The helper stored under `key`, made by `factory(self)` on first use.

        For per-database machinery built lazily (no import-time side effects); an
        attachment with a `close()` is closed by `dispose()`.
        """
        found = self._attachments.get(key)
        if found is None:
            with self._attachments_lock:
                found = self._attachments.get(key)
                if found is None:
                    found = self._attachments[key] = factory(self)
        return found  # type: ignore[no-any-return]

    def dispose(self) -> None:
        with self._attachments_lock:
            attachments, self._attachments = list(self._attachments.values()), {}
        for attachment in attachments:
            close = getattr(attachment, "close", None)
            if close is not None:
                close()
        self._autocommit.close()
        self.engine.dispose()


def database_of(session: Session) -> Database | None:
    """The Database whose session factory made `session` (None for other sessions)."""
    db: Database | None = session.info.get(_DATABASE)
    return db


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Call `callback` once the session's current transaction has committed.

    Forgotten if it rolls back. The same callback registered twice in a transaction
    runs once. Callbacks run in the committing thread and must be quick; an error
    in one is logged, never raised (the commit has happened).
    """
    callbacks: dict[Callable[[], None], None] | None = session.info.get(_AFTER_COMMIT)
    if callbacks is None:
        callbacks = session.info[_AFTER_COMMIT] = {}
    callbacks[callback] = None


def _run_after_commit(session: Session) -> None:
    # Also dispatched when a SAVEPOINT is released: wait for the real commit.
    if session.in_nested_transaction():
        return
    callbacks = session.info.pop(_AFTER_COMMIT, None)
    for callback in callbacks or ():
        try:
            callback()
        except Exception:
            log.exception("after-commit callback %r failed", callback)


def _forget_after_commit(session: Session, previous: SessionTransaction) -> None:
    # A rolled-back SAVEPOINT keeps them: the outer transaction may still commit
    # work registered before it (a spare callback is harmless, a lost one is not).
    if previous.parent is None:
        session.info.pop(_AFTER_COMMIT, None)


def is_unique_violation(exc: BaseException) -> bool:
    """True when a DBAPI error (or SQLAlchemy's wrapper of one) is a unique-constraint failure."""
    orig = getattr(exc, "orig", exc)
    return getattr(orig, "sqlstate", None) == "23505"
