"""Webhook delivery: throughput against a bare POST loop, and commit-to-receipt latency.

    .venv/bin/python bench/webhooks.py [--quick] [--threads 16] [--worker-processes 1]

Starts, as in production, on a fresh PostgreSQL database and RabbitMQ (names under a
unique SETTLE_AMQP_PREFIX): `settle core worker` (the outbox relay), `settle notifier
consume` and `settle notifier worker`; a receiver on 127.0.0.1 in its own process.
Then, in one run:

1. throughput: N events committed to core's outbox at once; deliveries/s at the
   receiver between the 10 % and 90 % marks, against a bare `requests.Session`
   POST loop to the same receiver with the same number of threads (goal >= 0.8);
   also by CPU: the bare loop's CPU per request (its POSTing threads and the
   receiver) over the pipeline's per delivery (every process, PostgreSQL, RabbitMQ,
   the receiver), which the machine's other work moves far less;
2. latency: events committed one by one at a steady rate (default 200/s); p50/p99
   from each commit in core to its receipt (goal p99 < 50 ms);
3. nothing lost: every event received, each with one delivery, succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests
import sqlalchemy as sa

from bench.harness import (
    ROOT,
    drop_database,
    free_port,
    fresh_database,
    machine,
)
from bench.harness import cpu_seconds as process_cpu_seconds
from services.core import outbox
from services.core.models import OutboxEvent
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.models import Attempt, Delivery, StoredEvent
from services.notifier.secrets import SecretBox
from shared import events
from shared.bus import BusNames
from shared.db import Database
from shared.identity import service as identity
from tests.support import keys
from tests.support.partitions import steady_state_partitions
from tests.support.pipeline import delete_bus, unique_prefix
from tests.support.processes import SettleProcesses
from tests.support.services import AMQP_URL

SECRET_KEY = "bench-webhooks-secret-key"
#: Deliveries/s as a share of the bare POST loop's requests/s (issues 9, 11 and 22).
RATIO_GOAL = 0.8
BODY_TEMPLATE = {"deposit": {"id": "dep_bench", "amount": "125.50", "asset": "USDC"}}


class ReceiverProcess:
    """bench/webhook_receiver.py in its own process (so it does not share our GIL)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "webhook_receiver.py")],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.base = f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, Any]:
        response = requests.get(f"{self.base}/_stats", timeout=10)
        stats: dict[str, Any] = response.json()
        return stats

    def count(self) -> int:
        """Distinct event ids received since the last reset."""
        events_seen: int = requests.get(f"{self.base}/_count", timeout=10).json()["events"]
        return events_seen

    def reset(self) -> None:
        requests.get(f"{self.base}/_reset", timeout=10)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def wait_received(rx: ReceiverProcess, ids: set[str], timeout: float) -> dict[str, list[float]]:
    """Until every id has arrived (polling a cheap count, then fetching the hits once)."""
    deadline = time.monotonic() + timeout
    while True:
        if rx.count() >= len(ids):
            hits: dict[str, list[float]] = rx.stats()["hits"]
            if ids <= hits.keys():
                return hits
        if time.monotonic() > deadline:
            missing = len(ids - rx.stats()["hits"].keys())
            raise SystemExit(f"LOST? {missing} of {len(ids)} events not received in {timeout}s")
        time.sleep(0.2)


def emit_batch(db: Database, tenant_id: str, n: int) -> list[str]:
    """n events in one transaction: what a busy core leaves in the outbox."""
    with db.transaction() as session:
        return [
            outbox.emit(session, events.DEPOSIT_CREDITED, tenant_id, BODY_TEMPLATE)["id"]
            for _ in range(n)
        ]


def throughput(
    db: Database, rx: ReceiverProcess, tenant_id: str, n: int
) -> tuple[float, list[str]]:
    rx.reset()
    ids = emit_batch(db, tenant_id, n)
    hits = wait_received(rx, set(ids), timeout=max(60.0, n / 20))
    times = sorted(min(hits[i]) for i in ids)
    lo, hi = times[int(n * 0.1)], times[int(n * 0.9)]
    return (int(n * 0.9) - int(n * 0.1)) / max(hi - lo, 1e-6), ids


def bare_loop(rx: ReceiverProcess, threads: int, duration_s: float) -> tuple[float, float]:
    """The same receiver, the same body size, `threads` sessions POSTing flat out:
    (requests/s, CPU ms per request of this process's POSTing threads and the receiver).
    """
    body = json.dumps(
        events.envelope(events.DEPOSIT_CREDITED, "t" * 36, BODY_TEMPLATE), separators=(",", ":")
    ).encode()
    stop = time.monotonic() + duration_s
    counts = [0] * threads

    def loop(index: int) -> None:
        session = requests.Session()
        headers = {"Content-Type": "application/json"}
        while time.monotonic() < stop:
            session.post(f"{rx.base}/bare", data=body, headers=headers, timeout=10)
            counts[index] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    receiver_before = process_cpu_seconds([rx.proc.pid])
    cpu_before = time.process_time()
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(duration_s + 30)
    elapsed = time.monotonic() - started
    cpu_s = time.process_time() - cpu_before
    cpu_s += process_cpu_seconds([rx.proc.pid]) - receiver_before
    done = max(sum(counts), 1)
    return done / elapsed, cpu_s * 1000 / done


def legs(
    db: Database, committed: dict[str, float], received: dict[str, float]
) -> dict[str, list[float]]:
    """Where each event's commit-to-receipt time went, in ms (sorted per leg): the relay
    (commit -> published, core's `outbox.published_at`), the bus and the consumer
    (published -> stored, `notifier_events.received_at`), the job queue and the claim
    (stored -> first attempt), the POST (attempt -> receipt at the receiver)."""
    ids = list(committed)
    with db.reader() as session:
        published = dict(
            session.execute(
                sa.select(OutboxEvent.event_id, OutboxEvent.published_at).where(
                    OutboxEvent.event_id.in_(ids)
                )
            ).all()
        )
        rows = session.execute(
            sa.select(StoredEvent.id, StoredEvent.received_at, Attempt.attempted_at)
            .join(Delivery, Delivery.event_id == StoredEvent.id)
            .join(Attempt, (Attempt.delivery_id == Delivery.id) & (Attempt.number == 1))
            .where(StoredEvent.id.in_(ids))
        ).all()
    out: dict[str, list[float]] = {"relay": [], "bus+consume": [], "queue+claim": [], "post": []}
    for event_id, stored, attempted in rows:
        sent = published.get(event_id)
        if sent is None:
            continue
        marks = [committed[event_id], sent.timestamp(), stored.timestamp()]
        marks += [attempted.timestamp(), received[event_id]]
        for name, (a, b) in zip(out, pairwise(marks), strict=True):
            out[name].append((b - a) * 1000)
    return {name: sorted(values) for name, values in out.items()}


def latency(
    db: Database, rx: ReceiverProcess, tenant_id: str, rate: float, duration_s: float
) -> tuple[list[float], list[str], float, dict[str, list[float]]]:
    """Events committed one per transaction at a steady `rate`/s; ms from commit to receipt.

    Writers share one schedule (event i at start + i/rate), so a slow commit delays
    only its own event, as with core's many request threads.
    """
    rx.reset()
    committed: dict[str, float] = {}
    lock = threading.Lock()
    n = int(rate * duration_s)
    writers = 4
    started = time.monotonic() + 0.1

    def writer(offset: int) -> None:
        for i in range(offset, n, writers):
            pause = started + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            with db.transaction() as session:
                event = outbox.emit(session, events.DEPOSIT_CREDITED, tenant_id, BODY_TEMPLATE)
            done = time.time()
            with lock:
                committed[event["id"]] = done

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration_s + 60)
    achieved = n / (time.monotonic() - started)
    hits = wait_received(rx, set(committed), timeout=60)
    ms = sorted((min(hits[i]) - t) * 1000 for i, t in committed.items())
    time.sleep(1.0)  # the last attempts recorded
    parts = legs(db, committed, {i: min(hits[i]) for i in committed})
    return ms, list(committed), achieved, parts


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(database: str, pids: dict[str, int]) -> dict[str, float]:
    """CPU time used so far: our processes (and their children), PostgreSQL's backends of
    our database, RabbitMQ. Other work on the machine does not count, except in
    RabbitMQ, which is shared."""
    usage: dict[str, float] = {}
    parents: dict[int, int] = {}
    stats: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmd = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        stats[int(entry)] = (cmd, sum(int(f) for f in fields[11:15]) / _TICK)
    owner = {pid: name for name, pid in pids.items()}
    for pid, (cmd, seconds) in stats.items():
        name = owner.get(pid) or owner.get(parents.get(pid, 0))
        if name is None and f" {database} " in cmd and cmd.startswith("postgres:"):
            name = "postgres"
        elif name is None and "beam.smp" in cmd and "rabbit" in cmd:
            name = "rabbitmq"
        if name is not None:
            usage[name] = usage.get(name, 0.0) + seconds
    return usage


#: The worker's counters the throughput run reports per delivery (not attempts: how often
#: a delivery was put back, held or paced, which costs a claim and a message each).
WORKER_COUNTERS = {
    "settle_webhook_attempts_total": "attempts",
    "settle_webhook_endpoint_saturated_total": "put back",
    "settle_webhook_breaker_held_total": "held",
    "settle_webhook_rate_limited_total": "paced",
}


def worker_counters(port: int) -> dict[str, float]:
    """The worker's WORKER_COUNTERS, summed over their labels, from its /metrics."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    totals = dict.fromkeys(WORKER_COUNTERS.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in WORKER_COUNTERS:
            totals[WORKER_COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
    return totals


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def check_deliveries(db: Database, event_ids: list[str]) -> tuple[int, int]:
    """(deliveries, succeeded) for these events."""
    with db.reader() as session:
        rows = session.execute(
            sa.select(Delivery.status, sa.func.count())
            .where(Delivery.event_id.in_(event_ids))
            .group_by(Delivery.status)
        ).all()
    total = sum(count for _, count in rows)
    return total, sum(count for status, count in rows if status == "succeeded")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a CI-sized run")
    parser.add_argument(
        "--threads", type=int, default=16, help="threads per worker process (bare: all of them)"
    )
    parser.add_argument("--worker-processes", type=int, default=1)
    parser.add_argument("--events", type=int, default=None, help="events in the throughput run")
    parser.add_argument("--rate", type=float, default=200.0, help="events/s in the latency run")
    parser.add_argument("--duration", type=float, default=None, help="seconds of the latency run")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="only a fresh database's partitions (default: a year-old database's, see "
        "bench.harness.steady_state_partitions)",
    )
    args = parser.parse_args()
    n_events = args.events or (600 if args.quick else 5000)
    duration = args.duration or (5.0 if args.quick else 20.0)

    # A name of this run's own: two engineers' runs on one server must not drop each
    # other's database mid-run.
    database = f"settle_bench_webhooks_{os.getpid()}"
    url = fresh_database(database)
    partition_count = None if args.fresh else steady_state_partitions(url)
    db = Database(url, pool_size=6)
    names = BusNames(unique_prefix().replace("test-", "bench-"))
    rx = ReceiverProcess()
    box = SecretBox(SECRET_KEY)
    with db.transaction() as session:
        tenant, _ = identity.create_tenant(session, "bench")
        tenant_id = tenant.id
        endpoint_domain.create_endpoint(
            session,
            box,
            tenant_id,
            name="bench",
            url=f"{rx.base}/hook",
            event_types=[events.DEPOSIT_CREDITED],
            allow_private=True,
            max_endpoints=10,
        )
    data_dir = Path(tempfile.mkdtemp(prefix="settle-bench-data-"))
    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": str(data_dir),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
        "SETTLE_AMQP_URL": AMQP_URL,
        "SETTLE_AMQP_PREFIX": names.prefix,
        "SETTLE_SECRET_KEY": SECRET_KEY,
        "SETTLE_WEBHOOK_ALLOW_PRIVATE": "true",
        "SETTLE_WEBHOOK_ENDPOINT_CONCURRENCY": str(args.threads * args.worker_processes),
        "SETTLE_NOTIFIER_WORKER_THREADS": str(args.threads),
    }
    figures: dict[str, Any] = {
        "machine": machine(),
        "threads": args.threads,
        "worker_processes": args.worker_processes,
        "partitions": partition_count,
    }
    procs = SettleProcesses(env, data_dir)
    worker_metrics_port = free_port()
    try:
        with procs:
            started = [
                procs.start(
                    "core-worker", "core", "worker", ready="outbox relay started", wait=False
                ),
                procs.start("consume", "notifier", "consume", ready="consumer ready", wait=False),
                procs.start(
                    "worker",
                    "notifier",
                    "worker",
                    "--processes",
                    str(args.worker_processes),
                    "--threads",
                    str(args.threads),
                    ready="worker ready",
                    wait=False,
                    env={"SETTLE_METRICS_PORT": str(worker_metrics_port)},
                ),
            ]
            for process in started:
                process.wait_ready()
            # Warm up: connections, pools, queues declared.
            warm = emit_batch(db, tenant_id, 50)
            wait_received(rx, set(warm), 60)

            print(f"Webhook delivery on {machine()}")
            print(
                "  database:       "
                + (
                    "fresh (5 partitions a table)"
                    if partition_count is None
                    else f"{partition_count} partitions (a year-old database's: --fresh for none)"
                )
            )
            pids = {p.name: p.proc.pid for p in started if p.proc is not None}
            pids["receiver"] = rx.proc.pid
            cpu_before = cpu_seconds(database, pids)
            counted_before = worker_counters(worker_metrics_port)
            rate, batch_ids = throughput(db, rx, tenant_id, n_events)
            cpu_after = cpu_seconds(database, pids)
            counted = {
                name: round((value - counted_before.get(name, 0.0)) / n_events, 3)
                for name, value in worker_counters(worker_metrics_port).items()
            }
            per_delivery = {
                name: round((cpu_after[name] - cpu_before.get(name, 0.0)) * 1000 / n_events, 2)
                for name in sorted(cpu_after)
            }
            total_threads = args.threads * args.worker_processes
            bare, bare_cpu_ms = bare_loop(rx, total_threads, duration_s=5.0 if args.quick else 10.0)
            ratio = rate / bare
            # Host CPU per request against per delivery: what the machine's other work
            # moves far less than requests/s (both sides pay the same receiver).
            cpu_ratio = bare_cpu_ms / sum(per_delivery.values())
            print(f"  throughput: {rate:8.0f} deliveries/s   ({n_events} events at once)")
            print(f"  bare POSTs: {bare:8.0f} requests/s     ({total_threads} threads)")
            print(f"  ratio:      {ratio:8.2f}                (goal >= {RATIO_GOAL})")
            print(
                f"  by CPU:     {cpu_ratio:8.2f}                (bare: {bare_cpu_ms:.2f} ms "
                "per request, POSTing threads and receiver)"
            )
            print(
                "  CPU ms per delivery: "
                + ", ".join(f"{name} {ms}" for name, ms in per_delivery.items())
                + f" (total {sum(per_delivery.values()):.2f})"
            )
            print(
                "  worker, per delivery: "
                + ", ".join(f"{name} {value}" for name, value in counted.items())
            )

            lat, steady_ids, achieved, parts = latency(db, rx, tenant_id, args.rate, duration)
            p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
            print(
                f"  latency at {achieved:.0f} events/s for {duration:.0f}s: "
                f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {lat[-1]:.1f} ms  (goal p99 < 50 ms)"
                f"  load {os.getloadavg()[0]:.1f}"
            )
            print(
                "  where it went, p50 / p99 / max ms: "
                + ", ".join(
                    f"{name} {percentile(v, 0.5):.1f} / {percentile(v, 0.99):.1f} / {v[-1]:.1f}"
                    for name, v in parts.items()
                    if v
                )
            )
            all_ids = warm + batch_ids + steady_ids
            total, succeeded = 0, 0
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                total, succeeded = check_deliveries(db, all_ids)
                if succeeded == len(all_ids):
                    break
                time.sleep(0.5)
            lost = len(all_ids) - succeeded
            print(
                f"  events: {len(all_ids)}, deliveries: {total}, succeeded: {succeeded}, "
                f"lost: {lost}"
            )
            figures.update(
                deliveries_per_s=round(rate, 1),
                bare_requests_per_s=round(bare, 1),
                ratio=round(ratio, 3),
                ratio_by_cpu=round(cpu_ratio, 3),
                bare_cpu_ms_per_request=round(bare_cpu_ms, 3),
                cpu_ms_per_delivery=per_delivery,
                worker_per_delivery=counted,
                latency_rate=round(achieved, 1),
                latency_p50_ms=round(p50, 2),
                latency_p99_ms=round(p99, 2),
                latency_mean_ms=round(statistics.fmean(lat), 2),
                latency_legs_p99_ms={
                    name: round(percentile(v, 0.99), 2) for name, v in parts.items() if v
                },
                events=len(all_ids),
                deliveries=total,
                lost=lost,
            )
    finally:
        rx.stop()
        delete_bus(names)
        db.dispose()
        drop_database(database)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures.get("lost") == 0 else 1


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
