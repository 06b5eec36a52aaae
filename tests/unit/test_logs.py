"""Log lines: readable in dev, JSON in production, each carrying the request id."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest
from flask import Flask

from shared import logs
from shared.api import make_api
from shared.bus import InProcessBus, OutgoingEvent


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _app() -> Flask:
    app = Flask("logs-test")
    make_api(app, title="t", version="1", openapi_path="/v1/openapi.json")

    @app.get("/v1/ping")
    def ping() -> str:
        logging.getLogger("settle.test").info("inside the request")
        return "pong"

    return app


def test_production_lines_are_json_with_the_request_id(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("production", "INFO", out)
    answer = _app().test_client().get("/v1/ping", headers={"X-Request-Id": "req_abc-123"})
    assert answer.headers["X-Request-Id"] == "req_abc-123"
    line, access = [json.loads(x) for x in out.getvalue().splitlines()]
    assert line["message"] == "inside the request" and line["requestId"] == "req_abc-123"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
    assert (line["level"], line["logger"]) == ("INFO", "settle.test")
    # And one access line per request: method, path, status, latency, the request id
    assert re.fullmatch(r"GET /v1/ping -> 200 in \d+ ms", access["message"]), access
    assert (access["logger"], access["requestId"]) == ("settle.http", "req_abc-123")


def test_an_error_answer_logs_its_code(restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("production", "INFO", out)
    _app().test_client().get("/v1/nothing%0Ahere", headers={"X-Request-Id": "req_x"})
    (access,) = [json.loads(x) for x in out.getvalue().splitlines()]
    # The status and the error code, and a newline in the path cannot forge a line
    assert re.fullmatch(
        r"GET /v1/nothing\\x0ahere -> 400 invalid_request in \d+ ms", access["message"]
    ), access
    dev = io.StringIO()
    logs.configure("dev", "INFO", dev)
    _app().test_client().get("/v1/nothing%0Ahere")
    assert len(dev.getvalue().splitlines()) == 1


def test_the_access_line_can_be_left_to_the_server(restore_logging: None) -> None:
    # settle dev's own server logs each request (network time included): no second line
    out = io.StringIO()
    logs.configure("production", "INFO", out)
    app = _app()
    app.config[logs.ACCESS_LOG] = False
    app.test_client().get("/v1/nothing")
    assert out.getvalue() == ""


@pytest.mark.parametrize("given", ["x" * 200, "a b", "<script>", "", "évt"])
def test_an_implausible_request_id_is_replaced(given: str, restore_logging: None) -> None:
    out = io.StringIO()
    logs.configure("production", "INFO", out)
    answer = _app().test_client().get("/v1/ping", headers={"X-Request-Id": given})
    rid = answer.headers["X-Request-Id"]
    assert rid != given and rid.startswith("req_")
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [line["requestId"] for line in lines] == [rid, rid]  # its line and the access line


def test_dev_lines_have_one_timestamp_and_colour_only_on_a_terminal(
    restore_logging: None,
) -> None:
    to_file = io.StringIO()
    logs.configure("dev", "INFO", to_file)
    logging.getLogger("settle.test").warning("careful")
    assert re.fullmatch(
        r"\d\d:\d\d:\d\d\.\d{3} WARNING settle\.test  careful\n", to_file.getvalue()
    )
    to_tty = Tty()
    logs.configure("dev", "INFO", to_tty)
    logging.getLogger("settle.test").warning("careful")
    assert "\033[33m" in to_tty.getvalue()
    # Outside a request there is no id
    assert logs.request_id() is None


def test_the_in_process_bus_hands_each_event_over_in_its_request_scope() -> None:
    # Given the bus settle dev runs, and a handler noting the request id it runs under
    seen: list[str | None] = []
    bus = InProcessBus(lambda body: seen.append(logs.request_id()))
    # When the relay publishes an event a request caused and one no request did
    bus.publish_batch(
        [OutgoingEvent("evt_1", "t", b"{}", "req_abc"), OutgoingEvent("evt_2", "t", b"{}")]
    )
    # Then the handler ran under each one's id, and nothing is left bound
    assert seen == ["req_abc", None]
    assert logs.request_id() is None


def test_only_plausible_request_ids_are_kept() -> None:
    assert logs.plausible_request_id("req_abc-1:2.3") == "req_abc-1:2.3"
    assert logs.plausible_request_id("a" * 129) is None
    assert logs.plausible_request_id("bad id") is None
    assert logs.plausible_request_id(None) is None
