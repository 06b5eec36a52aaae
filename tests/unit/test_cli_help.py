"""`settle --help` and every `settle <group> --help` import nothing heavy.

Each runs in a fresh interpreter (as a person's shell would), which then lists the heavy
packages it imported: there must be none. How long help takes is printed by
`python -m bench.cli_help` (a bound of 0.5 s), never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services import cli

#: Packages that make `settle ... --help` slow (seconds each on a loaded machine).
HEAVY = (
    "flask",
    "werkzeug",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "marshmallow",
    "web3",
    "eth_account",
    "eth_utils",
    "dramatiq",
    "pika",
    "gunicorn",
    "requests",
    "cryptography",
    "prometheus_client",
    "redis",
)

_PROBE = """
import contextlib, io, json, sys
from services import cli
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli.main(sys.argv[1:])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))))
"""

#: The sub-commands a person asks about most, beside each group.
LEAVES = (
    ("deliveries", "list"),
    ("deliveries", "replay"),
    ("endpoints", "recover"),
    ("deposits", "list"),
    ("events", "list"),
)


def _heavy_imported(argv: list[str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{_PROBE}", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [[], *([name] for name in cli.COMMANDS), *(list(leaf) for leaf in LEAVES)],
    ids=lambda argv: " ".join(argv) or "settle",
)
def test_help_imports_no_heavy_module(argv: list[str]) -> None:
    assert _heavy_imported([*argv, "--help"]) == []
