"""What the delivery SLA query costs: the stats API, `settle sla --tenant` and `settle sla`.

    .venv/bin/python bench/sla.py [--deliveries 1000000] [--tenants 50] [--quick]

Makes the partitions for the window, inserts `--deliveries` deliveries (one event each;
one first attempt, a second for one
in ten; 90% succeeded, some failed, pending, retrying, skipped) spread evenly over 30
days, for `--tenants` tenants of two endpoints each, straight into a fresh database
(`settle_bench_sla`), vacuumed as a table long in service would be. Then it runs
`services.notifier.sla.endpoint_stats` (the one query behind all three readers) for
one endpoint over 7 days (the API, the portal), one tenant over 7 days (`settle sla
--tenant`), every tenant over 1 day and over 7 days (`settle sla`), and prints each
one's wall time (best of three), the deliveries it covered and the plan's node types.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from bench.harness import fresh_database, machine
from services.notifier import sla
from services.notifier.retention import WebhookRetention, partitioned_tables
from shared import partitions
from shared.db import Database

ENDPOINTS = """
INSERT INTO webhook_endpoints (id, tenant_id, name, url, event_types, status,
  secret_encrypted, failed_attempts, created_at, updated_at)
SELECT 'we_bench_' || t || '_' || e,
  '00000000-0000-4000-8000-' || lpad(t::text, 12, '0'),
  'bench ' || e, 'https://hooks.example.com/' || e, '["deposit.credited"]'::jsonb,
  'enabled', 'x', 0, :start, :start
FROM generate_series(0, :tenants - 1) AS t, generate_series(0, 1) AS e
"""

EVENTS = """
INSERT INTO notifier_events (id, tenant_id, event_type, body, created_at, received_at)
SELECT 'evt_bench_' || n, '00000000-0000-4000-8000-' || lpad((n % :tenants)::text, 12, '0'),
  'deposit.credited', '{}', :start + n * :step, :start + n * :step
FROM generate_series(0, :count - 1) AS n
"""

#: SQL: `whd_` + the ULID time prefix of the row's creation time + its number (ids are
#: what the delivery and attempt partitions are ranged by, see shared/partitions.py).
DELIVERY_ID = (
    "'whd_' || (SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', "
    "((floor(extract(epoch FROM :start + n * :step) * 1000)::bigint >> (5 * (9 - i))) & 31)"
    "::int + 1, 1), '' ORDER BY i) FROM generate_series(0, 9) AS i) || lpad(n::text, 16, '0')"
)

# Status by n: 90% succeeded, 4% failed (one in four of them: endpoint deleted), 3%
# retrying, 2% pending, 1% skipped.
DELIVERIES = """
INSERT INTO webhook_deliveries (id, tenant_id, endpoint_id, event_id, event_type, status,
  attempt_count, next_attempt_at, last_error, succeeded_at, created_at, updated_at)
SELECT {delivery_id}, '00000000-0000-4000-8000-' || lpad((n % :tenants)::text, 12, '0'),
  'we_bench_' || (n % :tenants) || '_' || (n / :tenants % 2), 'evt_bench_' || n,
  'deposit.credited', s.status,
  CASE WHEN s.status IN ('pending', 'skipped') THEN 0 ELSE 1 + (n % 10 = 0)::int END,
  CASE WHEN s.status IN ('pending', 'retrying') THEN :start + n * :step END,
  CASE WHEN s.status = 'failed' AND n % 400 < 10 THEN 'endpoint_deleted'
       WHEN s.status IN ('failed', 'retrying') THEN 'http_500' END,
  CASE WHEN s.status = 'succeeded'
       THEN :start + n * :step + make_interval(secs => 0.05 + (n % 97) / 100.0) END,
  :start + n * :step, :start + n * :step
FROM generate_series(0, :count - 1) AS n,
LATERAL (SELECT CASE WHEN n % 100 < 90 THEN 'succeeded' WHEN n % 100 < 94 THEN 'failed'
  WHEN n % 100 < 97 THEN 'retrying' WHEN n % 100 < 99 THEN 'pending'
  ELSE 'skipped' END AS status) AS s
"""

ATTEMPTS = """
INSERT INTO webhook_attempts (delivery_id, number, attempted_at, response_status,
  latency_ms, error)
SELECT d.id, k, d.created_at, CASE WHEN d.status = 'succeeded' THEN 200 ELSE 500 END,
  20 + (hashtext(d.id) & 1023) / 4.0, CASE WHEN d.status = 'succeeded' THEN NULL
  ELSE 'http_500' END
FROM webhook_deliveries d, generate_series(1, d.attempt_count) AS k
"""


def make_partitions(db: Database, start: datetime, now: datetime) -> None:
    """Partitions for the whole window, as a worker in service would have made them."""
    settings = partitions.PartitionSettings.from_env({})
    with db.engine.begin() as conn:
        for spec in partitioned_tables(WebhookRetention()):
            have = list(partitions.existing(conn, spec))
            for part in partitions.span(spec, start, now, settings):
                if not any(part.start < e.end and e.start < part.end for e in have):
                    partitions.create(conn, spec, part)


def seed(db: Database, count: int, tenants: int, start: datetime, span: timedelta) -> None:
    make_partitions(db, start, start + span)
    binds = {"count": count, "tenants": tenants, "start": start, "step": span / count}
    deliveries = DELIVERIES.replace("{delivery_id}", DELIVERY_ID)
    with db.transaction() as session:
        for statement in (ENDPOINTS, EVENTS, deliveries, ATTEMPTS):
            session.execute(sa.text(statement), binds)
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("VACUUM ANALYZE"))


def timed(db: Database, **query: Any) -> tuple[float, int, int]:
    """(best wall seconds of three, endpoints, deliveries covered)."""
    best = float("inf")
    found: list[sla.EndpointStats] = []
    for _ in range(3):
        with db.reader() as session:
            began = time.perf_counter()
            found = sla.endpoint_stats(session, **query)
            best = min(best, time.perf_counter() - began)
    return best, len(found), sum(s.deliveries for s in found)


def plan_nodes(db: Database, **query: Any) -> list[str]:
    compiled = sla._query(
        query["since"], query["until"], query.get("tenant_id"), query.get("endpoint_id")
    ).compile(db.engine, compile_kwargs={"literal_binds": True})
    with db.engine.connect() as conn:
        plan = conn.execute(sa.text(f"EXPLAIN (FORMAT JSON) {compiled}")).scalar_one()[0]
    nodes: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        nodes.add(node["Node Type"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return sorted(nodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deliveries", type=int, default=1_000_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="100,000 deliveries")
    args = parser.parse_args()
    if args.quick:
        args.deliveries = 100_000

    db = Database(fresh_database("settle_bench_sla"), pool_size=2)
    now = datetime.now(UTC)
    began = time.perf_counter()
    seed(db, args.deliveries, args.tenants, now - timedelta(days=30), timedelta(days=30))
    print(f"# {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(
        f"inserted {args.deliveries:,} deliveries over 30 days ({args.tenants} tenants, "
        f"{2 * args.tenants} endpoints) in {time.perf_counter() - began:.1f} s"
    )
    tenant = "00000000-0000-4000-8000-000000000000"
    cases: list[tuple[str, dict[str, Any]]] = [
        (
            "one endpoint, 7 days (the API, the portal)",
            {"since": now - timedelta(days=7), "tenant_id": tenant, "endpoint_id": "we_bench_0_0"},
        ),
        (
            "one tenant, 7 days (settle sla --tenant)",
            {"since": now - timedelta(days=7), "tenant_id": tenant},
        ),
        ("every tenant, 1 day (settle sla --since 1d)", {"since": now - timedelta(days=1)}),
        ("every tenant, 7 days (settle sla)", {"since": now - timedelta(days=7)}),
    ]
    for label, query in cases:
        query["until"] = now
        wall, endpoints, covered = timed(db, **query)
        print(
            f"{label}: {wall * 1000:,.0f} ms for {covered:,} deliveries of {endpoints} "
            f"endpoint(s) ({', '.join(plan_nodes(db, **query))})"
        )
    db.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
