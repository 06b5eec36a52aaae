"""Run every benchmark and write their figures into docs/PERFORMANCE.md.

    .venv/bin/python bench/report.py [--quick]

Each benchmark prints its own figures, baselines and ratios measured in the same run;
this script runs them one after another on this machine and replaces the section
between the `bench:begin` and `bench:end` markers of docs/PERFORMANCE.md with what
they printed, the command and the machine. The prose around the markers is kept.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, machine

DOC = ROOT / "docs" / "PERFORMANCE.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"

#: (title, script, arguments, quick arguments)
BENCHES = [
    ("Core API under gunicorn + PostgreSQL", "bench/core_api.py", [], ["--duration", "4"]),
    ("Webhook delivery, production processes", "bench/webhooks.py", [], ["--quick"]),
    ("Deposit pipeline", "bench/pipeline.py", [], ["--quick"]),
    ("Chain watcher", "bench/watcher.py", [], ["--quick"]),
    ("Statements of a large tenant", "bench/statements.py", [], ["--quick"]),
    ("Delivery SLA query", "bench/sla.py", [], ["--quick"]),
    ("Hostile request bodies", "bench/hostile_bodies.py", [], ["--rounds", "5"]),
    ("settle dev start", "bench/dev_start.py", [], ["--warm-runs", "1"]),
    ("Idle CPU of every process", "bench/idle.py", [], ["--seconds", "20", "--warmup", "5"]),
]


def run(script: str, args: list[str]) -> tuple[str, float, int]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    output = proc.stdout.strip() or proc.stderr.strip()[-2000:]
    return output, time.monotonic() - started, proc.returncode


def render(sections: list[str]) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = f"Measured {stamp} on {machine()}, by `make bench` (`bench/report.py`).\n"
    return "\n".join([BEGIN, head, *sections, END])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    args = parser.parse_args()
    sections, failed = [], 0
    for title, script, full, quick in BENCHES:
        bench_args = quick if args.quick else full
        command = " ".join([".venv/bin/python", script, *bench_args])
        print(f"running {command}", flush=True)
        output, seconds, code = run(script, bench_args)
        failed += code != 0
        status = "" if code == 0 else f" (exit {code})"
        sections.append(
            f"### {title}\n\n`{command}` ({seconds:.0f} s{status})\n\n```\n{output}\n```\n"
        )
        print(output, flush=True)
    block = render(sections)
    text = DOC.read_text() if DOC.exists() else "# Performance\n"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n## Latest figures\n\n" + block + "\n"
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
