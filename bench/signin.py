"""What a sign-in flood does to everyone else: GET /v1/chains latency, quiet and flooded.

    .venv/bin/python bench/signin.py [--seconds 15] [--root CHECKOUT]

Starts `settle core api` as production does (gunicorn, 2 workers of 4 threads, settings
from the environment) on a fresh database with one member, then measures the median
and p90 of `GET /v1/chains` from one client, one request at a time (at most 40 a second):

1. quiet;
2. while 8 clients, each at its own loopback address (127.0.0.10-17), send wrong
   passwords for the member as fast as they are answered (issue 11 measured 10 ms ->
   223 ms here);
3. while 8 clients send wrong passwords for random emails, each request from a fresh
   loopback address (a botnet: no failure counter ever fills; only the bound on
   password checks per process holds).

`--root` runs another checkout's code (e.g. one made with `git archive` of the commit
before a change) with this script's database and clients, so before and after are
measured in the same session. Prints one table; numbers move 2x between hosts and
with load, so compare runs made side by side.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, drop_database, free_port, fresh_database, machine
from shared.db import Database
from shared.identity import service as identity
from tests.support.keys import test_xpub

PASSWORD = "correct horse battery staple"
CLIENTS = 8
#: The prober's pace: 40 requests a second, well inside the per-address rate limit.
PACE_S = 0.025


def request(
    port: int, method: str, path: str, body: bytes | None = None, source: str = "127.0.0.1"
) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def probe(port: int, seconds: float) -> list[float]:
    """GET /v1/chains latencies (ms), one at a time, at most one per PACE_S, for `seconds`."""
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        status = request(port, "GET", "/v1/chains")
        took = time.perf_counter() - started
        latencies.append(took * 1000)
        assert status == 200, status
        time.sleep(max(0.0, PACE_S - took))
    return latencies


def flood(port: int, seconds: float, attempt: Callable[[int], tuple[str, str]]) -> Counter[int]:
    """CLIENTS threads sending wrong sign-ins for `seconds`; the answers' statuses."""
    stop = time.monotonic() + seconds
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def client(n: int) -> None:
        while time.monotonic() < stop:
            email, source = attempt(n)
            body = json.dumps({"email": email, "password": "wrong, but long enough"}).encode()
            try:
                status = request(port, "POST", "/v1/sessions", body, source)
            except OSError:
                status = 0
            with lock:
                statuses[status] += 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return statuses


def summary(latencies: list[float]) -> str:
    cuts = statistics.quantiles(latencies, n=10)
    return f"{statistics.median(latencies):8.1f} {cuts[8]:8.1f} {len(latencies):7d}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose code to run")
    args = parser.parse_args()
    name = f"settle_bench_signin_{os.getpid()}"
    url = fresh_database(name)
    try:
        return run(url, args.root.resolve(), args.seconds)
    finally:
        drop_database(name)


def run(url: str, root: Path, seconds: float) -> int:
    db = Database(url, pool_size=1)
    with db.transaction() as session:
        tenant, _ = identity.create_tenant(session, "Bench tenant")
        email = f"member-{uuid.uuid4().hex[:8]}@example.com"
        identity.add_member(session, tenant.id, email, "viewer", PASSWORD)
    db.dispose()
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="settle-bench-signin-")
    env = {
        **os.environ,
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": data_dir,
        "SETTLE_DEPOSIT_XPUB": test_xpub(),
        "SETTLE_AMQP_URL": "",
        "SETTLE_REDIS_URL": "",
        "PYTHONPATH": str(root),
    }
    argv = [sys.executable, "-m", "services.cli", "core", "api", "--port", str(port)]
    argv += ["--workers", "2", "--threads", "4"]
    log = tempfile.NamedTemporaryFile(prefix="settle-bench-signin-", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, env=env, cwd=root, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if request(port, "GET", "/v1/chains") == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"core api did not start; see {log.name}")
            time.sleep(0.2)
        probe(port, 2.0)  # warm up both workers
        rows = [("quiet", probe(port, seconds), Counter[int]())]

        def one_account(n: int) -> tuple[str, str]:
            return email, f"127.0.0.{10 + n}"

        def botnet(n: int) -> tuple[str, str]:
            a, b, c = random.randint(1, 254), random.randint(0, 255), random.randint(1, 254)
            return f"nobody-{uuid.uuid4().hex[:10]}@example.com", f"127.{a}.{b}.{c}"

        for label, attempt in (
            ("8 clients, 8 addresses, one account", one_account),
            ("8 clients, a fresh address per try", botnet),
        ):
            statuses: Counter[int] = Counter()
            flooding = threading.Thread(
                target=lambda a=attempt, s=statuses: s.update(flood(port, seconds + 1, a))
            )
            flooding.start()
            time.sleep(0.5)
            latencies = probe(port, seconds)
            flooding.join(seconds + 90)
            rows.append((label, latencies, statuses))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    print(f"code: {root}  machine: {machine()}  load: {os.getloadavg()[0]:.1f}")
    print(f"{'GET /v1/chains while':40s} {'median':>8s} {'p90':>8s} {'n':>7s}  sign-in answers")
    for label, latencies, statuses in rows:
        answers = ", ".join(f"{s}: {c}" for s, c in sorted(statuses.items())) or "-"
        print(f"{label:40s} {summary(latencies)}  {answers}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
