"""Idle CPU of every Settle process: what each burns with nothing to do.

    .venv/bin/python bench/idle.py [--seconds 60] [--warmup 15]

Starts, on a fresh PostgreSQL database and RabbitMQ (names under a unique
SETTLE_AMQP_PREFIX), the production processes as compose runs them (`settle core api`,
`settle core worker`, `settle notifier api`, `settle notifier consume`, `settle notifier
worker`) and `settle dev` in a data dir of its own (its embedded PostgreSQL included).
One event goes through the whole path first (so every connection, pool and thread that
traffic opens is open), then after `--warmup` seconds each process's CPU time (user +
system, with its children: gunicorn's workers) is read with psutil before and after
`--seconds` of idleness; settle dev's embedded PostgreSQL (server and backends) is shown
on a line of its own. The goal: every Settle process under 1 % of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import requests

from bench.harness import drop_database, free_port, fresh_database, machine
from bench.webhooks import ReceiverProcess, emit_batch, wait_received
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.secrets import SecretBox
from shared import events
from shared.bus import BusNames
from shared.db import Database
from shared.identity import service as identity
from tests.support import keys
from tests.support.pipeline import delete_bus, unique_prefix
from tests.support.processes import SettleProcesses, wait_answering

#: A name of this run's own (another run on the same server must not drop it).
DATABASE = f"settle_bench_idle_{os.getpid()}"
SECRET_KEY = "bench-idle-secret-key-with-enough-length"
#: The goal: percent of one core per process at rest.
GOAL_PERCENT = 1.0
#: The line of settle dev's embedded PostgreSQL server.
EMBEDDED_PG = "settle dev's PostgreSQL"


def group(pid: int) -> list[psutil.Process]:
    """`pid` and every process under it."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_by_process(pids: dict[str, int]) -> dict[str, dict[int, float]]:
    """name -> {pid: CPU seconds so far} for each process and its children."""
    usage: dict[str, dict[int, float]] = {}
    for name, pid in pids.items():
        usage[name] = {}
        for proc in group(pid):
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            usage[name][proc.pid] = times.user + times.system
    return usage


def postmaster(data_dir: Path) -> int | None:
    """The PostgreSQL server whose data lives under `data_dir` (settle dev's embedded one)."""
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if (proc.info["name"] or "").startswith("postgres") and str(data_dir) in cmdline:
            return int(proc.pid)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="idle time measured")
    parser.add_argument("--warmup", type=float, default=15.0, help="idle time before measuring")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()

    url = fresh_database(DATABASE)
    db = Database(url, pool_size=2)
    names = BusNames(unique_prefix().replace("test-", "bench-"))
    rx = ReceiverProcess()
    with db.transaction() as session:
        tenant, _ = identity.create_tenant(session, "bench-idle")
        tenant_id = tenant.id
        endpoint_domain.create_endpoint(
            session,
            SecretBox(SECRET_KEY),
            tenant_id,
            name="idle",
            url=f"{rx.base}/hook",
            event_types=[events.DEPOSIT_CREDITED],
            allow_private=True,
            max_endpoints=10,
        )
    work = Path(tempfile.mkdtemp(prefix="settle-bench-idle-"))
    (work / "data").mkdir()
    (work / "dev").mkdir()
    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": str(work / "data"),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
        "SETTLE_AMQP_URL": os.environ.get(
            "SETTLE_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"
        ),
        "SETTLE_AMQP_PREFIX": names.prefix,
        "SETTLE_SECRET_KEY": SECRET_KEY,
        "SETTLE_WEBHOOK_ALLOW_PRIVATE": "true",
    }
    core_port, notifier_port, dev_port = free_port(), free_port(), free_port()
    procs = SettleProcesses(env, work)
    figures: dict[str, float] = {}
    try:
        with procs:
            core_api = procs.start("core api", "core", "api", "--port", str(core_port), wait=False)
            notifier_api = procs.start(
                "notifier api", "notifier", "api", "--port", str(notifier_port), wait=False
            )
            workers = [
                procs.start(
                    "core worker", "core", "worker", ready="outbox relay started", wait=False
                ),
                procs.start(
                    "notifier consume", "notifier", "consume", ready="consumer ready", wait=False
                ),
                procs.start(
                    "notifier worker", "notifier", "worker", ready="worker ready", wait=False
                ),
            ]
            # settle dev on its own: its embedded PostgreSQL and in-process broker (empty
            # values count as unset, over the production processes' settings)
            dev_env = {
                "SETTLE_DATABASE_URL": "",
                "SETTLE_AMQP_URL": "",
                "SETTLE_AMQP_PREFIX": "",
                "SETTLE_DATA_DIR": str(work / "dev"),
            }
            dev = procs.start("settle dev", "dev", "--port", str(dev_port), env=dev_env, wait=False)
            for process in workers:
                process.wait_ready()
            wait_answering(core_api, core_port, "/v1/status")
            wait_answering(notifier_api, notifier_port, "/v1/notifier/status")
            wait_answering(dev, dev_port, "/v1/status", timeout_s=120)
            # One event through the whole path, and one request to each API.
            warm = emit_batch(db, tenant_id, 1)
            wait_received(rx, set(warm), 60)
            for port, path in (
                (core_port, "/v1/chains"),
                (notifier_port, "/v1/notifier/status"),
                (dev_port, "/v1/chains"),
            ):
                requests.get(f"http://127.0.0.1:{port}{path}", timeout=10)
            time.sleep(args.warmup)

            pids = {p.name: p.proc.pid for p in procs.processes if p.proc is not None}
            embedded = postmaster(work / "dev")
            if embedded is not None:  # pg_ctl detaches it from settle dev
                pids[EMBEDDED_PG] = embedded
            load = os.getloadavg()[0]
            before = cpu_by_process(pids)
            started = time.monotonic()
            time.sleep(args.seconds)
            after = cpu_by_process(pids)
            elapsed = time.monotonic() - started
            load_after = os.getloadavg()[0]
            for process in procs.processes:
                if not process.running:
                    raise SystemExit(f"{process.name} exited:\n{process.output()[-2000:]}")
    finally:
        rx.stop()
        delete_bus(names)
        db.dispose()
        drop_database(DATABASE)

    print(f"Idle CPU on {machine()} (load {load:.1f} -> {load_after:.1f})")
    print(f"  {elapsed:.0f} s idle after {args.warmup:.0f} s; goal < {GOAL_PERCENT} % of a core")
    worst = 0.0
    for name in after:
        spent = {
            pid: seconds - before.get(name, {}).get(pid, 0.0)
            for pid, seconds in after[name].items()
        }
        percent = 100 * sum(spent.values()) / elapsed
        if name != EMBEDDED_PG:  # PostgreSQL's own housekeeping, shown for reference
            worst = max(worst, percent)
        figures[name] = round(percent, 3)
        detail = f"  ({len(spent)} processes)" if len(spent) > 1 else ""
        print(f"  {name:<24} {percent:6.2f} % of a core{detail}")
    verdict = "met" if worst < GOAL_PERCENT else "NOT met"
    print(f"  worst Settle process: {worst:.2f} % (goal < {GOAL_PERCENT} %: {verdict})")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "percent": figures}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
