"""Deposit pipeline throughput: sandbox deposits to credited events.

    .venv/bin/python bench/pipeline.py [--quick] [--deposits N] [--workers W]

1. Sandbox: N deposits submitted through core's API (Flask test client, real
   PostgreSQL) while W pipeline worker processes (the worker's settlement loop)
   confirm and settle them; deposits/s from the first submission
   to the last `deposit.credited` event in the outbox, with per-deposit latency.
   Then the same number as a backlog, drained by the workers alone (their capacity).

The chain watcher has its own benchmark: bench/watcher.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa
from bip_utils import Bip32Secp256k1

from bench.harness import fresh_database, machine, process
from services.core.addresses import AddressDeriver
from services.core.app import create_app
from services.core.chains import ChainRegistry, load_chains
from services.core.config import CoreConfig
from services.core.context import CoreContext
from services.core.deposits.detection import Detection
from services.core.deposits.models import Deposit
from services.core.deposits.pricing import StaticPrices
from services.core.deposits.sandbox import SandboxChain, SandboxConfirmer, SandboxDeposits
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import Settlement
from services.core.deposits.settling import Settling
from services.core.deposits.worker import Pipeline, run
from services.core.fees import refresh_fees
from services.core.models import OutboxEvent
from shared.db import Database
from shared.identity import service as identity
from tests.support.deposits import insert_account

WALLET = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"


def add_accounts(
    db: Database, registry: ChainRegistry, deriver: AddressDeriver, tenant_id: str, count: int
) -> list[dict[int, str]]:
    """Accounts (rows) with one derived address per active chain; their addresses."""
    with db.transaction() as session:
        return [
            insert_account(
                session,
                registry,
                deriver,
                tenant_id,
                external_user_id=f"bench-{uuid.uuid4().hex[:12]}",
                dest_chain_id=8453,
                dest_address=WALLET,
                dest_token_address=USDC_BASE,
            ).addresses
            for _ in range(count)
        ]


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct))]


def bench_sandbox(url: str, deposits: int, workers: int) -> dict[str, float]:
    xpub = Bip32Secp256k1.FromSeed(bytes(range(32))).PublicKey().ToExtended()
    settings = PipelineSettings(sandbox_block_s=0, poll_s=0.01, batch_size=200)
    config = CoreConfig(
        database_url=url,
        identity_database_url=url,
        env="production",
        deposit_xpub=xpub,
        sandbox=True,
        data_dir=Path("/tmp"),
        deposits=settings,
    )
    db = Database(url, pool_size=workers + 4)
    ctx = CoreContext.build(config, db=db, identity_db=db)
    refresh_fees(db, ctx.registry)
    with db.transaction() as session:
        tenant, issued = identity.create_tenant(session, "bench-pipeline", sandbox=True)
        tenant_id, api_key = tenant.id, issued.api_key
    accounts = add_accounts(db, ctx.registry, ctx.deriver, tenant_id, 50)
    app = create_app(context=ctx)
    client = app.test_client()
    headers = {"Authorization": f"Bearer {api_key}"}

    with workers_running(url, workers):
        figures = _submit_and_wait(db, client, headers, accounts, tenant_id, deposits, workers)
    # The pipeline alone: a backlog of deposits, then the workers drain it.
    sandbox = SandboxDeposits(db, ctx.registry, StaticPrices(), SandboxChain(0))
    backlog = [
        sandbox.create(
            tenant_id,
            chain_id=8453,
            deposit_address=accounts[n % len(accounts)][8453],
            asset="USDC",
            amount=Decimal("20.5"),
        ).id
        for n in range(deposits)
    ]
    with workers_running(url, workers):
        started = time.perf_counter()
        wait_credited(db, tenant_id, 2 * deposits)
        figures["drained_per_s"] = len(backlog) / (time.perf_counter() - started)
    db.dispose()
    return figures


@contextlib.contextmanager
def workers_running(url: str, workers: int) -> Iterator[None]:
    """Pipeline worker processes (as in production: threads would share one GIL)."""
    ready_dir = Path(tempfile.mkdtemp(prefix="settle-bench-ready-"))
    with contextlib.ExitStack() as stack:
        for n in range(workers):
            env = {
                "SETTLE_DATABASE_URL": url,
                "SETTLE_ENV": "production",
                "SETTLE_BENCH_READY": str(ready_dir / str(n)),
            }
            stack.enter_context(process([sys.executable, __file__, "--worker"], env))
        deadline = time.monotonic() + 60
        while len(list(ready_dir.iterdir())) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError("pipeline workers did not start")
            time.sleep(0.05)
        yield


def wait_credited(db: Database, tenant_id: str, count: int) -> None:
    """Until the tenant's outbox holds `count` deposit.credited events (bounded)."""
    credited = 0
    deadline = time.monotonic() + 600
    while credited < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {credited} of {count} credited")
        with db.reader() as session:
            credited = int(
                session.scalar(
                    sa.select(sa.func.count()).where(
                        OutboxEvent.tenant_id == tenant_id,
                        OutboxEvent.event_type == "deposit.credited",
                    )
                )
                or 0
            )
        time.sleep(0.02)


def _submit_and_wait(
    db: Database,
    client: Any,
    headers: dict[str, str],
    accounts: list[dict[int, str]],
    tenant_id: str,
    deposits: int,
    workers: int,
) -> dict[str, float]:
    started = time.perf_counter()
    for n in range(deposits):
        response = client.post(
            "/v1/sandbox/deposits",
            json={
                "depositAddress": accounts[n % len(accounts)][8453],
                "chainId": 8453,
                "asset": "USDC",
                "amount": f"{10 + n % 90}.25",
            },
            headers=headers,
        )
        if response.status_code != 200:
            raise RuntimeError(response.get_data(as_text=True))
    submitted = time.perf_counter() - started
    wait_credited(db, tenant_id, deposits)
    elapsed = time.perf_counter() - started
    with db.reader() as session:
        rows = session.execute(
            sa.select(Deposit.created_at, Deposit.credited_at).where(
                Deposit.tenant_id == tenant_id, Deposit.credited_at.is_not(None)
            )
        ).all()
    latencies = [(c - s).total_seconds() * 1000 for s, c in rows]
    return {
        "deposits": deposits,
        "workers": workers,
        "submitted_per_s": deposits / submitted,
        "credited_per_s": deposits / elapsed,
        "latency_p50_ms": statistics.median(latencies),
        "latency_p95_ms": percentile(latencies, 0.95),
    }


def worker_main() -> int:
    """A pipeline worker process: settlement rounds until SIGTERM."""
    url = os.environ["SETTLE_DATABASE_URL"]
    settings = PipelineSettings(sandbox_block_s=0, poll_s=0.01, batch_size=200)
    db = Database(url, pool_size=2)
    registry = load_chains()
    prices = StaticPrices()
    pipeline = Pipeline(
        settling=Settling(db, registry, Settlement(registry), prices, settings),
        sandbox=SandboxConfirmer(
            Detection(db, registry, prices), SandboxChain(0), batch_size=settings.batch_size
        ),
        settings=settings,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    Path(os.environ["SETTLE_BENCH_READY"]).touch()
    run(pipeline, stop)
    db.dispose()
    return 0


def main() -> int:
    if sys.argv[1:] == ["--worker"]:
        return worker_main()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small runs (a smoke test)")
    parser.add_argument("--deposits", type=int, help="sandbox deposits (default 1000, quick 100)")
    parser.add_argument("--workers", type=int, default=2, help="pipeline workers")
    args = parser.parse_args()
    deposits = args.deposits or (100 if args.quick else 1000)

    url = fresh_database("settle_bench_pipeline")
    load_chains()  # fail early on a broken chains file
    sandbox = bench_sandbox(url, deposits, args.workers)
    print(f"machine: {machine()}")
    print(
        f"sandbox -> credited: {sandbox['deposits']} deposits, {sandbox['workers']} workers: "
        f"{sandbox['credited_per_s']:.1f} deposits/s end to end "
        f"(submitted {sandbox['submitted_per_s']:.1f}/s; latency p50 "
        f"{sandbox['latency_p50_ms']:.0f} ms, p95 {sandbox['latency_p95_ms']:.0f} ms)"
    )
    print(
        f"sandbox backlog drained by the workers alone: {sandbox['drained_per_s']:.1f} deposits/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
