"""`make dev` installs only what running needs and takes PORT/HOST (issue 13, item 8)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The test tool chain: none of it is needed to run Settle.
TEST_TOOLS = ("pytest", "vyper", "py-evm", "eth-tester", "schemathesis", "hypothesis", "ruff")


def make_plan(*args: str) -> list[str]:
    """The commands `make` would run for `args` (dry run, every prerequisite remade)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # Run as a top-level make even under `make test`: an inherited MAKELEVEL/MAKEFLAGS
    # makes it print "Entering/Leaving directory" lines around the plan.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_dev_installs_the_package_without_the_test_tool_chain() -> None:
    plan = make_plan("dev")
    installs = [line for line in plan if "pip install" in line]
    assert any(re.search(r"-e \.(\s|$)", line) for line in installs), installs
    assert not any(".[test]" in line for line in installs), installs


def test_the_running_dependencies_name_no_test_tool() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[\[<>=~ ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]]
    assert not set(names) & set(TEST_TOOLS), names
    assert set(TEST_TOOLS) <= {
        re.split(r"[\[<>=~ ]", dep, maxsplit=1)[0].lower()
        for dep in project["optional-dependencies"]["test"]
    }


def test_make_dev_takes_port_and_host() -> None:
    plan = make_plan("dev", "PORT=8123", "HOST=127.0.0.2")
    assert plan[-1].endswith("settle dev --host 127.0.0.2 --port 8123"), plan[-1]
    listen = make_plan("listen", "PORT=8123")
    assert listen[-1].split("settle ", 1)[1].startswith("listen --api http://127.0.0.1:8123")
