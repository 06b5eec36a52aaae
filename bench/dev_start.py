"""`settle dev`: seconds from the command to its first answer, cold and warm.

    .venv/bin/python bench/dev_start.py [--warm-runs 3]

Cold: a new data dir (the embedded PostgreSQL's initdb, migrations, the demo tenant).
Warm: the same data dir again (the server starts on existing files; modules are in the
page cache). Each time is from starting the process to the first 200 of GET /v1/chains;
then the process is stopped with SIGTERM, as Ctrl-C would, and must exit cleanly
(stopping its PostgreSQL). Goal (issue 9): warm under 5 s. `settle --help` is timed too.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests

from bench.harness import ROOT, free_port, machine

#: Longest a start may take before the run is called failed.
START_LIMIT_S = 180.0


def first_answer(data_dir: Path) -> float:
    """Seconds from `settle dev` to its first 200; the process is stopped after."""
    port = free_port()
    env = {**os.environ, "SETTLE_DATA_DIR": str(data_dir)}
    env.pop("SETTLE_DATABASE_URL", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "dev", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"settle dev exited with {proc.returncode}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/v1/chains", timeout=1).ok:
                    return time.monotonic() - started
            except requests.RequestException:
                pass
            if time.monotonic() - started > START_LIMIT_S:
                raise RuntimeError(f"settle dev did not answer within {START_LIMIT_S:.0f} s")
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def help_seconds() -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "services.cli", "--help"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm-runs", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    # The embedded server runs as an unprivileged user: its folder must be reachable.
    with tempfile.TemporaryDirectory(prefix="settle-dev-bench-") as folder:
        Path(folder).chmod(0o755)
        data_dir = Path(folder) / "data"
        cold = first_answer(data_dir)
        warm = [first_answer(data_dir) for _ in range(max(1, args.warm_runs))]
    helps = [help_seconds() for _ in range(3)]
    print(f"settle dev start on {machine()} (load {load:.1f} when started)")
    print(f"  cold (new data dir):   {cold:6.2f} s to the first answer")
    print(
        f"  warm (same data dir):  {statistics.median(warm):6.2f} s median of {len(warm)}"
        f" (max {max(warm):.2f} s)   (goal < 5 s)"
    )
    print(f"  settle --help:         {statistics.median(helps):6.2f} s median of 3")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
