"""A PostgreSQL primary and its streaming standby on 127.0.0.1, from Debian's binaries.

    with PgCluster() as pg:                  # primary on one port, standby on another
        url = pg.url("settle")               # both hosts, target_session_attrs=read-write
        pg.create_database("settle")
        ...
        pg.promote_standby()                 # the standby takes writes
        pg.stop("primary")                   # the old primary goes away

The standby is a `pg_basebackup -R` of the primary, replicating synchronously
(`synchronous_standby_names = '*'`): a commit is acknowledged once the standby has it,
so promoting it loses no acknowledged write. Run as root, the servers run as the
`postgres` user (PostgreSQL refuses root). Everything is in a folder of its own under
the system's temporary folder (pytest's are closed to other users), removed on exit.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg
import pytest

from tests.support.processes import free_port

#: How long a server may take to start, stop or be promoted.
PG_WAIT_S = 60


def pg_bin() -> Path:
    """Debian's PostgreSQL binaries (the newest installed); skip without them (fail in CI)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if found:
        return found[-1].parent
    message = "PostgreSQL server binaries missing (apt-get install postgresql)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must install them (see .ci/run)", pytrace=False)
    pytest.skip(message)


class PgCluster:
    def __init__(self) -> None:
        self.bin = pg_bin()
        self.folder = Path(tempfile.mkdtemp(prefix="settle-pg-")) / "pg"
        self.ports = {"primary": free_port(), "standby": free_port()}
        self._as_postgres = os.geteuid() == 0
        self.running: set[str] = set()

    # -- plumbing ----------------------------------------------------------------------

    def _run(self, *argv: str, timeout: float = PG_WAIT_S) -> str:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}\n{done.stderr}")
        return done.stdout

    def _dir(self, node: str) -> Path:
        return self.folder / node

    def _configure(self, node: str, extra: str = "") -> None:
        with (self._dir(node) / "postgresql.auto.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                f"port = {self.ports[node]}\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.folder}'\n"
                "wal_level = replica\nmax_wal_senders = 8\nhot_standby = on\n"
                "fsync = off\nfull_page_writes = off\nmax_connections = 200\n" + extra
            )

    # -- life cycle --------------------------------------------------------------------

    def start(self) -> PgCluster:
        self.folder.mkdir(parents=True)
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            for path in (self.folder.parent, self.folder):
                os.chown(path, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self._dir("primary")), "-U", "postgres", "--auth=trust")
        self._configure("primary", "synchronous_standby_names = '*'\n")
        self.start_node("primary")
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.ports["primary"]),
            "-U",
            "postgres",
            "-D",
            str(self._dir("standby")),
            "-R",
            "-X",
            "stream",
        )
        # The standby's own settings: no synchronous standby of its own once promoted
        # (writes would wait for one that never comes).
        self._configure("standby", "synchronous_standby_names = ''\n")
        self.start_node("standby")
        return self

    def start_node(self, node: str) -> None:
        log = self.folder / f"{node}.log"
        self._run("pg_ctl", "-D", str(self._dir(node)), "-l", str(log), "-w", "start")
        self.running.add(node)

    def stop(self, node: str, mode: str = "fast") -> float:
        """Stop `node`; returns the seconds it took."""
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self._dir(node)), "-m", mode, "-w", "stop")
        self.running.discard(node)
        return time.monotonic() - started

    def promote_standby(self) -> float:
        """Promote the standby; returns the seconds until it takes writes."""
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self._dir("standby")), "-w", "promote")
        return time.monotonic() - started

    def close(self) -> None:
        for node in list(self.running):
            with contextlib.suppress(Exception):
                self.stop(node, "immediate")
        shutil.rmtree(self.folder.parent, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- addresses -----------------------------------------------------------------------

    def node_url(self, node: str, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.ports[node]}/{database}"

    def url(self, database: str) -> str:
        """Both servers, libpq's multi-host form: whichever takes writes is used."""
        hosts = ",".join(f"127.0.0.1:{self.ports[n]}" for n in ("primary", "standby"))
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.node_url("primary"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def wait_replicated(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary wrote."""
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.node_url("primary"), autocommit=True) as primary:
            (lsn,) = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone() or ("",)
        with psycopg.connect(self.node_url("standby"), autocommit=True) as standby:
            while time.monotonic() < deadline:
                row = standby.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)
                ).fetchone()
                if row and row[0]:
                    return
                time.sleep(0.05)
        raise AssertionError("the standby did not catch up")
