"""Reaching PostgreSQL and RabbitMQ from tests.

PostgreSQL: the machine's server on 127.0.0.1:5432 when it answers (always in CI: `CI`
set and no server fails the run loudly); on a machine without one (or with
SETTLE_TEST_PG=embedded), the embedded server of `shared/embedded_postgres.py` (the one
`settle dev` uses), started once per run in a folder kept between runs. RabbitMQ: the
machine's; the tests that need it skip on a laptop without it and fail in CI.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from shared import embedded_postgres

AMQP_URL = os.environ.get("SETTLE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
#: The machine's PostgreSQL (override with SETTLE_TEST_PG_ADMIN_URL).
MACHINE_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Where the embedded test server keeps its files (reused across runs: starts in ~0.2 s).
EMBEDDED_TEST_PG = Path(
    os.environ.get("SETTLE_TEST_EMBEDDED_PG")
    or Path(__file__).resolve().parents[2] / ".settle-test-pg"
)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip (or, in CI, fail) when a service does not answer."""
    if port_open(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run it (see .ci/run)", pytrace=False)
    pytest.skip(message)


def require_rabbitmq() -> None:
    require_service("RabbitMQ", "127.0.0.1", 5672)


@functools.cache
def pg_admin_url() -> str:
    """libpq URL of a maintenance database on the PostgreSQL the tests use (see module doc)."""
    explicit = os.environ.get("SETTLE_TEST_PG_ADMIN_URL")
    if explicit:
        return explicit
    if os.environ.get("SETTLE_TEST_PG") == "embedded":  # as on a machine without a server
        return embedded_postgres.start(EMBEDDED_TEST_PG).admin_url
    if port_open("127.0.0.1", 5432):
        return MACHINE_PG_ADMIN_URL
    if os.environ.get("CI"):
        pytest.fail(
            "PostgreSQL is not reachable on 127.0.0.1:5432; CI must run it (see .ci/run)",
            pytrace=False,
        )
    return embedded_postgres.start(EMBEDDED_TEST_PG).admin_url


def create_database(name: str) -> str:
    """A new, empty database `name` (dropped first if left over); its SQLAlchemy URL."""
    drop_database(name)
    with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(name)


def drop_database(name: str) -> None:
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
        conn.execute(statement)


def database_url(name: str) -> str:
    """SQLAlchemy URL (psycopg 3) of database `name` on the tests' server."""
    info = psycopg.conninfo.conninfo_to_dict(pg_admin_url())
    info["dbname"] = name
    return "postgresql+psycopg://" + _libpq_to_url_tail(info)


def _libpq_to_url_tail(info: dict[str, object]) -> str:
    """user@host:port/dbname?host=... from conninfo parts (Unix sockets as a query)."""
    user = info.get("user") or "postgres"
    host = str(info.get("host") or "")
    port = info.get("port")
    name = info["dbname"]
    if host.startswith("/"):
        return f"{user}@/{name}?host={host}" + (f"&port={port}" if port else "")
    return f"{user}@{host or '127.0.0.1'}" + (f":{port}" if port else "") + f"/{name}"


def clone_database(template: str, name: str) -> str:
    """A new database `name` copied from database `template` (no one may be connected to it)."""
    drop_database(name)
    statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template)
    )
    with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
        conn.execute(statement)
    return database_url(name)


def require_tool(name: str, package: str) -> str:
    """The path of an executable from Debian's `package`; skip without it (fail in CI,
    which must install it: see .ci/run). Looks in the sbin folders a non-root PATH lacks."""
    import shutil

    found = shutil.which(name) or next(
        (
            str(Path(folder) / name)
            for folder in ("/usr/sbin", "/usr/local/sbin", "/usr/bin")
            if os.access(Path(folder) / name, os.X_OK)
        ),
        None,
    )
    if found:
        return found
    message = f"{name} is not installed (apt-get install {package})"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must install it (see .ci/run)", pytrace=False)
    pytest.skip(message)
