"""Webhook fairness: a healthy tenant's commit-to-receipt latency beside a hostile tenant.

    .venv/bin/python bench/webhook_fairness.py [--quick] [--rate 50] [--duration 60]

Starts, as in production, on a fresh PostgreSQL database and RabbitMQ (names under a
unique SETTLE_AMQP_PREFIX): `settle core worker`, `settle notifier consume` and one
`settle notifier worker` of 16 threads, with the default fairness settings (a tenant
may hold half the threads, an endpoint 4; breaker after 5 failures) and the default
10 s attempt deadline. Two tenants:

- healthy: one endpoint on a lean receiver in its own process (bench/webhook_receiver.py);
- hostile: 50 endpoints, each subscribed to every event it sends, on receivers in this
  process: a third hang (never answer), a third trickle their answer one byte every
  0.5 s, a third answer 500 at once.

Two phases of `--duration` seconds each (60: the hostile load then lasts 70 s, past the
sweeper's 30 s grace; 20 s phases hid what the sweeper does to a long backlog, see
docs/RELIABILITY.md), the healthy tenant committing events one by
one at `--rate`/s: quiet (the hostile tenant silent), then hostile (it commits 2
events/s, 100 deliveries/s to its bad endpoints, from before the phase until its end).
Prints the healthy tenant's p50/p99 in each phase and their ratio (goal: hostile p99
within 2x the quiet p99), and what the hostile endpoints received.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, free_port, fresh_database, machine
from bench.webhooks import ReceiverProcess, latency, percentile, wait_received, worker_counters
from services.core import outbox
from services.notifier import webhook_endpoints
from services.notifier.secrets import SecretBox
from shared import events
from shared.bus import BusNames
from shared.db import Database
from shared.identity import service as identity
from tests.support import keys
from tests.support.pipeline import delete_bus, unique_prefix
from tests.support.processes import SettleProcesses
from tests.support.receiver import Answer, Receiver
from tests.support.services import AMQP_URL

SECRET_KEY = "bench-fairness-secret-key"
DATABASE = "settle_bench_fairness"
HOSTILE_ENDPOINTS = 50
HOSTILE_EVENTS_PER_S = 2.0
BODY = {"deposit": {"id": "dep_bench", "amount": "125.50", "asset": "USDC"}}


def _tenant(db: Database, box: SecretBox, name: str, urls: list[str], types: list[str]) -> str:
    with db.transaction() as session:
        tenant, _ = identity.create_tenant(session, name)
        for n, url in enumerate(urls):
            webhook_endpoints.create_endpoint(
                session,
                box,
                tenant.id,
                name=f"{name}-{n}",
                url=url,
                event_types=types,
                allow_private=True,
                max_endpoints=len(urls),
            )
        return tenant.id


def _hostile_answers(rx: Receiver) -> list[str]:
    """50 paths: hang, trickle, fail, in turn."""
    paths = []
    for n in range(HOSTILE_ENDPOINTS):
        path = f"/bad{n}"
        kind = n % 3
        if kind == 0:
            rx.script(path, Answer.hang(3600))
        elif kind == 1:
            rx.script(path, Answer.trickle(0.5, body=b"x" * 4096))
        else:
            rx.script(path, Answer.fail(500))
        paths.append(path)
    return paths


def _hostile_load(db: Database, tenant_id: str, stop: threading.Event) -> int:
    """The hostile tenant's events at HOSTILE_EVENTS_PER_S until `stop`; how many."""
    sent = 0
    started = time.monotonic()
    while not stop.is_set():
        pause = started + sent / HOSTILE_EVENTS_PER_S - time.monotonic()
        if pause > 0 and stop.wait(pause):
            break
        with db.transaction() as session:
            outbox.emit(session, events.DEPOSIT_SOURCE_SEEN, tenant_id, BODY)
        sent += 1
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--rate", type=float, default=50.0, help="healthy events/s")
    parser.add_argument("--duration", type=float, default=None, help="seconds per phase")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()
    duration = args.duration or (5.0 if args.quick else 60.0)

    url = fresh_database(DATABASE)
    db = Database(url, pool_size=6)
    names = BusNames(unique_prefix().replace("test-", "bench-"))
    box = SecretBox(SECRET_KEY)
    fine = ReceiverProcess()
    bad = Receiver().start()
    paths = _hostile_answers(bad)
    healthy = _tenant(db, box, "healthy", [f"{fine.base}/hook"], [events.DEPOSIT_CREDITED])
    hostile = _tenant(db, box, "hostile", [bad.url(p) for p in paths], [events.DEPOSIT_SOURCE_SEEN])
    data_dir = Path(tempfile.mkdtemp(prefix="settle-bench-fairness-"))
    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": str(data_dir),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
        "SETTLE_AMQP_URL": AMQP_URL,
        "SETTLE_AMQP_PREFIX": names.prefix,
        "SETTLE_SECRET_KEY": SECRET_KEY,
        "SETTLE_WEBHOOK_ALLOW_PRIVATE": "true",
        "SETTLE_WEBHOOK_MAX_ENDPOINTS": str(HOSTILE_ENDPOINTS),
        "SETTLE_NOTIFIER_WORKER_THREADS": "16",
    }
    figures: dict[str, Any] = {"machine": machine(), "rate": args.rate, "duration_s": duration}
    stop = threading.Event()
    procs = SettleProcesses(env, data_dir)
    metrics_port = free_port()
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
                    "--threads",
                    "16",
                    ready="worker ready",
                    wait=False,
                    env={"SETTLE_METRICS_PORT": str(metrics_port)},
                ),
            ]
            for process in started:
                process.wait_ready()
            warm = _warm(db, healthy)
            wait_received(fine, set(warm), 60)
            print(f"Webhook fairness on {machine()}")

            counted = worker_counters(metrics_port)
            quiet, quiet_ids, quiet_rate, _ = latency(db, fine, healthy, args.rate, duration)
            figures["quiet_worker"] = _since(counted, counted := worker_counters(metrics_port))
            q50, q99 = percentile(quiet, 0.5), percentile(quiet, 0.99)
            print(
                f"  quiet:   {quiet_rate:5.0f} events/s  p50 {q50:7.1f} ms  p99 {q99:7.1f} ms"
                f"  max {quiet[-1]:7.1f} ms"
            )
            figures["quiet_stages"] = stages(db, quiet_ids, fine.stats()["hits"])

            sent: list[int] = []
            load = threading.Thread(
                target=lambda: sent.append(_hostile_load(db, hostile, stop)), daemon=True
            )
            load.start()
            time.sleep(min(10.0, duration / 2))  # the hostile endpoints fill their slots first
            counted = worker_counters(metrics_port)
            loud, loud_ids, loud_rate, _ = latency(db, fine, healthy, args.rate, duration)
            figures["hostile_worker"] = _since(counted, worker_counters(metrics_port))
            figures["hostile_stages"] = stages(db, loud_ids, fine.stats()["hits"])
            stop.set()
            load.join(30)
            h50, h99 = percentile(loud, 0.5), percentile(loud, 0.99)
            ratio = h99 / q99 if q99 else float("inf")
            hits = {p: len(bad.hits(p)) for p in paths}
            kinds = {
                "hang": sum(v for i, v in enumerate(hits.values()) if i % 3 == 0),
                "trickle": sum(v for i, v in enumerate(hits.values()) if i % 3 == 1),
                "fail": sum(v for i, v in enumerate(hits.values()) if i % 3 == 2),
            }
            print(
                f"  hostile: {loud_rate:5.0f} events/s  p50 {h50:7.1f} ms  p99 {h99:7.1f} ms"
                f"  max {loud[-1]:7.1f} ms"
            )
            print(f"  p99 hostile / quiet: {ratio:.2f}  (goal <= 2)")
            for phase in ("quiet", "hostile"):
                print(
                    f"  {phase + ':':8} where the time went, p50 / p99 ms: "
                    + ", ".join(
                        f"{name} {p50:.1f} / {p99:.1f}"
                        for name, (p50, p99) in figures[f"{phase}_stages"].items()
                    )
                )
                print(
                    f"  {phase + ':':8} the worker's counters in the phase: "
                    + ", ".join(f"{k} {v:.0f}" for k, v in figures[f"{phase}_worker"].items())
                )
            print(
                f"  hostile tenant: {sent[0] if sent else 0} events x {HOSTILE_ENDPOINTS}"
                f" endpoints; requests its receivers saw: {kinds}"
            )
            figures.update(
                quiet_p50_ms=round(q50, 2),
                quiet_p99_ms=round(q99, 2),
                hostile_p50_ms=round(h50, 2),
                hostile_p99_ms=round(h99, 2),
                p99_ratio=round(ratio, 2),
                hostile_events=sent[0] if sent else 0,
                hostile_requests=kinds,
            )
    finally:
        stop.set()
        bad.stop()
        fine.stop()
        delete_bus(names)
        db.dispose()
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


#: The healthy events' path, as its rows stamp it: committed (the outbox row's creation,
#: just before the commit), published by core's relay, stored by the notifier's consumer,
#: first attempt started by the worker, received by the receiver.
_STAGES = sa.text(
    """
    SELECT o.event_id, o.created_at, o.published_at, e.received_at, min(a.attempted_at)
    FROM outbox o
    JOIN notifier_events e ON e.id = o.event_id
    JOIN webhook_deliveries d ON d.event_id = e.id
    JOIN webhook_attempts a ON a.delivery_id = d.id
    WHERE o.event_id = ANY(:ids)
    GROUP BY o.event_id, o.created_at, o.published_at, e.received_at
    """
)


def stages(
    db: Database, ids: list[str], hits: dict[str, list[float]]
) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of each leg of the healthy events' way: relay (commit to
    published), consume (published to stored), queue (stored to the attempt's start),
    send (the attempt's start to receipt)."""
    legs: dict[str, list[float]] = {"relay": [], "consume": [], "queue": [], "send": []}
    with db.reader() as session:
        rows = session.execute(_STAGES, {"ids": ids}).all()
    for event_id, created, published, stored, attempted in rows:
        received = min(hits[event_id])
        points = [created.timestamp(), published.timestamp(), stored.timestamp()]
        points += [attempted.timestamp(), received]
        for name, start, end in zip(legs, points, points[1:], strict=False):
            legs[name].append((end - start) * 1000)
    return {
        name: (round(percentile(sorted(v), 0.5), 1), round(percentile(sorted(v), 0.99), 1))
        for name, v in legs.items()
    }


def _since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


def _warm(db: Database, tenant_id: str) -> list[str]:
    with db.transaction() as session:
        return [
            outbox.emit(session, events.DEPOSIT_CREDITED, tenant_id, BODY)["id"] for _ in range(20)
        ]


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
