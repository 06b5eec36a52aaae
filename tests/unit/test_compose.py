"""compose.yaml, Dockerfile and .env.example, checked without a Docker engine.

What `docker compose config` would catch for us (and a little more): every service is
there, each runs a real `settle` command, start-up order, the ingress template wiring,
and no stray `$` that compose would interpolate. The file is also rendered as compose
would with a .env written by deploy/make_env.py (interpolation, then each service's
env_file under its environment): what each process really gets.
"""

from __future__ import annotations

import importlib.util
import json
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
    "SETTLE_POSTGRES_PASSWORD",
    "SETTLE_GRAFANA_ADMIN_PASSWORD",
}
#: Variables with a default in compose.yaml (`${NAME:-default}`).
OPTIONAL_VARS = {"SETTLE_HTTP_PORT", "SETTLE_HTTPS_PORT", "SETTLE_TLS_DIR"}
#: Secrets in .env: no Settle process gets them raw (only inside its own URLs).
PASSWORDS = REQUIRED_VARS - {"SETTLE_SECRET_KEY", "SETTLE_DEPOSIT_XPUB"}
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
        "prometheus",
        "grafana",
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
    assert env["SETTLE_DATABASE_URL"] == (
        "postgresql+psycopg://settle:${SETTLE_POSTGRES_PASSWORD:?set SETTLE_POSTGRES_PASSWORD"
        " (python3 deploy/make_env.py)}@postgres:5432/settle"
    )
    assert env["SETTLE_SECRET_KEY"].startswith("${SETTLE_SECRET_KEY:?")
    assert env["SETTLE_DEPOSIT_XPUB"].startswith("${SETTLE_DEPOSIT_XPUB:?")
    assert SERVICES[name]["env_file"] == ".env"


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
    # The queues' topology, next to the script (it imports it from there)
    assert mounts["./shared/topology.py"] == script.rsplit("/", 1)[0] + "/topology.py"
    # The broker mounts the same volume and a conf.d file that loads what was written there
    shared_volume = mounts.keys() - {"./deploy/rabbitmq/definitions.py", "./shared/topology.py"}
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


def test_only_the_ingress_is_published_and_monitoring_only_on_loopback() -> None:
    ingress = render_compose(make_env())["services"]["ingress"]
    assert _published(ingress) == {8080, 8443}
    for name in ("prometheus", "grafana"):
        for entry in SERVICES[name]["ports"]:
            assert str(entry).startswith("127.0.0.1:"), f"{name} must listen on loopback only"
    for name, service in SERVICES.items():
        if name not in ("ingress", "prometheus", "grafana"):
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
    assert set(used) == REQUIRED_VARS | OPTIONAL_VARS


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


# --- compose.yaml rendered with a generated .env, as `docker compose config` would -----

_INTERPOLATION = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


def make_env(tmp_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """The .env deploy/make_env.py writes (with an xpub), plus `extra` lines, parsed."""
    module = _load("settle_make_env", ROOT / "deploy/make_env.py")
    text = module.render((ROOT / ".env.example").read_text(encoding="utf-8"), TEST_XPUB)
    text += "".join(f"{name}={value}\n" for name, value in extra.items())
    return dotenv(text)


def dotenv(text: str) -> dict[str, str]:
    """KEY=VALUE lines (comments and blanks skipped), as compose reads .env."""
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """compose's `${NAME}`, `${NAME:-default}`, `${NAME:?error}` and `$$`, recursively."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        given = env.get(name, "")
        operator, argument = match.group(2), match.group(3)
        if operator in (":?", "?") and not given:
            raise AssertionError(f"compose would stop: {argument}")
        if operator in (":-", "-") and not given:
            return str(argument)
        return given

    return _INTERPOLATION.sub(substitute, value)


def render_compose(env: dict[str, str]) -> dict[str, Any]:
    """compose.yaml after interpolation with `env` (anchors already merged by YAML)."""
    return interpolate(COMPOSE, env)


def process_env(service: dict[str, Any], dotenv_values: dict[str, str]) -> dict[str, str]:
    """What the container's process gets: its env_file, under its `environment`."""
    merged = dict(dotenv_values) if service.get("env_file") == ".env" else {}
    merged.update({key: str(value) for key, value in service.get("environment", {}).items()})
    return merged


TEST_XPUB = (
    "xpub661MyMwAqRbcFtXgS5sYJABqqG9YLmC4Q1Rdap9gSE8NqtwybGhePY2gZ29ESFjqJoCu1Rupje8YtGqsefD26"
    "5TMg7usUDFdp6W1EGMcet8"
)


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_optional_setting_in_env_reaches_every_settle_process() -> None:
    # Given a .env with optional settings uncommented (what did nothing before env_file)
    env = make_env(
        SETTLE_RPC_URL_1="https://eth.example.com/rpc",
        SETTLE_WEBHOOK_RETRY_SCHEDULE="5s,1m,5m",
        SETTLE_HOT_WALLET_MIN_BALANCE="1:ETH=0.5",
    )
    services = render_compose(env)["services"]
    for name in SETTLE_COMMANDS:
        got = process_env(services[name], env)
        # Then each Settle process gets them
        assert got["SETTLE_RPC_URL_1"] == "https://eth.example.com/rpc", name
        assert got["SETTLE_WEBHOOK_RETRY_SCHEDULE"] == "5s,1m,5m", name
        assert got["SETTLE_HOT_WALLET_MIN_BALANCE"] == "1:ETH=0.5", name
        # And what compose sets wins over .env (a .env from `settle dev` says dev)
        assert got["SETTLE_ENV"] == "production", name
        # And the database URL carries the generated password
        assert got["SETTLE_DATABASE_URL"] == (
            f"postgresql+psycopg://settle:{env['SETTLE_POSTGRES_PASSWORD']}@postgres:5432/settle"
        )
        assert got["SETTLE_SECRET_KEY"] == env["SETTLE_SECRET_KEY"]
        assert got["SETTLE_METRICS_PORT"] == "9100" and got["SETTLE_METRICS_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("name", sorted(SETTLE_COMMANDS))
def test_no_settle_process_gets_another_services_password(name: str) -> None:
    env = make_env()
    got = process_env(render_compose(env)["services"][name], env)
    # No password reaches a process raw; each is only inside its own URLs
    for password in PASSWORDS:
        assert got[password] == "", f"{name} gets {password}"
    text = "\n".join(f"{key}={value}" for key, value in got.items())
    user = BUS_USERS[name]
    if user != "settle-core":
        assert env["SETTLE_AMQP_CORE_PASSWORD"] not in text, name
    if user != "settle-notifier":
        assert env["SETTLE_AMQP_NOTIFIER_PASSWORD"] not in text, name
    assert env["SETTLE_GRAFANA_ADMIN_PASSWORD"] not in text, name


def test_no_password_is_written_in_compose_yaml() -> None:
    # Every credential is `${...}` from .env: the postgres service, the Settle URLs,
    # Grafana's admin and the broker's users
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${SETTLE_POSTGRES_PASSWORD:?"
    )
    assert SERVICES["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"].startswith(
        "${SETTLE_GRAFANA_ADMIN_PASSWORD:?"
    )
    for match in re.finditer(r"://([^:/@\s]+):([^@\s]+)@", COMPOSE_TEXT):
        assert match.group(2).startswith("${"), f"a literal password in a URL: {match.group(0)}"
    assert "settle:settle@" not in COMPOSE_TEXT
    for line in COMPOSE_TEXT.splitlines():
        key, _, value = line.strip().partition(":")
        if "PASSWORD" in key and value.strip() not in ('""', ""):
            assert value.strip().startswith("${"), line


def test_make_env_generates_every_secret_compose_needs_and_never_overwrites(
    tmp_path: Path,
) -> None:
    module = _load("settle_make_env", ROOT / "deploy/make_env.py")
    out = tmp_path / ".env"
    assert module.main(["--out", str(out), "--xpub", TEST_XPUB]) == 0
    env = dotenv(out.read_text(encoding="utf-8"))
    # Every `${NAME:?}` compose.yaml needs is filled, each secret strong and distinct
    for name in REQUIRED_VARS:
        assert env[name], name
    generated = [env[name] for name in PASSWORDS | {"SETTLE_SECRET_KEY"}]
    assert len(set(generated)) == len(generated)
    assert all(len(value) >= 32 and re.fullmatch(r"[A-Za-z0-9_-]+", value) for value in generated)
    assert (out.stat().st_mode & 0o777) == 0o600
    # compose renders with it (no `:?` stops it)
    render_compose(env)
    # A second run refuses to overwrite it
    before = out.read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        module.main(["--out", str(out)])
    assert out.read_text(encoding="utf-8") == before


def test_an_empty_env_stops_compose_naming_the_command() -> None:
    with pytest.raises(AssertionError, match=r"python3 deploy/make_env.py"):
        render_compose({})


def test_the_ingress_serves_tls_from_a_mounted_certificate_and_redirects_http() -> None:
    env = make_env(SETTLE_HTTPS_PORT="443", SETTLE_HTTP_PORT="80", SETTLE_TLS_DIR="/etc/le")
    ingress = render_compose(env)["services"]["ingress"]
    mounts = dict(
        v.rsplit(":", 2)[:2] if v.count(":") > 1 else v.split(":") for v in ingress["volumes"]
    )
    assert mounts["/etc/le"] == "/etc/settle/tls"
    environment = ingress["environment"]
    assert environment["TLS_CERT"] == "/etc/settle/tls/fullchain.pem"
    assert environment["TLS_KEY"] == "/etc/settle/tls/privkey.pem"
    assert environment["HTTPS_REDIRECT"] == "1"
    assert environment["PUBLIC_HTTPS_PORT"] == "443"
    assert _published(ingress) == {80, 443}
    assert ingress["healthcheck"]["test"][-1] == "https://127.0.0.1:8443/v1/status"


def test_prometheus_scrapes_every_settle_process_where_it_serves_metrics() -> None:
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text("utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    ports = {
        "core-api": "8000",
        "notifier-api": "8001",
        "core-worker": "9100",
        "notifier-consumer": "9100",
        "notifier-worker": "9100",
    }
    for service, port in ports.items():
        job = jobs[f"settle-{service}"]
        if "dns_sd_configs" in job:  # scaled out: every replica
            (sd,) = job["dns_sd_configs"]
            assert sd["names"] == [service] and str(sd["port"]) == port
        else:
            assert job["static_configs"] == [{"targets": [f"{service}:{port}"]}]
        assert service in SERVICES
    assert config["rule_files"] == ["alerts.yml"]
    prometheus = SERVICES["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]


def test_grafana_is_provisioned_with_the_dashboard_and_the_data_source() -> None:
    grafana = SERVICES["grafana"]
    assert grafana["profiles"] == ["monitoring"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./deploy/grafana/dashboards"] == "/var/lib/grafana/dashboards"
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/settle.yml").read_text("utf-8")
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text("utf-8")
    )
    (datasource,) = source["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/settle.json").read_text("utf-8"))
    uids = {
        target["datasource"]["uid"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    }
    assert uids == {datasource["uid"]}
