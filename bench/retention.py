"""The database's size under a steady load with a short retention.

    .venv/bin/python bench/retention.py [--days 10] [--per-day 20000] [--retention 3]

A scratch database (created and dropped here) at the notifier's head: each simulated
day writes `--per-day` events, one delivery each and one attempt each (bodies of
~600 bytes, as a deposit event's), stamped with that day (ids and times), then runs
the worker's maintenance step with the clock on that day (one-day partitions, every
retention `--retention` days). Prints, per day, the rows and bytes of the three
tables: with partitions dropped whole the size levels off after `--retention` days
instead of growing by a day's worth each day. Core's outbox takes as many events a
day, published (one in twenty a deposit's status event, kept a year: that part grows,
by design); its other events are kept `--retention` days too.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
import sqlalchemy as sa

from bench.harness import machine
from services.core.retention import OutboxRetention
from services.core.retention import partitioned_tables as outbox_tables
from services.notifier.retention import DELIVERY_ID_PREFIX, WebhookRetention, partitioned_tables
from shared import components, migrate, partitions
from shared.ids import ulid_time_prefix

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
TABLES = ("notifier_events", "notifier_event_ids", "webhook_deliveries", "webhook_attempts")
BODY = '{"data": {"deposit": {"id": "dep_x", "amount": "100.000000"}}, "pad": "%s"}' % ("x" * 520)


def write_day(conn: sa.Connection, day: datetime, n: int) -> None:
    """`n` events received on `day`, a delivery and an attempt of each (set-based SQL)."""
    prefix = DELIVERY_ID_PREFIX + ulid_time_prefix(int(day.timestamp() * 1000))
    tag = day.strftime("%Y%m%d")
    params = {"n": n, "at": day, "tag": tag, "prefix": prefix, "body": BODY}
    conn.execute(
        sa.text(
            "INSERT INTO notifier_event_ids (id, received_at) "
            "SELECT 'evt_' || :tag || '_' || g, :at FROM generate_series(1, :n) g"
        ),
        params,
    )
    conn.execute(
        sa.text(
            "INSERT INTO notifier_events (id, tenant_id, event_type, body, created_at, "
            "received_at) SELECT 'evt_' || :tag || '_' || g, 'ten_bench', 'deposit.credited', "
            ":body, :at, :at FROM generate_series(1, :n) g"
        ),
        params,
    )
    conn.execute(
        sa.text(
            "INSERT INTO webhook_deliveries (id, tenant_id, endpoint_id, event_id, event_type, "
            "status, attempt_count, created_at, updated_at, succeeded_at) "
            "SELECT :prefix || lpad(g::text, 16, '0'), 'ten_bench', 'we_bench', "
            "'evt_' || :tag || '_' || g, 'deposit.credited', 'succeeded', 1, :at, :at, :at "
            "FROM generate_series(1, :n) g"
        ),
        params,
    )
    conn.execute(
        sa.text(
            "INSERT INTO webhook_attempts (delivery_id, number, attempted_at, response_status, "
            "latency_ms, response_body, signature_header) "
            "SELECT :prefix || lpad(g::text, 16, '0'), 1, :at, 200, 12.5, 'ok', "
            "'t=1,v1=' || md5(g::text) || md5(g::text) FROM generate_series(1, :n) g"
        ),
        params,
    )


def write_outbox_day(conn: sa.Connection, day: datetime, n: int) -> None:
    """`n` published events created on `day`, one in twenty a deposit's status event."""
    conn.execute(
        sa.text(
            "INSERT INTO outbox (event_id, event_type, tenant_id, body, created_at, "
            "published_at, timeline) SELECT 'evt_o' || :tag || '_' || g, CASE WHEN g % 20 = 0 "
            "THEN 'deposit.credited' ELSE 'tenant.api_key_revoked' END, 'ten_bench', :body, "
            ":at, :at, g % 20 = 0 FROM generate_series(1, :n) g"
        ),
        {"n": n, "at": day, "tag": day.strftime("%Y%m%d"), "body": BODY},
    )


def outbox_size(conn: sa.Connection, timeline: bool) -> int:
    return int(
        conn.execute(
            sa.text(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "WHERE c.relname LIKE :stem"
            ),
            {"stem": "outbox_timeline_%" if timeline else "outbox_events_%"},
        ).scalar_one()
    )


def sizes(conn: sa.Connection) -> tuple[int, int]:
    rows = total = 0
    for table in TABLES:
        rows += conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()  # noqa: S608
        total += int(
            conn.execute(
                sa.text(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "WHERE c.relname = :t OR c.oid IN (SELECT inhrelid FROM pg_inherits "
                    "WHERE inhparent = to_regclass(:t))"
                ),
                {"t": table},
            ).scalar_one()
        )
    return rows, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--per-day", type=int, default=20000)
    parser.add_argument("--retention", type=int, default=3)
    args = parser.parse_args()

    name = f"settle_bench_retention_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    engine = sa.create_engine(url)
    try:
        migrate.upgrade(components.IDENTITY, url)
        migrate.upgrade(components.NOTIFIER, url)
        migrate.upgrade(components.CORE, url)
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO webhook_endpoints (id, tenant_id, name, url, event_types, "
                    "status, secret_encrypted, created_at, updated_at) VALUES ('we_bench', "
                    "'ten_bench', 'b', 'https://example.com/h', '[]', 'enabled', 'x', now(), "
                    "now())"
                )
            )
        keep = timedelta(days=args.retention)
        specs = [
            *partitioned_tables(WebhookRetention(attempts=keep, deliveries=keep, events=keep)),
            *outbox_tables(OutboxRetention(events=keep)),
        ]
        settings = partitions.PartitionSettings(days=1, ahead=2)
        start = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
        print(machine())
        print(
            f"{args.per_day} events/day, a delivery and an attempt each; one-day partitions, "
            f"retention {args.retention} days"
        )
        print(
            f"{'day':>4} {'rows':>10} {'MB':>8} {'dropped':>8} {'write s':>8} {'prune ms':>9} "
            f"{'outbox MB':>10} {'timeline MB':>12}"
        )
        for d in range(args.days):
            day = start + timedelta(days=d)
            maintainer = partitions.Maintainer(engine, specs, settings, clock=lambda day=day: day)
            # The day's partitions exist before it writes (the worker makes them ahead).
            dropped = len(maintainer.run_once().partitions)
            began = time.perf_counter()
            with engine.begin() as conn:
                write_day(conn, day, args.per_day)
                write_outbox_day(conn, day, args.per_day)
            wrote = time.perf_counter() - began
            began = time.perf_counter()
            dropped += len(maintainer.run_once().partitions)
            pruned = (time.perf_counter() - began) * 1000
            with engine.begin() as conn:
                conn.execute(sa.text("ANALYZE"))
                rows, total = sizes(conn)
                events, timeline = outbox_size(conn, False), outbox_size(conn, True)
            print(
                f"{d:>4} {rows:>10} {total / 1e6:>8.1f} {dropped:>8} {wrote:>8.2f} {pruned:>9.1f} "
                f"{events / 1e6:>10.1f} {timeline / 1e6:>12.1f}"
            )
    finally:
        engine.dispose()
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
