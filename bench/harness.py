"""Shared pieces of the benchmarks: databases, processes, wrk, reporting."""

from __future__ import annotations

import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get(
    "SETTLE_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def fresh_database(name: str) -> str:
    """Drop and create a PostgreSQL database; migrate it; return its URL."""
    from shared import components, migrate

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    for component in (components.IDENTITY, components.CORE, components.NOTIFIER):
        migrate.upgrade(component, url)
    return url


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def process(
    args: list[str], env: Mapping[str, str], ready_url: str | None = None, timeout_s: float = 30.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a process (its own group), wait for `ready_url` to answer, stop it after."""
    log = tempfile.NamedTemporaryFile(prefix="settle-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        args, env={**os.environ, **env}, cwd=ROOT, stdout=log, stderr=log, start_new_session=True
    )
    try:
        if ready_url:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{args} exited: see {log.name}")
                try:
                    if requests.get(ready_url, timeout=1).status_code < 500:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args} not ready after {timeout_s}s: see {log.name}")
                time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        log.close()


@dataclass(frozen=True)
class WrkResult:
    requests_per_s: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    requests: int
    errors: int


_LATENCY = re.compile(r"^\s*(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def wrk(
    url: str, *, duration_s: int, connections: int, threads: int = 2, script: str | None = None
) -> WrkResult:
    """Run wrk against a URL and parse its summary."""
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed: apt-get install wrk")
    args = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "--latency"]
    script_file = None
    if script:
        script_file = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
        script_file.write(script)
        script_file.close()
        args += ["-s", script_file.name]
    out = subprocess.run([*args, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    sock_err = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
    )
    errors = int(non2xx.group(1)) if non2xx else 0
    if sock_err:
        errors += sum(int(g) for g in sock_err.groups())
    lat = {m.group(1): float(m.group(2)) * _UNITS[m.group(3)] for m in _LATENCY.finditer(out)}
    return WrkResult(rps, lat.get("50"), lat.get("99"), total, errors)


def machine() -> str:
    cpus = os.cpu_count()
    mem = ""
    try:
        kb = int(
            next(line for line in open("/proc/meminfo") if line.startswith("MemTotal")).split()[1]
        )
        mem = f", {kb / 1024 / 1024:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return (
        f"{platform.machine()} {cpus} cores{mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def group_pids(pid: int) -> list[int]:
    """Every process in `pid`'s process group (a server started by `process`)."""
    pgid = os.getpgid(pid)
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the processes have used so far (those still alive)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _CLOCK_TICKS


def host_busy_seconds() -> float:
    """CPU time all cores spent busy since boot (to tell our load from everyone else's)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:8]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / _CLOCK_TICKS


def postgres_backend_pids(url: str) -> list[int]:
    """Server processes of one database, plus the WAL writer (commits flush through it)."""
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s OR backend_type = 'walwriter'",
            (name,),
        ).fetchall()
    return [int(row[0]) for row in rows]


def drop_database(name: str) -> None:
    """Drop a database `fresh_database` made (its connections are closed first)."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
