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


def _load(monkeypatch: pytest.MonkeyPatch, secret: str | None) -> ModuleType:
    """Load the example as `python receiver.py` would, with its variable set or not."""
    if secret is None:
        monkeypatch.delenv("SETTLE_WEBHOOK_SECRET", raising=False)
    else:
        monkeypatch.setenv("SETTLE_WEBHOOK_SECRET", secret)
    spec = importlib.util.spec_from_file_location("settle_receiver_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, str]]:
    module = _load(monkeypatch, "whsec_replaced_by_each_test")
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


@pytest.mark.parametrize("secret", [None, "", "   ", "not-a-whsec"])
def test_the_documented_receiver_refuses_to_start_without_its_secret(
    monkeypatch: pytest.MonkeyPatch, secret: str | None
) -> None:
    # Given SETTLE_WEBHOOK_SECRET unset, empty or not a secret (it used to fall back to "",
    # and then accepted a deposit.credited forged with the empty key)
    # When the example starts, Then it stops at once and says what to set
    with pytest.raises(SystemExit, match="SETTLE_WEBHOOK_SECRET"):
        _load(monkeypatch, secret)


def test_the_documented_receiver_answers_400_to_garbage_signatures(
    receiver: tuple[ModuleType, str],
) -> None:
    module, url = receiver
    module.SECRET = "whsec_the_real_one"
    body = b'{"id":"evt_forged","type":"deposit.credited"}'
    headers = signing.sign_headers([module.SECRET], body, "evt_forged", "whd_x")
    # A non-ASCII signature made verify() raise TypeError: the receiver answered 500
    for garbage in ("v1=\u00e9\u00e9", "v1=" + "\u0660" * 64):
        forged = {**headers, "x-service-signature": garbage}
        answer = requests.post(url, data=body, headers=_utf8(forged), timeout=5)
        assert answer.status_code == 400, garbage
    assert module.received == []


def _utf8(headers: dict[str, str]) -> dict[str, bytes]:
    """Header values as raw UTF-8 bytes (requests would refuse non-Latin-1 text)."""
    return {name: value.encode("utf-8") for name, value in headers.items()}
