"""A real Prometheus, the production alert rules, the production processes.

Debian's Prometheus scrapes `settle core api|worker` and `settle notifier
api|consume|worker` (started as a user would, on the real PostgreSQL, RabbitMQ and an
anvil node for one chain: its watcher and the hot wallet's balances) and evaluates
deploy/prometheus/alerts.yml unchanged, every second. With the notifier worker stopped
and events flowing, SettleDeliveryLag fires within its stated time; with the worker back,
it resolves. Every metric the rules and the Grafana dashboard name is one these
processes export.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from shared.bus import BusNames
from shared.db import Database
from tests.conftest import make_tenant
from tests.e2e.test_faults import SECRET_KEY, Stack
from tests.support import keys
from tests.support.anvil import AnvilNode, require_anvil
from tests.support.deposits import chains_toml
from tests.support.pipeline import delete_bus, isolated_database, unique_prefix
from tests.support.processes import SettleProcesses, free_port, start_api
from tests.support.prometheus import PrometheusServer, exported_names, expressions, metric_names
from tests.support.receiver import Receiver
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "settle.json"
#: Series Prometheus makes itself.
PROMETHEUS_OWN = {"up", "ALERTS"}
CHAIN_ID = 31337
#: SettleDeliveryLag's stated time (docs/RUNBOOK.md): 30 s over its threshold, 30 s of
#: `for:`; here plus the gauge's 5 s cache, a 1 s scrape and evaluation, and polling.
LAG_FIRES_WITHIN_S = 30 + 30 + 10
RESOLVES_WITHIN_S = 30


class Monitored(Stack):
    """The faults test's stack, plus both APIs, metrics ports and a Prometheus."""

    def __init__(self, procs: SettleProcesses, db: Database, names: BusNames) -> None:
        super().__init__(procs, db, names)
        self.metrics_ports = {name: free_port() for name in ("core", "consume", "worker")}
        self.targets: dict[str, str] = {}

    def start(self) -> None:
        ports = self.metrics_ports
        self.relay = self.procs.start(
            "core-worker",
            "core",
            "worker",
            ready="outbox relay started",
            wait=False,
            env={"SETTLE_METRICS_PORT": str(ports["core"])},
        )
        self.consumer = self.procs.start(
            "consume",
            "notifier",
            "consume",
            ready="notifier consumer ready",
            wait=False,
            env={"SETTLE_METRICS_PORT": str(ports["consume"])},
        )
        self.worker = self.procs.start(
            "worker",
            "notifier",
            "worker",
            "--threads",
            "4",
            ready="notifier worker ready",
            wait=False,
            env={"SETTLE_METRICS_PORT": str(ports["worker"])},
        )
        core_api = start_api(self.procs, "core", "/v1/status")
        notifier_api = start_api(self.procs, "notifier", "/v1/notifier/status")
        for process in (self.relay, self.consumer, self.worker):
            process.wait_ready()
        self.targets = {
            "settle-core-api": f"127.0.0.1:{core_api.port}",
            "settle-core-worker": f"127.0.0.1:{ports['core']}",
            "settle-notifier-api": f"127.0.0.1:{notifier_api.port}",
            "settle-notifier-consumer": f"127.0.0.1:{ports['consume']}",
            "settle-notifier-worker": f"127.0.0.1:{ports['worker']}",
        }


@pytest.fixture
def monitored(tmp_path: Path) -> Iterator[tuple[Monitored, AnvilNode]]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    require_anvil()
    names = BusNames(unique_prefix())
    with isolated_database("prometheus") as url, AnvilNode(chain_id=CHAIN_ID) as node:
        # One chain on anvil: its watcher runs, and the hot wallet's balances are read
        hot = node.accounts[1]
        token = node.deploy_token("USDC", 6)
        node.mint(token, hot.address, 2_500 * 10**6)
        chains = tmp_path / "chains.toml"
        chains.write_text(chains_toml(chain_id=CHAIN_ID, usdc=token, depth=1), encoding="utf-8")
        env = {
            "SETTLE_ENV": "dev",
            "SETTLE_DATABASE_URL": url,
            "SETTLE_DATA_DIR": str(tmp_path / "data"),
            "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
            "SETTLE_AMQP_URL": AMQP_URL,
            "SETTLE_AMQP_PREFIX": names.prefix,
            "SETTLE_SECRET_KEY": SECRET_KEY,
            "SETTLE_WEBHOOK_ALLOW_PRIVATE": "true",
            "SETTLE_WEBHOOK_TIMEOUT_S": "2",
            "SETTLE_CHAINS_FILE": str(chains),
            f"SETTLE_RPC_URL_{CHAIN_ID}": node.url,
            "SETTLE_HOT_WALLET_KEY": hot.key.hex(),
            "SETTLE_HOT_WALLET_MIN_BALANCE": f"{CHAIN_ID}:USDC=1000,{CHAIN_ID}:ETH=1",
        }
        (tmp_path / "data").mkdir()
        (tmp_path / "logs").mkdir()
        db = Database(url, pool_size=4)
        procs = SettleProcesses(env, tmp_path / "logs")
        stack = Monitored(procs, db, names)
        try:
            with procs:
                stack.start()
                yield stack, node
        finally:
            delete_bus(names)
            db.dispose()


def test_the_lag_alert_fires_with_the_worker_stopped_and_resolves_when_it_is_back(
    monitored: tuple[Monitored, AnvilNode],
) -> None:
    stack, _node = monitored
    assert stack.worker is not None
    with (
        Receiver() as rx,
        PrometheusServer({job: [target] for job, target in stack.targets.items()}, RULES) as prom,
    ):
        tenant_id = make_tenant(stack.db).tenant_id
        stack.endpoint(tenant_id, rx.url("/hook"), ["deposit.credited"])
        # Given every process scraped, and events delivered while the worker runs
        prom.wait_for(lambda: set(prom.targets_up().values()) == {"up"}, 30, "every target up")
        first = stack.emit(tenant_id, 2)
        assert rx.wait_for(lambda r: len(r.hits("/hook")) >= 2, 20), stack.procs.logs()
        # (every metric the rules and the dashboard name is one of theirs)
        exported = set()
        for target in stack.targets.values():
            text = requests.get(f"http://{target}/metrics", timeout=10).text
            exported |= exported_names(text)
        dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
        named = {name for expr in expressions(dashboard) for name in metric_names(expr)}
        for rule in _rules():
            named |= metric_names(rule["expr"])
        assert named - PROMETHEUS_OWN - exported == set()
        assert not prom.firing("SettleDeliveryLag")

        # When the notifier worker stops and events keep coming, one a second
        stack.worker.stop()
        flowing, emitted = threading.Event(), list(first)

        def keep_emitting() -> None:
            while not flowing.wait(1.0):
                emitted.extend(stack.emit(tenant_id, 1))

        emitter = threading.Thread(target=keep_emitting, daemon=True)
        emitter.start()
        try:
            # Then the delivery-lag alert fires within its stated time
            took = prom.wait_for(
                lambda: prom.firing("SettleDeliveryLag"),
                LAG_FIRES_WITHIN_S + 30,
                "SettleDeliveryLag firing",
            )
            assert took <= LAG_FIRES_WITHIN_S, f"fired {took:.0f} s after the worker stopped"
            (alert,) = prom.alerts("SettleDeliveryLag")
            assert alert["labels"]["severity"] == "page"
            # When the worker is back
            stack.procs.restart(stack.worker)
        finally:
            flowing.set()
            emitter.join(10)
        # Then it resolves, and every event reached the receiver
        prom.wait_for(
            lambda: not prom.alerts("SettleDeliveryLag"), RESOLVES_WITHIN_S, "the alert resolved"
        )
        received = {json.loads(hit.body)["id"] for hit in rx.hits("/hook")}
        assert rx.wait_for(
            lambda r: set(emitted) <= {json.loads(h.body)["id"] for h in r.hits("/hook")}, 30
        ), f"{len(set(emitted) - received)} of {len(emitted)} events not received"


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]
