"""Client CPU of one PostgreSQL round trip through each layer we use.

    .venv/bin/python bench/db_costs.py [--n 5000]

Runs `SELECT 1` on 127.0.0.1 (database `postgres`, nothing written) through psycopg
directly, in and out of a transaction, and through SQLAlchemy (a Core connection in
autocommit, an ORM session), and prints the CPU this process spent per call. These
figures are why account creation, the API-key lookup and the webhook worker's claim
and record run on the driver's connection (docs/DECISIONS.md, "Persistence on hot
paths"): on this machine a SQLAlchemy session costs several round trips' worth of
CPU before its first statement.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
import sqlalchemy as sa

from bench.harness import machine
from shared.db import Database

URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def per_call(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """(CPU us, wall us) per call, after a warm-up."""
    for _ in range(min(200, n)):
        fn()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5000, help="calls per measurement")
    args = parser.parse_args()

    autocommit = psycopg.connect(URL, autocommit=True)
    in_tx = psycopg.connect(URL)
    db = Database(URL, pool_size=2)
    select_one = sa.select(sa.literal(1))

    def driver_tx() -> None:
        in_tx.execute("SELECT 1").fetchone()
        in_tx.commit()

    def driver_tx_two() -> None:
        in_tx.execute("SELECT 1").fetchone()
        in_tx.execute("SELECT 2").fetchone()
        in_tx.commit()

    def sa_autocommit() -> None:
        with db.autocommit() as conn:
            conn.execute(select_one).first()

    def sa_session() -> None:
        with db.transaction() as session:
            session.execute(select_one).first()

    def pooled_driver_autocommit() -> None:
        with db.driver_autocommit() as conn:
            conn.execute("SELECT 1").fetchone()

    runs = [
        ("psycopg, autocommit: SELECT", lambda: autocommit.execute("SELECT 1").fetchone()),
        ("psycopg, transaction: BEGIN, SELECT, COMMIT", driver_tx),
        ("psycopg, transaction: BEGIN, 2 x SELECT, COMMIT", driver_tx_two),
        ("pooled driver connection (shared.db), autocommit", pooled_driver_autocommit),
        ("SQLAlchemy Core connection, autocommit", sa_autocommit),
        ("SQLAlchemy ORM session: BEGIN, SELECT, COMMIT", sa_session),
    ]
    print(f"machine: {machine()}; PostgreSQL 127.0.0.1; {args.n} calls each")
    print(f"{'':52} {'CPU us':>8} {'wall us':>8}")
    for name, fn in runs:
        cpu, wall = per_call(fn, args.n)
        print(f"{name:52} {cpu:8.1f} {wall:8.1f}")
    autocommit.close()
    in_tx.close()
    db.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
