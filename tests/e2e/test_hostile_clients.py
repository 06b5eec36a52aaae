"""Hostile clients against the API processes started as in production: none crashes a worker.

`settle core api` and `settle notifier api` run under gunicorn (one worker process
each, so its pid tells whether it survived) and `settle dev` runs embedded, all on
free loopback ports. A 200 KB body of nested brackets once killed a gunicorn worker
per request (web3 raised the recursion limit to 100000, so the JSON parser overflowed
the C stack) and `settle dev` with it; the notifier answered 500.
"""

from __future__ import annotations

import http.client
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shared.db import Database
from tests.conftest import TenantKeys, make_tenant
from tests.support.pipeline import isolated_database
from tests.support.processes import Api, SettleProcesses, free_port, start_api, wait_answering

pytestmark = pytest.mark.e2e

#: 100,000 levels: the 200 KB body of the report.
DEPTH = 100_000
NESTED_ARRAYS = b"[" * DEPTH + b"]" * DEPTH
NESTED_OBJECTS = b'{"a":' * (DEPTH // 5) + b"1" + b"}" * (DEPTH // 5)


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Answer(response.status, response.headers, response.read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with isolated_database("hostile") as url:
        yield url


@pytest.fixture(scope="module")
def procs(url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SettleProcesses]:
    data_dir = tmp_path_factory.mktemp("hostile-data")
    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": url,
        "SETTLE_DATA_DIR": str(data_dir),
        "SETTLE_SECRET_KEY": "e2e-hostile-clients-secret-key",
    }
    for name in ("SETTLE_AMQP_URL", "SETTLE_REDIS_URL"):
        env[name] = ""
    with SettleProcesses(env) as procs:
        yield procs


@pytest.fixture(scope="module")
def core_api(procs: SettleProcesses) -> Api:
    return start_api(procs, "core", "/v1/status")


@pytest.fixture(scope="module")
def notifier_api(procs: SettleProcesses) -> Api:
    return start_api(procs, "notifier", "/v1/notifier/status")


@pytest.fixture(scope="module")
def tenant(url: str) -> Iterator[TenantKeys]:
    db = Database(url)
    try:
        yield make_tenant(db)
    finally:
        db.dispose()


JSON = {"Content-Type": "application/json"}


def assert_invalid_json(answer: Answer) -> None:
    assert answer.status == 400, (answer.status, answer.body[:500])
    body = answer.json()
    assert body["code"] == "invalid_json", body
    assert body["error"].startswith("invalid_json: "), body


def assert_survived(api: Api, workers: set[int]) -> None:
    """The same worker process answers the next request."""
    assert request(api.port, "GET", api.status_path).status == 200
    assert api.workers() == workers, "a gunicorn worker died and was replaced"
    assert api.process.running


@pytest.mark.parametrize("body", [NESTED_ARRAYS, NESTED_OBJECTS], ids=["arrays", "objects"])
def test_nested_json_to_sign_in_is_400_and_the_core_worker_survives(
    core_api: Api, body: bytes
) -> None:
    # Given core's API under gunicorn with one worker
    workers = core_api.workers()
    assert len(workers) == 1
    # When an anonymous client signs in with 200 KB of nested brackets, three times
    for _ in range(3):
        assert_invalid_json(request(core_api.port, "POST", "/v1/sessions", body, JSON))
    # Then the same worker answers the next request
    assert_survived(core_api, workers)


def test_nested_json_to_every_core_body_route_is_400(core_api: Api, tenant: TenantKeys) -> None:
    workers = core_api.workers()
    headers = {**JSON, **tenant.headers}
    for method, path in (
        ("POST", "/v1/deposit-accounts"),
        ("PUT", "/v1/destination-policy"),
        ("POST", "/v1/fee-preview"),
        ("POST", "/v1/sandbox/deposits"),
        ("PATCH", "/v1/deposit-accounts/someone/destination"),
    ):
        assert_invalid_json(request(core_api.port, method, path, NESTED_ARRAYS, headers))
    assert_survived(core_api, workers)


def test_nested_json_to_the_notifier_is_400_and_its_worker_survives(
    notifier_api: Api, tenant: TenantKeys
) -> None:
    workers = notifier_api.workers()
    headers = {**JSON, **tenant.headers}
    for body in (NESTED_ARRAYS, NESTED_OBJECTS):
        answer = request(notifier_api.port, "POST", "/v1/webhook-endpoints", body, headers)
        assert_invalid_json(answer)
        answer = request(
            notifier_api.port,
            "POST",
            "/v1/webhook-endpoints/we_1/rotate-secret",
            body,
            {**headers, "Idempotency-Key": f"nested-{len(body)}-{body[:1]!r}"},
        )
        assert answer.status in (400, 404), answer.body[:300]
    assert_survived(notifier_api, workers)


def test_double_slashes_are_json_404_never_a_redirect(core_api: Api, notifier_api: Api) -> None:
    for api, path in (
        (core_api, "/v1//chains"),
        (core_api, "//v1/chains"),
        (core_api, "/%2Fv1/chains"),
        (core_api, "/v1/deposit-accounts//x"),
        (notifier_api, "/v1//webhook-endpoints"),
        (notifier_api, "/v1/notifier//status"),
    ):
        answer = request(api.port, "GET", path, headers={"Host": "evil.example"})
        assert answer.status == 404, (path, answer.status, answer.headers.get("Location"))
        assert answer.headers.get("Location") is None
        assert answer.headers["Content-Type"] == "application/json"
        assert answer.json()["code"] == "not_found"


@pytest.fixture
def dev_data_dir() -> Iterator[Path]:
    """A data dir the embedded PostgreSQL's own user can reach (as root, pgserver runs
    it as another user, who cannot enter pytest's private temp folders)."""
    folder = Path(tempfile.mkdtemp(prefix="settle-hostile-dev-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_settle_dev_survives_nested_json(procs: SettleProcesses, dev_data_dir: Path) -> None:
    # Given `settle dev` (everything in one process, the chain pipeline included)
    port = free_port()
    env = {"SETTLE_DATA_DIR": str(dev_data_dir), "SETTLE_DATABASE_URL": ""}
    dev = procs.start("dev", "dev", "--port", str(port), env=env, wait=False)
    try:
        # Longer than an API: a first start creates the embedded PostgreSQL's cluster.
        wait_answering(dev, port, "/v1/status", timeout_s=180)
        # When an anonymous client sends nested brackets to sign-in and to a notifier route
        assert_invalid_json(request(port, "POST", "/v1/sessions", NESTED_ARRAYS, JSON))
        assert_invalid_json(request(port, "POST", "/v1/sessions", NESTED_OBJECTS, JSON))
        answer = request(port, "POST", "/v1/webhook-endpoints", NESTED_ARRAYS, JSON)
        assert answer.status in (400, 401), answer.body[:300]
        # Then the process is alive and answers, and `//` is a JSON 404 there too
        assert dev.running, dev.output()[-3000:]
        assert request(port, "GET", "/v1/chains").status == 200
        answer = request(port, "GET", "/v1//chains", headers={"Host": "evil.example"})
        assert answer.status == 404 and answer.headers.get("Location") is None
    finally:
        dev.stop()  # before its data dir goes
