"""Scale-out: deliveries/s with 1, 2 and 4 worker processes and 1 and 2 consumers.

    .venv/bin/python bench/scale.py [--quick] [--events 3000] [--threads 8]
        [--workers 1,2,4] [--consumers 1,2] [--ordered] [--accounts 64] [--json FILE]

Each configuration starts, as in production, on one fresh PostgreSQL database and
RabbitMQ (names under a unique SETTLE_AMQP_PREFIX): `settle core worker` (the relay),
`--consumers` x `settle notifier consume`, and `settle notifier worker --processes N`
(each process `--threads` threads), delivering to one receiver on 127.0.0.1 in its own
process (bench/webhook_receiver.py). `--events` events are committed to core's outbox
while the relay is stopped (so the script's own commits are not what is measured),
then the relay starts; deliveries/s is measured at the receiver between the 10 % and
90 % marks. CPU is counted from the relay's start (the events it published in its
first moments, before the count began, make the relay's share a little low).

Where the time goes, per configuration:
- CPU ms per delivery of each process (relay, consumers, workers, PostgreSQL's backends
  of the run's database, RabbitMQ, the receiver), from /proc;
- wall time per delivery in three stages, from the rows: outbox -> stored by a
  consumer (the backlog's wait for the relay, bus, consume; `received_at - created_at`),
  stored -> first attempt started (job queues, claims), the attempt itself (the
  receiver's round trip). With the whole batch waiting at once, the first two are
  mostly queueing: where the backlog waits says which stage is the bottleneck.

`--ordered`: the endpoint orders per account (`ordering: per_account`) and the events
name `--accounts` accounts in turn; compare with the same run without it.
Prints the machine's load average: figures on a shared machine vary with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from bench.harness import ROOT, drop_database, fresh_database, machine
from bench.webhooks import ReceiverProcess, cpu_seconds, percentile, wait_received
from services.core import outbox
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.models import PER_ACCOUNT, Attempt, Delivery, StoredEvent
from services.notifier.secrets import SecretBox
from shared import events
from shared.bus import BusNames
from shared.db import Database
from shared.identity import service as identity
from tests.support import keys
from tests.support.pipeline import delete_bus, unique_prefix
from tests.support.processes import SettleProcesses
from tests.support.services import AMQP_URL

SECRET_KEY = "bench-scale-secret-key"
#: Events committed per transaction (core's busiest writer, the watcher, writes hundreds).
BATCH = 250


def emit(db: Database, tenant_id: str, n: int, accounts: int) -> list[str]:
    """n events about `accounts` accounts in turn (numbered by core: `sequence`), in
    transactions of BATCH (the bulk path, as the chain watcher writes)."""
    ids: list[str] = []
    for start in range(0, n, BATCH):
        batch = [
            events.envelope(
                events.DEPOSIT_CREDITED,
                tenant_id,
                {"deposit": {"id": f"dep_{i}", "accountId": f"acc_{i % accounts}"}},
            )
            for i in range(start, min(n, start + BATCH))
        ]
        with db.transaction() as session:
            outbox.emit_many(session, batch)
        ids += [e["id"] for e in batch]
    return ids


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def broker_pid() -> int | None:
    """The machine's own RabbitMQ (the oldest `beam.smp`): other RabbitMQ nodes that
    tests start and stop (the chaos test's cluster) must not count."""
    oldest: tuple[int, int] | None = None
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmd = handle.read()
        except OSError:
            continue
        fields = _stat(int(entry))
        if b"beam.smp" in cmd and fields is not None:
            started = int(fields[19])
            if oldest is None or started < oldest[0]:
                oldest = (started, int(entry))
    return None if oldest is None else oldest[1]


def cpu(database: str, pids: dict[str, int], broker: int | None) -> dict[str, float]:
    """`cpu_seconds`, RabbitMQ being the machine's own broker alone."""
    usage = cpu_seconds(database, pids)
    usage.pop("rabbitmq", None)
    fields = None if broker is None else _stat(broker)
    if fields is not None:
        usage["rabbitmq"] = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return usage


def stages(db: Database, ids: list[str]) -> dict[str, float]:
    """Mean and p99 ms per stage of these events' deliveries (first attempts only)."""
    with db.reader() as session:
        rows = session.execute(
            sa.select(
                StoredEvent.created_at,
                StoredEvent.received_at,
                Attempt.attempted_at,
                Attempt.latency_ms,
            )
            .join(Delivery, Delivery.event_id == StoredEvent.id)
            .join(Attempt, (Attempt.delivery_id == Delivery.id) & (Attempt.number == 1))
            .where(StoredEvent.id.in_(ids))
        ).all()
    if not rows:
        return {}
    parts = {
        "commit_to_stored": [(r.received_at - r.created_at).total_seconds() * 1000 for r in rows],
        "stored_to_attempt": [
            (r.attempted_at - r.received_at).total_seconds() * 1000 for r in rows
        ],
        "attempt": [r.latency_ms or 0.0 for r in rows],
    }
    out: dict[str, float] = {}
    for name, values in parts.items():
        values.sort()
        out[f"{name}_mean_ms"] = round(sum(values) / len(values), 1)
        out[f"{name}_p99_ms"] = round(percentile(values, 0.99), 1)
    return out


def run_one(
    url: str,
    database: str,
    rx: ReceiverProcess,
    tenant_id: str,
    *,
    workers: int,
    consumers: int,
    threads: int,
    n_events: int,
    accounts: int,
) -> dict[str, Any]:
    """One configuration on its own processes and bus; its figures."""
    db = Database(url, pool_size=4)
    names = BusNames(unique_prefix().replace("test-", "bench-"))
    data_dir = Path(tempfile.mkdtemp(prefix="settle-bench-scale-"))
    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": str(data_dir),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
        "SETTLE_AMQP_URL": AMQP_URL,
        "SETTLE_AMQP_PREFIX": names.prefix,
        "SETTLE_SECRET_KEY": SECRET_KEY,
        "SETTLE_WEBHOOK_ALLOW_PRIVATE": "true",
        # One endpoint: let it use every thread (the fair shares are not what is measured).
        "SETTLE_WEBHOOK_ENDPOINT_CONCURRENCY": str(threads * workers),
        "SETTLE_NOTIFIER_WORKER_THREADS": str(threads),
    }
    procs = SettleProcesses(env, data_dir)
    try:
        with procs:
            started = [
                procs.start(
                    "core-worker", "core", "worker", ready="outbox relay started", wait=False
                ),
                *[
                    procs.start(
                        f"consume-{k}", "notifier", "consume", ready="consumer ready", wait=False
                    )
                    for k in range(consumers)
                ],
                procs.start(
                    "worker",
                    "notifier",
                    "worker",
                    "--processes",
                    str(workers),
                    "--threads",
                    str(threads),
                    ready="worker ready",
                    wait=False,
                ),
            ]
            for process in started:
                process.wait_ready()
            rx.reset()
            warm = emit(db, tenant_id, 100, accounts)
            wait_received(rx, set(warm), 120)
            # The events wait in the outbox, the relay stopped, so that the delivery path
            # is measured, not how fast this script commits; then the relay starts.
            relay = started[0]
            relay.stop()
            began = time.monotonic()
            ids = emit(db, tenant_id, n_events, accounts)
            committed = time.monotonic() - began
            rx.reset()
            procs.restart(relay)
            pids = {p.name: p.proc.pid for p in started if p.proc is not None}
            pids["receiver"] = rx.proc.pid
            load = os.getloadavg()[0]
            broker = broker_pid()
            cpu_before = cpu(database, pids, broker)
            hits = wait_received(rx, set(ids), timeout=max(120.0, n_events / 10))
            cpu_after = cpu(database, pids, broker)
            times = sorted(min(hits[i]) for i in ids)
            lo, hi = times[int(n_events * 0.1)], times[int(n_events * 0.9)]
            rate = (int(n_events * 0.9) - int(n_events * 0.1)) / max(hi - lo, 1e-6)
            used = {
                name: round((cpu_after[name] - cpu_before.get(name, 0.0)) * 1000 / n_events, 2)
                for name in sorted(cpu_after)
            }
            time.sleep(1.0)  # the last attempts recorded
            return {
                "workers": workers,
                "consumers": consumers,
                "threads": threads,
                "events": n_events,
                "deliveries_per_s": round(rate, 1),
                "commit_s": round(committed, 2),
                "load_1m": round(load, 1),
                "cpu_ms_per_delivery": used,
                "cpu_ms_total": round(sum(used.values()), 2),
                **stages(db, ids),
            }
    finally:
        delete_bus(names)
        db.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a CI-sized run")
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--threads", type=int, default=8, help="threads per worker process")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts to run")
    parser.add_argument("--consumers", default="1,2", help="consumer process counts to run")
    parser.add_argument("--ordered", action="store_true", help="ordering: per_account")
    parser.add_argument("--accounts", type=int, default=64, help="accounts the events name")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    n_events = args.events or (600 if args.quick else 3000)
    database = f"settle_bench_scale_{os.getpid()}"
    url = fresh_database(database)
    rx = ReceiverProcess()
    results: list[dict[str, Any]] = []
    try:
        db = Database(url, pool_size=2)
        with db.transaction() as session:
            tenant, _ = identity.create_tenant(session, "bench-scale")
            tenant_id = tenant.id
            endpoint_domain.create_endpoint(
                session,
                SecretBox(SECRET_KEY),
                tenant_id,
                name="bench",
                url=f"{rx.base}/hook",
                event_types=[events.DEPOSIT_CREDITED],
                allow_private=True,
                max_endpoints=10,
                ordering=PER_ACCOUNT if args.ordered else None,
            )
        db.dispose()
        mode = f"ordered per account over {args.accounts} accounts" if args.ordered else "unordered"
        print(f"Scale-out on {machine()}: {n_events} events, one endpoint, {mode}")
        print(
            "  workers consumers  deliveries/s  load | CPU ms/delivery (total: by process)"
            " | wall ms mean: outbox->stored, stored->attempt, attempt"
        )
        for consumers in [int(c) for c in args.consumers.split(",")]:
            for workers in [int(w) for w in args.workers.split(",")]:
                figures = run_one(
                    url,
                    database,
                    rx,
                    tenant_id,
                    workers=workers,
                    consumers=consumers,
                    threads=args.threads,
                    n_events=n_events,
                    accounts=args.accounts,
                )
                results.append(figures)
                by_process = ", ".join(
                    f"{name} {ms}" for name, ms in figures["cpu_ms_per_delivery"].items()
                )
                print(
                    f"  {workers:7d} {consumers:9d} {figures['deliveries_per_s']:13.0f}"
                    f" {figures['load_1m']:5.1f} | {figures['cpu_ms_total']:.2f}: {by_process}"
                    f" | {figures.get('commit_to_stored_mean_ms')},"
                    f" {figures.get('stored_to_attempt_mean_ms')},"
                    f" {figures.get('attempt_mean_ms')}",
                    flush=True,
                )
    finally:
        rx.stop()
        drop_database(database)
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine(), "ordered": args.ordered, "runs": results}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
