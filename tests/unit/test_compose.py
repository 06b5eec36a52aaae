"""compose.yaml, Dockerfile and .env.example, checked without a Docker engine.

What `docker compose config` would catch for us (and a little more): every service is
there, each runs a real `settle` command, start-up order, the ingress template wiring,
and no stray `$` that compose would interpolate.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (ROOT / "compose.yaml").read_text(encoding="utf-8")
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, Any] = COMPOSE["services"]

#: service -> the `settle` arguments it runs (the image's ENTRYPOINT is `settle`).
SETTLE_COMMANDS = {
    "migrate": ["db", "upgrade"],
    "core-api": ["core", "api", "--host", "0.0.0.0", "--port", "8000"],
    "core-worker": ["core", "worker"],
    "notifier-api": ["notifier", "api", "--host", "0.0.0.0", "--port", "8001"],
    "notifier-consumer": ["notifier", "consume"],
    "notifier-worker": ["notifier", "worker"],
}
LONG_RUNNING = [name for name in SETTLE_COMMANDS if name != "migrate"]
#: Variables compose must get from the environment / .env (no default).
REQUIRED_VARS = {
    "SETTLE_SECRET_KEY",
    "SETTLE_DEPOSIT_XPUB",
    "SETTLE_AMQP_CORE_PASSWORD",
    "SETTLE_AMQP_NOTIFIER_PASSWORD",
}
#: service -> the RabbitMQ user it connects as (None: no broker access at all).
BUS_USERS = {
    "migrate": None,
    "core-api": None,
    "core-worker": "settle-core",
    "notifier-api": "settle-notifier",
    "notifier-consumer": "settle-notifier",
    "notifier-worker": "settle-notifier",
}


def load_render() -> ModuleType:
    """deploy/nginx/render.py (not a package), under a name of its own."""
    name = "settle_nginx_render"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "deploy/nginx/render.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_every_service_is_there() -> None:
    assert set(SERVICES) == {
        "postgres",
        "rabbitmq-definitions",
        "rabbitmq",
        "redis",
        "ingress",
        *SETTLE_COMMANDS,
    }


def test_api_processes_share_rate_limits_and_know_their_proxy() -> None:
    # Every API process on one Redis (one budget per client however many run), and the
    # ingress's X-Forwarded-For names the client (else all clients share one bucket).
    env = COMPOSE["x-settle-env"]
    assert env["SETTLE_REDIS_URL"] == "redis://redis:6379/0"
    assert env["SETTLE_TRUSTED_PROXIES"] == "1"
    assert "healthcheck" in SERVICES["redis"]


@pytest.mark.parametrize("name", sorted(SETTLE_COMMANDS))
def test_settle_services_run_the_settle_cli(name: str) -> None:
    service = SERVICES[name]
    assert service["command"] == SETTLE_COMMANDS[name]
    assert "entrypoint" not in service  # the image's ENTRYPOINT ["settle"]
    assert service["image"] == "settle:local"
    assert service["build"]["context"] == "."
    assert service.get("init") is True


@pytest.mark.parametrize("name", sorted(SETTLE_COMMANDS))
def test_settle_services_share_the_environment(name: str) -> None:
    env = SERVICES[name]["environment"]
    assert env["SETTLE_ENV"] == "production"
    assert env["SETTLE_DATABASE_URL"] == "postgresql+psycopg://settle:settle@postgres:5432/settle"
    assert env["SETTLE_SECRET_KEY"].startswith("${SETTLE_SECRET_KEY:?")
    assert env["SETTLE_DEPOSIT_XPUB"].startswith("${SETTLE_DEPOSIT_XPUB:?")


@pytest.mark.parametrize("name", sorted(SETTLE_COMMANDS))
def test_each_service_speaks_to_rabbitmq_as_its_own_user(name: str) -> None:
    env = SERVICES[name]["environment"]
    user = BUS_USERS[name]
    if user is None:
        assert "SETTLE_AMQP_URL" not in env  # least privilege: no credentials at all
        return
    password = (
        "SETTLE_AMQP_CORE_PASSWORD" if user == "settle-core" else "SETTLE_AMQP_NOTIFIER_PASSWORD"
    )
    assert env["SETTLE_AMQP_URL"].startswith(f"amqp://{user}:${{{password}:?")
    assert env["SETTLE_AMQP_URL"].endswith("@rabbitmq:5672/%2F")
    if user == "settle-notifier":
        # The consumer trusts only events whose AMQP user_id is core's user
        assert env["SETTLE_CORE_AMQP_USER"] == "settle-core"


def test_no_service_uses_guest_and_the_broker_loads_the_definitions() -> None:
    assert "guest" not in COMPOSE_TEXT
    definitions = SERVICES["rabbitmq-definitions"]
    assert definitions["image"].startswith("python:3.11")
    assert definitions["restart"] == "no"
    mounts = dict(v.rsplit(":", 2)[:2] for v in definitions["volumes"])
    script = mounts["./deploy/rabbitmq/definitions.py"]
    out = definitions["command"][definitions["command"].index("--out") + 1]
    assert definitions["command"][:2] == ["python", script]
    assert set(definitions["environment"]) == {
        "SETTLE_AMQP_CORE_PASSWORD",
        "SETTLE_AMQP_NOTIFIER_PASSWORD",
    }
    # The broker mounts the same volume and a conf.d file that loads what was written there
    shared_volume = mounts.keys() - {"./deploy/rabbitmq/definitions.py"}
    (volume,) = shared_volume
    broker = SERVICES["rabbitmq"]
    broker_mounts = dict(v.split(":")[:2] for v in broker["volumes"])
    conf = (ROOT / "deploy/rabbitmq/rabbitmq.conf").read_text(encoding="utf-8")
    assert broker_mounts["./deploy/rabbitmq/rabbitmq.conf"].startswith("/etc/rabbitmq/conf.d/")
    loaded = re.search(r"^load_definitions = (\S+)$", conf, flags=re.M)
    assert loaded, conf
    assert loaded.group(1) == out.replace(mounts[volume], broker_mounts[volume], 1)
    assert broker["depends_on"] == {
        "rabbitmq-definitions": {"condition": "service_completed_successfully"}
    }


def test_anchors_keep_it_dry() -> None:
    assert "x-settle-env: &settle-env" in COMPOSE_TEXT
    assert COMPOSE_TEXT.count("SETTLE_DATABASE_URL:") == 1
    assert COMPOSE_TEXT.count("SETTLE_AMQP_URL:") == 2  # one per bus user


def test_start_order() -> None:
    assert SERVICES["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert SERVICES["migrate"]["restart"] == "no"
    for name in LONG_RUNNING:
        assert SERVICES[name]["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "rabbitmq": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }, name
    assert SERVICES["ingress"]["depends_on"] == {
        "core-api": {"condition": "service_healthy"},
        "notifier-api": {"condition": "service_healthy"},
    }
    for name in ("postgres", "rabbitmq", "core-api", "notifier-api", "ingress"):
        assert SERVICES[name]["healthcheck"]["test"], name
    assert SERVICES["postgres"]["image"] == "postgres:16"
    assert SERVICES["rabbitmq"]["image"] == "rabbitmq:3-management"


def test_api_healthchecks_hit_their_own_port() -> None:
    assert "127.0.0.1:8000/v1/status" in " ".join(SERVICES["core-api"]["healthcheck"]["test"])
    assert "127.0.0.1:8001/v1/notifier/status" in " ".join(
        SERVICES["notifier-api"]["healthcheck"]["test"]
    )


def test_notifier_worker_scales() -> None:
    assert SERVICES["notifier-worker"]["deploy"]["replicas"] == 2
    for name, service in SERVICES.items():
        assert "container_name" not in service, name  # a fixed name would block scaling


def _published(service: dict[str, Any]) -> set[int]:
    ports = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.add(int(entry["published"]))
        else:  # "HOST:CONTAINER" or "IP:HOST:CONTAINER"
            ports.add(int(str(entry).split(":")[-2]))
    return ports


def test_only_the_ingress_is_published_on_8080() -> None:
    assert _published(SERVICES["ingress"]) == {8080}
    for name, service in SERVICES.items():
        if name != "ingress":
            assert not service.get("ports"), f"{name} publishes ports; only the ingress may"


def test_ingress_renders_the_template_with_only_its_placeholders() -> None:
    render = load_render()
    ingress = SERVICES["ingress"]
    assert ingress["image"] == "nginx:1.27-alpine"
    template_names = set(render.unfilled(render.TEMPLATE.read_text(encoding="utf-8")))
    assert template_names == set(render.PLACEHOLDERS)
    assert set(ingress["environment"]) == template_names
    assert ingress["environment"]["LISTEN_PORT"] == "8080"
    mounts = {v.split(":")[0]: v.split(":")[1] for v in ingress["volumes"]}
    assert (ROOT / "deploy/nginx/settle.conf.template").is_file()
    template_in_container = mounts["./deploy/nginx/settle.conf.template"]
    script = " ".join(ingress["command"])
    assert template_in_container in script
    # envsubst gets exactly the placeholder names (compose turns `$$` into `$`)
    listed = re.search(r"envsubst '([^']*)'", script)
    assert listed, script
    assert set(re.findall(r"\$\$\{(\w+)\}", listed.group(1))) == template_names
    assert "daemon off;" in script


def test_no_stray_compose_interpolation() -> None:
    # After `$$` (a literal `$`), every `$` left is compose interpolation: only the
    # required settings may use it, or compose would eat a shell/nginx variable.
    text = "\n".join(
        line for line in COMPOSE_TEXT.splitlines() if not line.lstrip().startswith("#")
    )
    text = text.replace("$$", "")
    used = re.findall(r"\$\{?(\w+)", text)
    assert set(used) == REQUIRED_VARS


def test_env_example_lists_the_required_settings() -> None:
    text = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert text.startswith("# Settle settings (see README, Configuration)")
    defined = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", text, flags=re.M))
    assert defined >= REQUIRED_VARS


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", text, flags=re.M)
    assert "COPY constraints.txt" in text
    assert "pip install -c constraints.txt ." in text
    assert 'ENTRYPOINT ["settle"]' in text
    users = re.findall(r"^USER (\S+)", text, flags=re.M)
    assert users and not users[-1].startswith(("root", "0"))


def test_compose_commands_parse_with_the_cli() -> None:
    from services.cli import build_parser

    parser = build_parser("all")
    for name, argv in SETTLE_COMMANDS.items():
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{name}: `settle {' '.join(argv)}` is not a settle command")
        assert callable(args.func), name
