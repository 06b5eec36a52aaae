"""docs/examples/receiver.py, the ten-line receiver of docs/WEBHOOKS.md, verifies real
deliveries made by the engine, and refuses forged ones."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import requests
from werkzeug.serving import make_server

from shared import signing
from tests.integration.test_embedded_engine import Embedded, _tenant, embedded  # noqa: F401

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "receiver.py"


@pytest.fixture
def receiver() -> Iterator[tuple[ModuleType, str]]:
    spec = importlib.util.spec_from_file_location("settle_receiver_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = make_server("127.0.0.1", 0, module.app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield module, f"http://127.0.0.1:{server.server_port}/hook"
    finally:
        server.shutdown()
        thread.join(5)


def test_the_documented_receiver_verifies_a_real_delivery(
    embedded: Embedded,  # noqa: F811
    receiver: tuple[ModuleType, str],
) -> None:
    module, url = receiver
    # Given an endpoint pointed at the example, configured with the secret shown at creation
    tenant_id = _tenant(embedded.db)
    module.SECRET = embedded.endpoint(tenant_id, url)
    # When core emits an event
    event_id = embedded.emit(tenant_id)
    # Then the example verified the signature and kept the event
    deadline = time.monotonic() + 15
    while not module.received and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [e["id"] for e in module.received] == [event_id]
    assert module.received[0]["tenantId"] == tenant_id


def test_the_documented_receiver_refuses_a_forged_delivery(
    receiver: tuple[ModuleType, str],
) -> None:
    module, url = receiver
    module.SECRET = "whsec_the_real_one"
    body = b'{"id":"evt_forged","type":"deposit.credited"}'
    headers = signing.sign_headers(["whsec_a_guess"], body, "evt_forged", "whd_x")
    answer = requests.post(url, data=body, headers=headers, timeout=5)
    assert answer.status_code == 400
    # A replayed old delivery (signed correctly, stale timestamp) is refused too
    stale = signing.sign_headers(
        [module.SECRET], body, "evt_forged", "whd_x", timestamp=int(time.time()) - 301
    )
    assert requests.post(url, data=body, headers=stale, timeout=5).status_code == 400
    assert module.received == []
