"""`settle listen`'s receiver: verifies each delivery, refuses forgeries, forwards byte for byte.

Real HTTP on 127.0.0.1 (the listener itself, and an app it forwards to). The whole
command against a running `settle dev` is followed in tests/e2e/test_tour.py.
"""

from __future__ import annotations

import http.server
import io
import json
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from services.listen import Printer, Receiver, _handler, describe
from shared import event_catalog, events, signing
from tests.support.receiver import Answer
from tests.support.receiver import Receiver as App

pytestmark = pytest.mark.integration

SECRET = "whsec_listen_test_secret"


@pytest.fixture
def listening() -> Iterator[tuple[Receiver, io.StringIO, str]]:
    out = io.StringIO()
    receiver = Receiver(SECRET, Printer(out, as_json=False, colour=False))
    receiver.ready.set()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver, out, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _credited() -> bytes:
    example = event_catalog.get(events.DEPOSIT_CREDITED).example
    return events.encode(example)


def test_a_genuine_delivery_is_printed_readably_and_answered_2xx(
    listening: tuple[Receiver, io.StringIO, str],
) -> None:
    _, out, url = listening
    body = _credited()
    headers = signing.sign_headers([SECRET], body, "evt_1", "whd_1")
    answer = requests.post(url, data=body, headers=headers, timeout=5)
    assert answer.status_code == 204
    line = out.getvalue()
    assert "verified" in line and "deposit.credited" in line
    assert "dep_01JD3Y9X8M2K4Q7R5T6V8W0Z1A credited" in line and "125.50 USDC" in line


@pytest.mark.parametrize(
    "forge",
    [
        lambda body: (body, signing.sign_headers(["whsec_guess"], body, "e", "d")),
        lambda body: (
            body.replace(b"125.50", b"925.50"),
            signing.sign_headers([SECRET], body, "e", "d"),
        ),
        lambda body: (
            body,
            signing.sign_headers([SECRET], body, "e", "d", timestamp=int(time.time()) - 301),
        ),
        lambda body: (body, {"Content-Type": "application/json"}),
    ],
    ids=["other secret", "altered amount", "replayed", "unsigned"],
)
def test_a_forged_delivery_is_refused_and_said_so(
    listening: tuple[Receiver, io.StringIO, str], forge: object
) -> None:
    _, out, url = listening
    body, headers = forge(_credited())  # type: ignore[operator]
    answer = requests.post(url, data=body, headers=headers, timeout=5)
    assert answer.status_code == 400
    assert "REFUSED" in out.getvalue() and "verified" not in out.getvalue()


def test_an_oversized_body_is_refused_unread(
    listening: tuple[Receiver, io.StringIO, str],
) -> None:
    _, out, url = listening
    answer = requests.post(
        url, data=b"x" * (2 * 1024 * 1024), headers={"Content-Type": "application/json"}, timeout=10
    )
    assert answer.status_code == 413
    assert "REFUSED" in out.getvalue()


def test_verified_deliveries_are_forwarded_byte_for_byte_and_the_app_answer_returned(
    listening: tuple[Receiver, io.StringIO, str],
) -> None:
    receiver, out, url = listening
    with App() as app:
        from services.listen import Forwarder

        app.script("/app", Answer.fail(500), Answer.ok(200))
        receiver.forward = Forwarder(app.url("/app"))
        body = _credited()
        headers = signing.sign_headers([SECRET], body, "evt_1", "whd_1")
        # The app fails first: Settle is told so (and would retry)
        assert requests.post(url, data=body, headers=headers, timeout=5).status_code == 500
        assert requests.post(url, data=body, headers=headers, timeout=5).status_code == 200
        hits = app.hits("/app")
        assert [h.body for h in hits] == [body, body]
        # Still verifiable by the app with the same secret
        assert signing.verify(SECRET, hits[0].headers, hits[0].body)
        # A forgery is never forwarded
        forged = signing.sign_headers(["whsec_guess"], body, "evt_1", "whd_1")
        assert requests.post(url, data=body, headers=forged, timeout=5).status_code == 400
        assert len(app.hits("/app")) == 2
    assert "forwarded: 500" in out.getvalue() and "forwarded: 200" in out.getvalue()


def test_json_lines_for_scripts() -> None:
    out = io.StringIO()
    receiver = Receiver(SECRET, Printer(out, as_json=True))
    receiver.ready.set()
    body = _credited()
    assert receiver.handle(signing.sign_headers([SECRET], body, "e", "whd_9"), body) == 204
    line = json.loads(out.getvalue())
    assert line["verified"] is True and line["deliveryId"] == "whd_9"
    assert line["event"]["type"] == "deposit.credited"


def test_each_event_type_has_a_readable_line() -> None:
    for entry in event_catalog.ENTRIES:
        text = describe(entry.example)
        assert text.startswith(f"{entry.type}  {entry.example['id']}"), text
