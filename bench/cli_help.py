"""`settle --help` and each `settle <group> --help`: seconds from the command to its exit.

    .venv/bin/python bench/cli_help.py [--runs 5]

Each is run as a person runs it (the venv's `settle` script, a fresh process), `--runs`
times; the median and the slowest are printed against the bound of issue 26 (0.5 s).
tests/unit/test_cli_help.py checks what makes it fast (no heavy module imported).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, machine
from services.cli import COMMANDS

#: The bound a help answer should stay under (issue 26).
BOUND_S = 0.5


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, timeout=60)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    settle = str(Path(sys.executable).parent / "settle")
    print(f"settle help timings ({machine()}; {args.runs} runs each; bound {BOUND_S} s)")
    print(f"{'command':<34} {'median s':>9} {'max s':>7}  within")
    worst = 0.0
    for group in ["", *COMMANDS]:
        argv = [settle, *([group] if group else []), "--help"]
        times = [timed(argv) for _ in range(args.runs)]
        median, slowest = statistics.median(times), max(times)
        worst = max(worst, median)
        shown = "settle " + (f"{group} " if group else "") + "--help"
        print(f"{shown:<34} {median:>9.3f} {slowest:>7.3f}  {'yes' if median < BOUND_S else 'NO'}")
    print(f"slowest median: {worst:.3f} s (bound {BOUND_S} s); run from {ROOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
