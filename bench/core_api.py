"""Core API throughput under gunicorn + PostgreSQL, as a ratio to a bare Flask route.

    .venv/bin/python bench/core_api.py [--duration 10] [--connections 16] [--workers 2]

Starts, on 127.0.0.1: core (`settle core api`) on a fresh PostgreSQL database and a
bare Flask app returning a constant JSON, both with the same gunicorn settings;
drives each with wrk in the same run and prints requests/s and the ratios.
Goals (issue #2): GET /v1/chains >= 0.8 of bare, POST /v1/deposit-accounts >= 0.25.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bip_utils import Bip32Secp256k1

from bench.harness import ROOT, free_port, fresh_database, machine, process, wrk
from shared.db import Database
from shared.identity import service as identity

CREATE_SCRIPT = r"""
local counter = 0
local started = 0
function setup(thread)
  -- Runs in the main state; `tid` becomes a global of each thread's own state.
  started = started + 1
  thread:set("tid", started)
end
function init(args)
  math.randomseed(os.time() + tid)
  prefix = string.format("bench-%d-%d-", tid, math.random(1, 1000000000))
end
function request()
  counter = counter + 1
  local body = string.format('{"externalUserId":"%s%d"}', prefix, counter)
  return wrk.format("POST", "/v1/deposit-accounts", {
    ["Authorization"] = "Bearer @KEY@",
    ["Content-Type"] = "application/json",
  }, body)
end
"""


def serve_cmd(target: str, port: int, workers: int, threads: int) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from shared.serve import serve; "
        f"serve({target!r}, host='127.0.0.1', port={port}, workers={workers}, threads={threads})",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per measurement")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (both servers)")
    parser.add_argument("--threads", type=int, default=1, help="gunicorn threads per worker")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args()

    url = fresh_database("settle_bench_core")
    db = Database(url, pool_size=1)
    with db.transaction() as session:
        tenant, issued = identity.create_tenant(session, "bench")
        # The bench needs a policy so accounts can be created without a destination.
        from services.core.models import DestinationPolicy
        from shared.timefmt import utcnow

        now = utcnow()
        session.add(
            DestinationPolicy(
                tenant_id=tenant.id,
                chain_id=8453,
                address="0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
                token_address="0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
                venue=None,
                created_at=now,
                updated_at=now,
            )
        )
    from services.core.chains import load_chains
    from services.core.fees import refresh_fees

    refresh_fees(db, load_chains())
    db.dispose()

    xpub = Bip32Secp256k1.FromSeed(bytes(range(32))).PublicKey().ToExtended()
    env = {
        "SETTLE_DATABASE_URL": url,
        "SETTLE_ENV": "production",
        "SETTLE_DEPOSIT_XPUB": xpub,
        "SETTLE_SECRET_KEY": "bench-secret",
        "PYTHONPATH": str(ROOT),
    }
    core_port, bare_port = free_port(), free_port()
    figures: dict[str, dict[str, float | int | None]] = {}
    with (
        process(
            serve_cmd("bench.bare_app:app", bare_port, args.workers, args.threads),
            env,
            f"http://127.0.0.1:{bare_port}/v1/bare",
        ),
        process(
            serve_cmd("services.core.wsgi:app", core_port, args.workers, args.threads),
            env,
            f"http://127.0.0.1:{core_port}/v1/status",
        ),
    ):
        runs = {
            "bare GET /v1/bare": (f"http://127.0.0.1:{bare_port}/v1/bare", None),
            "GET /v1/chains": (f"http://127.0.0.1:{core_port}/v1/chains", None),
            "POST /v1/deposit-accounts": (
                f"http://127.0.0.1:{core_port}/v1/deposit-accounts",
                CREATE_SCRIPT.replace("@KEY@", issued.api_key),
            ),
        }
        for name, (target, script) in runs.items():
            # A short warm-up so every worker has its connections and caches.
            wrk(target, duration_s=2, connections=args.connections, script=script)
            result = wrk(
                target, duration_s=args.duration, connections=args.connections, script=script
            )
            figures[name] = {
                "requests_per_s": round(result.requests_per_s, 1),
                "p50_ms": result.latency_p50_ms,
                "p99_ms": result.latency_p99_ms,
                "requests": result.requests,
                "errors": result.errors,
            }
    bare = float(figures["bare GET /v1/bare"]["requests_per_s"] or 1)
    print(f"machine: {machine()}")
    print(
        f"gunicorn: {args.workers} workers x {args.threads} threads; wrk: 2 threads, "
        f"{args.connections} connections, {args.duration}s per run; PostgreSQL 127.0.0.1"
    )
    print(f"{'run':32} {'req/s':>9} {'ratio':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for name, fig in figures.items():
        ratio = float(fig["requests_per_s"] or 0) / bare
        fig["ratio_to_bare"] = round(ratio, 3)
        print(
            f"{name:32} {fig['requests_per_s']:>9} {ratio:>7.2f} {fig['p50_ms'] or 0:>8.2f} "
            f"{fig['p99_ms'] or 0:>8.2f} {fig['errors']:>7}"
        )
    goals = {"GET /v1/chains": 0.8, "POST /v1/deposit-accounts": 0.25}
    for name, goal in goals.items():
        verdict = "met" if float(figures[name]["ratio_to_bare"] or 0) >= goal else "MISSED"
        print(f"goal {name} >= {goal} of bare: {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
