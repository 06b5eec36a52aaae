"""What a hostile 256 KiB body costs core's API, beside what any 256 KiB body costs.

    .venv/bin/python bench/hostile_bodies.py [--rounds 20]

Sends each body to `POST /v1/sessions` (public: anyone can) of core's real app,
in-process (the Flask app a gunicorn worker runs, without the network), and prints
the answer and the CPU time per request. The reference is a plain 256 KiB body that
parses and fails validation: the cheapest thing a client can make the API read at the
size limit. Bodies nested deeper than 32 levels or holding more than 1000 arrays and
objects are refused before parsing (shared/safejson.py); the last column says what
each costs beside the reference.
The database (a fresh one, dropped after) is not queried: sign-in is refused before
the lookup.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import drop_database, fresh_database
from services.core.app import create_app
from services.core.config import CoreConfig
from shared.api import MAX_BODY_BYTES
from tests.support.keys import test_xpub

LIMIT = MAX_BODY_BYTES - 64


def bodies() -> dict[str, bytes]:
    half = LIMIT // 2
    return {
        "reference: 256 KiB string (400 invalid_request)": json.dumps(
            {"email": "x" * (LIMIT - 40), "password": "p"}
        ).encode(),
        "nested arrays, 128k deep": b"[" * half + b"]" * half,
        "nested objects, 43k deep": b'{"a":' * (LIMIT // 6) + b"1" + b"}" * (LIMIT // 6),
        "arrays 32 deep, side by side": b"["
        + b",".join([b"[" * 31 + b"]" * 31] * (LIMIT // 63))
        + b"]",
        "many empty arrays [[],[],...]": b"[" + b"[]," * (LIMIT // 3 - 1) + b"[]]",
        "many numbers [1,1,...]": b"[" + b"1," * (LIMIT // 2 - 1) + b"1]",
        "brackets inside one string": b'["' + b"[{" * (half - 2) + b'"]',
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    url = fresh_database("settle_bench_hostile")
    try:
        return _run(url, args.rounds)
    finally:
        drop_database("settle_bench_hostile")


def _run(url: str, rounds: int) -> int:
    config = CoreConfig(
        database_url=url,
        identity_database_url=url,
        env="dev",
        data_dir=Path(tempfile.mkdtemp(prefix="settle-bench-")),
        deposit_xpub=test_xpub(),
    )
    client = create_app(config).test_client()
    headers = {"Content-Type": "application/json"}
    results = {}
    for name, body in bodies().items():
        status, code, times = 0, "", []
        for _ in range(rounds):
            started = time.process_time()
            answer = client.post("/v1/sessions", data=body, headers=headers)
            times.append(time.process_time() - started)
            status, code = answer.status_code, (answer.get_json() or {}).get("code", "")
        results[name] = (len(body), status, code, statistics.median(times))
    reference = next(iter(results.values()))[3]
    print(f"{'body':<50} {'bytes':>7}  answer                 CPU ms  x reference")
    for name, (size, status, code, cpu) in results.items():
        print(
            f"{name:<50} {size:>7}  {status} {code:<18} {cpu * 1000:>7.2f}  {cpu / reference:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
