"""Settle's processes as subprocesses for e2e tests and benchmarks: started as a user would.

    with SettleProcesses(env) as procs:
        consume = procs.start("consume", "notifier", "consume", ready="consumer ready")
        ...
        consume.kill()                      # SIGKILL, no goodbye
        procs.restart(consume)

Each process runs `python -m services.cli ...` (the `settle` console script) in its
own process group with its output in a log file; readiness is a line in that log.
Every wait is bounded, and every process is stopped (SIGTERM, then SIGKILL) when
the context exits, whatever happened.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: How long a process may take to say it is ready (the CLI imports a lot).
READY_TIMEOUT_S = 40.0
#: How long SIGTERM gets before SIGKILL when stopping.
STOP_TIMEOUT_S = 10.0


def settle_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", *args]


@dataclass
class SettleProcess:
    name: str
    args: tuple[str, ...]
    env: dict[str, str]
    ready: str | None
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    #: Log offset where the current run began (a restart appends to the same file).
    _offset: int = field(default=0)

    def start(self, *, wait: bool = True) -> SettleProcess:
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        try:
            self.proc = subprocess.Popen(
                settle_argv(*self.args),
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> SettleProcess:
        if self.ready is not None:
            self.wait_for_log(self.ready, timeout)
        return self

    def output(self) -> str:
        """What this run has logged so far."""
        with open(self.log_path, "rb") as handle:
            handle.seek(self._offset)
            return handle.read().decode("utf-8", errors="replace")

    def wait_for_log(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}) before '{text}':\n"
                    + self.output()[-3000:]
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} not ready after {timeout}s:\n" + self.output()[-3000:]
                )
            time.sleep(0.1)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup, no acks, as in a crash."""
        if self.running:
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_TIMEOUT_S)
            except ProcessLookupError:
                pass
        return self.proc.returncode


class SettleProcesses:
    """A group of processes sharing one environment; all stopped on exit."""

    def __init__(self, env: Mapping[str, str], log_dir: Path | None = None) -> None:
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="settle-procs-"))
        self.processes: list[SettleProcess] = []

    def start(
        self,
        name: str,
        *args: str,
        ready: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
    ) -> SettleProcess:
        """Start `settle <args>`; with `wait`, return once its log shows `ready`."""
        process = SettleProcess(
            name=name,
            args=args,
            env={**self.env, **(env or {})},
            ready=ready,
            log_path=self.log_dir / f"{name}.log",
        )
        self.processes.append(process)
        try:
            return process.start(wait=wait)
        except BaseException:
            process.stop()
            raise

    def restart(self, process: SettleProcess, *, wait: bool = True) -> SettleProcess:
        process.stop()
        return process.start(wait=wait)

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            try:
                process.stop()
            except Exception:  # keep stopping the others
                if process.proc is not None and process.proc.poll() is None:
                    process.proc.kill()

    def logs(self) -> str:
        """Every process's log, for a failure message."""
        return "\n".join(
            f"--- {p.name} ---\n{p.log_path.read_text(errors='replace')[-4000:]}"
            for p in self.processes
            if p.log_path.exists()
        )

    def __enter__(self) -> SettleProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


# --- API processes (gunicorn) ----------------------------------------------------------

#: How long a started API may take to answer its first request (it imports a lot).
API_READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def wait_answering(
    process: SettleProcess, port: int, path: str, timeout_s: float = API_READY_TIMEOUT_S
) -> None:
    """Return once `path` answers on `port` (bounded; fails if the process exits)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.running:
            raise AssertionError(f"{process.name} exited:\n{process.output()[-3000:]}")
        try:
            if _status(port, path) in (200, 503):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{process.name} did not answer in time:\n{process.output()[-3000:]}")


def children(pid: int) -> set[int]:
    """The child processes of `pid` (gunicorn's workers, for its master)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(p) for p in (task / "children").read_text().split())
    return found


@dataclass
class Api:
    """A `settle <service> api` process (gunicorn) on a port of its own."""

    process: SettleProcess
    port: int
    status_path: str

    def workers(self) -> set[int]:
        assert self.process.proc is not None
        return children(self.process.proc.pid)


def start_api(
    procs: SettleProcesses, service: str, status_path: str, *, name: str | None = None
) -> Api:
    """`settle <service> api` with one worker of two threads; returned once it answers."""
    port = free_port()
    process = procs.start(
        name or f"{service}-api",
        service,
        "api",
        "--port",
        str(port),
        "--workers",
        "1",
        "--threads",
        "2",
        wait=False,
    )
    wait_answering(process, port, status_path)
    return Api(process, port, status_path)
