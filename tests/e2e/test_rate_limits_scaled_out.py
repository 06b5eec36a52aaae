"""Rate limits as deployed: two `settle core api` processes on one Redis, behind nginx.

Two API processes (gunicorn, one worker each) share the Redis on 127.0.0.1:6379 and
run with SETTLE_TRUSTED_PROXIES=1 as compose sets it; the real nginx (the ingress
template) sits in front of one of them. Clients connect from two loopback addresses
(127.0.0.2 and 127.0.0.3; 127.0.0.1 is the readiness probes'), as two machines would.
Per-IP limit: 3 at once, then one every 100 s, so a refusal lasts the test.
"""

from __future__ import annotations

import http.client
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.test_ingress import require_nginx, running_ingress
from tests.support.pipeline import isolated_database
from tests.support.processes import Api, SettleProcesses, free_port, start_api
from tests.support.services import require_service

pytestmark = pytest.mark.e2e

BURST = 3


@dataclass
class Deployment:
    first: Api
    second: Api
    ingress_port: int


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    require_service("Redis", "127.0.0.1", 6379)
    nginx = require_nginx()
    data_dir: Path = tmp_path_factory.mktemp("scaled-out")
    with isolated_database("scaled_out") as url:
        env = {
            "SETTLE_ENV": "dev",
            "SETTLE_DATABASE_URL": url,
            "SETTLE_DATA_DIR": str(data_dir),
            "SETTLE_SECRET_KEY": "e2e-scaled-out-secret-key",
            "SETTLE_AMQP_URL": "",
            "SETTLE_REDIS_URL": "redis://127.0.0.1:6379/0",
            "SETTLE_REDIS_PREFIX": f"settle-test:{uuid.uuid4().hex}:",
            "SETTLE_TRUSTED_PROXIES": "1",
            "SETTLE_RATE_LIMIT_PER_IP": "0.01",
            "SETTLE_RATE_LIMIT_PER_IP_BURST": str(BURST),
            "SETTLE_RATE_LIMIT_PER_KEY": "0",
        }
        with SettleProcesses(env) as procs:
            first = start_api(procs, "core", "/v1/status", name="core-api-1")
            second = start_api(procs, "core", "/v1/status", name="core-api-2")
            notifier = f"127.0.0.1:{free_port()}"  # not asked in these tests
            with running_ingress(nginx, f"127.0.0.1:{first.port}", notifier) as ingress:
                yield Deployment(first, second, ingress.port)


def get(port: int, path: str, source: str = "127.0.0.1", **headers: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_two_api_processes_spend_one_budget(deployment: Deployment) -> None:
    # Given one client (as named by the proxy in front) asking both API processes in
    # turn, as a load balancer would send it
    client = "198.51.100.7"
    ports = [deployment.first.port, deployment.second.port] * 3
    statuses = [get(port, "/v1/chains", **{"X-Forwarded-For": client}) for port in ports]
    # Then the burst is spent once across both, not once each
    assert statuses == [200] * BURST + [429] * (len(ports) - BURST)


def test_two_clients_behind_nginx_get_separate_buckets(deployment: Deployment) -> None:
    port = deployment.ingress_port
    # Given client A spending its burst through the ingress (claiming, in vain, to be
    # someone else: nginx appends the address it saw, and only that one is trusted)
    spoofed = {"X-Forwarded-For": "203.0.113.50"}
    a = [get(port, "/v1/chains", "127.0.0.2", **spoofed) for _ in range(BURST + 1)]
    assert a == [200] * BURST + [429]
    # Then client B, on another address, still has its whole budget
    b = [get(port, "/v1/chains", "127.0.0.3") for _ in range(BURST + 1)]
    assert b == [200] * BURST + [429]
    # And A is still refused
    assert get(port, "/v1/chains", "127.0.0.2") == 429
