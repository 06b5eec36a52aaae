"""The README's compose path, line by line, ends with an API key that works (issue 13, item 8).

No Docker engine here, so the two `docker compose` lines run what compose would run:
`up` runs the `migrate` service's command and `core-api`'s, with the environment
compose.yaml gives them (hosts pointed at this machine's PostgreSQL and Redis), and
`exec core-api settle ...` runs that `settle` command with the same environment. Every
other line runs in bash as written, in a folder holding a copy of `.env.example`; the
values a person pastes (the secret key, the xpub, the key printed) are taken from what
the lines before printed. The last line's curl must list the new tenant's accounts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.pipeline import isolated_database
from tests.support.processes import ROOT, SettleProcesses, free_port, wait_answering
from tests.support.services import require_service

pytestmark = pytest.mark.e2e

VENV_BIN = Path(os.environ.get("VIRTUAL_ENV") or ROOT / ".venv") / "bin"


def compose_block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Running it with compose", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    block = re.sub(r"\\\n\s*", "", block)  # a line continued with a backslash
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def compose_env(values: dict[str, str], database_url: str, redis_prefix: str) -> dict[str, str]:
    """core-api's environment as compose.yaml writes it: .env (its `env_file`), under the
    `environment` block with `${VAR:?...}` filled from .env."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    assert compose["services"]["core-api"]["env_file"] == ".env"
    env: dict[str, str] = dict(values)
    for name, value in compose["x-settle-env"].items():
        value = re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: values[m.group(1)], str(value))
        env[name] = value
    # Compose's hosts are containers; here they are this machine's services.
    assert env["SETTLE_DATABASE_URL"].endswith("@postgres:5432/settle")
    env["SETTLE_DATABASE_URL"] = database_url
    assert env["SETTLE_REDIS_URL"] == "redis://redis:6379/0"
    env["SETTLE_REDIS_URL"] = "redis://127.0.0.1:6379/0"
    env["SETTLE_REDIS_PREFIX"] = redis_prefix
    return env


def dotenv(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )


def bash(line: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.fixture
def database() -> Iterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    with isolated_database("compose_path") as url:
        yield url


def test_the_readme_compose_path_ends_with_a_working_api_key(database: str, tmp_path: Path) -> None:
    lines = compose_block()
    folder = tmp_path / "checkout"
    folder.mkdir()
    (folder / ".env.example").write_text((ROOT / ".env.example").read_text())
    (folder / "deploy/tls").mkdir(parents=True)
    (folder / "deploy/make_env.py").write_text((ROOT / "deploy/make_env.py").read_text())
    (folder / ".venv").symlink_to(VENV_BIN.parent)
    shell = {
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
    }
    values: dict[str, str] = {}
    api_port = 0
    tenant: dict[str, str] = {}
    with SettleProcesses({}, tmp_path) as procs:
        for line in lines:
            argv = shlex.split(line)
            if "settle keys new" in line:
                values["SETTLE_DEPOSIT_XPUB"] = json.loads(bash(line, folder, shell))["xpub"]
                assert (folder / "deposit-key.json").exists()
            elif line.startswith("python3 deploy/make_env.py"):
                # The xpub the line before printed, where the README writes `xpub...`
                assert " --xpub xpub..." in line
                bash(line.replace("xpub...", values["SETTLE_DEPOSIT_XPUB"]), folder, shell)
                values.update(dotenv((folder / ".env").read_text(encoding="utf-8")))
                assert values["SETTLE_SECRET_KEY"] and values["SETTLE_POSTGRES_PASSWORD"]
            elif line.startswith("openssl req"):
                bash(line, folder, shell)
                assert (folder / "deploy/tls/fullchain.pem").exists()
            elif argv[:4] == ["docker", "compose", "--profile", "monitoring"]:
                compose = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
                assert {"prometheus", "grafana"} <= set(compose["services"])
            elif argv[:3] == ["docker", "compose", "up"]:
                env = compose_env(values, database, f"settle-test:{uuid.uuid4().hex}:")
                procs.env.update({**os.environ, **env})
                procs.start("migrate", "db", "upgrade", wait=False)
                assert procs.processes[-1].proc is not None
                assert procs.processes[-1].proc.wait(120) == 0, procs.logs()
                api_port = free_port()
                core = procs.start("core-api", "core", "api", "--port", str(api_port), wait=False)
                wait_answering(core, api_port, "/v1/status")
            elif argv[:3] == ["docker", "compose", "exec"]:
                assert argv[3] == "core-api" and argv[4] == "settle", argv
                command = shlex.join([str(VENV_BIN / "python"), "-m", "services.cli", *argv[5:]])
                tenant = json.loads(bash(command, ROOT, {**shell, **procs.env}))
            elif line.startswith("export KEY="):
                assert set(tenant) == {"tenantId", "apiKey", "apiKeyId"}
                shell["KEY"] = tenant["apiKey"]
            elif line.startswith("curl "):
                # Through the ingress over HTTPS in compose; straight to core's API here
                # (tests/e2e/test_ingress_tls.py runs the ingress with TLS)
                assert "https://127.0.0.1:8443/" in line
                line = line.replace("https://127.0.0.1:8443/", f"http://127.0.0.1:{api_port}/")
                answer = bash(line, folder, shell)
                # Then the key printed by the path works, on production settings
                assert json.loads(answer) == {"depositAccounts": [], "nextCursor": None}
                values["done"] = "yes"
            else:
                raise AssertionError(f"a README line this test does not know: {line!r}")
    assert values.get("done") == "yes", lines
