"""A large tenant's statement: time, memory and size of the biggest statement Settle makes.

    .venv/bin/python bench/statements.py [--history 1000000] [--period 100000] [--quick]

One tenant gets `--history` deposits credited before the period and `--period` in it
(the statements' row limit by default), inserted straight into a fresh database
(`settle_bench_statements`) and vacuumed, as a table long in service would be. Then
the Statements use case makes the period's statement as JSON and as CSV, and the run
prints, for each: wall and CPU seconds, rows a second, the statement's size, Python's
peak heap while making it (tracemalloc) and the process's peak RSS; and the plan and
time of the opening totals (the whole history summed).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from bench.harness import fresh_database, machine
from services.core.statements import queries
from services.core.statements.period import Period
from services.core.statements.service import Statements
from services.core.statements.settings import StatementSettings
from services.core.statements.signing import StatementSigner
from shared.db import Database

TENANT = "00000000-0000-4000-8000-00000000be57"
USDC_ETH = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"
USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
WALLET = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"

#: N credited deposits, `credited_at` spread evenly over [start, start + span), on two
#: chains, with real-looking hashes (md5 twice: 64 hex digits).
INSERT = """
INSERT INTO deposits (
  id, tenant_id, account_pk, account_id, external_user_id, status, chain_id,
  deposit_address, asset, token_address, decimals, amount_raw, amount_usd, fee_usd, net_usd,
  source_tx_hash, log_index, transfer_seq, from_address, block_number, block_hash,
  confirmations, required_confirmations, dest_chain_id, dest_address, dest_token_address,
  route, settle_attempts, failed_providers, credit_amount, credit_tx_hash, sandbox,
  created_at, updated_at, confirmed_at, credited_at)
SELECT
  :prefix || lpad(n::text, 22, '0'), :tenant, :account_pk, 'acc_bench', 'user-' || (n % 5000),
  'credited', CASE WHEN n % 2 = 0 THEN 1 ELSE 8453 END, :wallet, 'USDC',
  CASE WHEN n % 2 = 0 THEN :usdc_eth ELSE :usdc_base END, 6,
  (1000000 + n * 17 % 900000000)::text, (1000000 + n * 17 % 900000000) / 1e6, 0.25,
  (1000000 + n * 17 % 900000000) / 1e6 - 0.25,
  '0x' || md5(:prefix || n) || md5(n || :prefix), 0, 0, :wallet, 1000000 + n,
  '0x' || md5('b' || n) || md5(n || 'b'), 12, 12, 8453, :wallet, :usdc_base, 'direct', 1,
  '[]', ((1000000 + n * 17 % 900000000) / 1e6 - 0.25)::text,
  '0x' || md5('c' || n) || md5(n || 'c'), false,
  :start + (n * :step), :start + (n * :step), :start + (n * :step), :start + (n * :step)
FROM generate_series(0, :count - 1) AS n
"""


def insert(db: Database, prefix: str, count: int, start: datetime, span: timedelta) -> None:
    with db.transaction() as session:
        account_pk = session.execute(
            sa.text(
                "INSERT INTO deposit_accounts (id, tenant_id, external_user_id, status, "
                "dest_chain_id, dest_address, dest_token_address, metadata, created_at, "
                "updated_at) VALUES (:id, :tenant, :user, 'active', 8453, :wallet, :token, "
                "'{}', now(), now()) ON CONFLICT DO NOTHING RETURNING pk"
            ),
            {
                "id": "acc_bench",
                "tenant": TENANT,
                "user": "bench",
                "wallet": WALLET,
                "token": USDC_BASE,
            },
        ).scalar()
        if account_pk is None:
            account_pk = session.execute(
                sa.text("SELECT pk FROM deposit_accounts WHERE id = 'acc_bench'")
            ).scalar_one()
        session.execute(
            sa.text(INSERT),
            {
                "prefix": prefix,
                "tenant": TENANT,
                "account_pk": account_pk,
                "wallet": WALLET,
                "usdc_eth": USDC_ETH,
                "usdc_base": USDC_BASE,
                "start": start,
                "step": span / count,
                "count": count,
            },
        )


def measure(statements: Statements, period: Period, fmt: str) -> dict[str, float]:
    """Time one statement; then make it again under tracemalloc for the heap's peak (a
    second pass: tracing slows Python several times over)."""
    cpu, wall = time.process_time(), time.perf_counter()
    signed = statements.build(TENANT, start=period.start, end=period.end, sandbox=False, fmt=fmt)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    signed.file.close()
    tracemalloc.start()
    statements.build(
        TENANT, start=period.start, end=period.end, sandbox=False, fmt=fmt
    ).file.close()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"wall": wall, "cpu": cpu, "bytes": signed.size, "heap": peak}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--period", type=int, default=StatementSettings.max_deposits)
    parser.add_argument("--quick", action="store_true", help="100,000 history, 10,000 in period")
    args = parser.parse_args()
    if args.quick:
        args.history, args.period = 100_000, 10_000

    db = Database(fresh_database("settle_bench_statements"), pool_size=2)
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
    start = end - timedelta(days=30)
    began = time.perf_counter()
    insert(db, "dep_H", args.history, start - timedelta(days=700), timedelta(days=700))
    insert(db, "dep_P", args.period, start, timedelta(days=30))
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            sa.text("VACUUM ANALYZE deposits")
        )
    print(f"# {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(
        f"inserted {args.history:,} + {args.period:,} credited deposits of one tenant "
        f"in {time.perf_counter() - began:.1f} s"
    )

    period = Period(start, end)
    with queries.snapshot(db) as conn:
        stmt = sa.text("EXPLAIN (ANALYZE, FORMAT JSON) " + _compiled_totals(conn, period))
        plan = conn.execute(stmt).scalar_one()[0]
    scans = sorted(set(_node_types(plan["Plan"])))
    print(
        f"opening + period totals over {args.history + args.period:,} rows: "
        f"{plan['Execution Time']:.0f} ms ({', '.join(scans)})"
    )
    signer = StatementSigner.from_settings(StatementSettings(), "bench-secret-key")
    statements = Statements(db, StatementSettings(max_deposits=args.period), signer)
    for fmt in ("json", "csv"):
        m = measure(statements, period, fmt)
        print(
            f"{fmt:4} statement of {args.period:,} deposits: {m['wall']:.2f} s wall, "
            f"{m['cpu']:.2f} s CPU ({args.period / m['cpu']:,.0f} rows per CPU second), "
            f"{m['bytes'] / 2**20:.1f} MiB, Python heap peak {m['heap'] / 2**20:.1f} MiB"
        )
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process peak RSS over the run: {peak_rss:.0f} MiB")
    db.dispose()
    return 0


def _compiled_totals(conn: sa.Connection, period: Period) -> str:
    """The totals query's SQL with its values inlined (for EXPLAIN)."""
    stmt = queries.totals_statement(TENANT, False, period)
    return str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))


def _node_types(node: dict[str, object]) -> list[str]:
    kinds = [str(node["Node Type"])]
    for child in node.get("Plans", []):  # type: ignore[union-attr]
        kinds.extend(_node_types(child))  # type: ignore[arg-type]
    return kinds


if __name__ == "__main__":
    raise SystemExit(main())
