"""Log lines for people (dev) and for machines (production), and the request id.

- dev: `12:04:31.207 INFO  settle.http  POST /v1/deposit-accounts -> 200 in 14 ms [req]`:
  one timestamp, colour only when the stream is a terminal.
- production: one JSON object per line (`time`, `level`, `logger`, `message`, the
  request id when there is one, `exc` for a traceback), for a log pipeline.

Every API request gets an id: the ingress's `X-Request-Id` when it looks like one
(nginx passes the client's or makes one), otherwise a new one. It is returned in the
response's `X-Request-Id` and carried by every log line written while the request runs,
and beyond it: the outbox row of each event the request wrote keeps it, the relay sends
it as the message's AMQP `correlation_id`, the notifier stores it with the event, and
each delivery attempt of the event logs under it (`request_scope`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from shared.ids import new_id

if TYPE_CHECKING:
    from flask import Flask, Response

REQUEST_ID_HEADER = "X-Request-Id"
#: What the ingress accepts as a client's id (deploy/README.md); anything else is replaced.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

_current: ContextVar[str | None] = ContextVar("settle_request_id", default=None)


def request_id() -> str | None:
    """The id of the request being served on this thread, if any."""
    return _current.get()


def plausible_request_id(value: object) -> str | None:
    """`value` if it is a request id as the ingress accepts them, else None."""
    return value if isinstance(value, str) and _REQUEST_ID.match(value) else None


@contextmanager
def request_scope(rid: str | None) -> Iterator[None]:
    """Log lines written inside carry `rid` (work done for a request, after it: the
    notifier storing its events, a worker attempting its deliveries)."""
    token = _current.set(rid)
    try:
        yield
    finally:
        _current.reset(token)


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _current.get()
        return True


_COLOURS = {"WARNING": "33", "ERROR": "31", "CRITICAL": "31;1", "DEBUG": "2"}


class DevFormatter(logging.Formatter):
    """`HH:MM:SS.mmm LEVEL logger  message [request id]`; ANSI colour only on a terminal."""

    def __init__(self, *, colour: bool) -> None:
        super().__init__()
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        level = f"{record.levelname:<5}"
        if self.colour and record.levelname in _COLOURS:
            level = f"\033[{_COLOURS[record.levelname]}m{level}\033[0m"
        line = f"{clock}.{int(record.msecs):03d} {level} {record.name}  {record.getMessage()}"
        rid = getattr(record, "request_id", None)
        if rid:
            line += f" [{rid}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record (UTC timestamp with milliseconds)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC)
        body: dict[str, Any] = {
            "time": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            body["requestId"] = rid
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is at the time (tests swap it; a daemon may too)."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure(mode: str, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every logger's records to one handler (stderr unless `stream`): JSON in production.

    Replaces a handler an earlier call installed; others (a test runner's) are kept.
    """
    handler: logging.Handler = logging.StreamHandler(stream) if stream else _StderrHandler()
    shown_on = stream or sys.stderr
    if mode == "production":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(DevFormatter(colour=shown_on.isatty()))
    handler.addFilter(_RequestIdFilter())
    handler._settle = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not getattr(h, "_settle", False)]
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def unconfigure() -> None:
    """Remove the handler `configure` installed (a command ran in-process, e.g. in a test)."""
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not getattr(h, "_settle", False)]


#: app.config key: False when the server logs each request itself (settle dev's does).
ACCESS_LOG = "settle.access_log"

_access = logging.getLogger("settle.http")


def _printable(text: str) -> str:
    """`text` with control characters escaped: a path cannot start a forged log line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def install_request_id(app: Flask) -> None:
    """Give each request an id (the ingress's, when valid), return it, and log one access
    line per request (`GET /v1/chains -> 200 in 3 ms`, the error code after the status)."""
    from flask import g, request

    @app.before_request
    def _bind() -> None:
        g.settle_started = time.perf_counter()
        given = request.headers.get(REQUEST_ID_HEADER, "")
        rid = given if _REQUEST_ID.match(given) else new_id("req")
        g.settle_request_id = rid
        g.settle_request_token = _current.set(rid)

    @app.after_request
    def _answer(response: Response) -> Response:
        rid = g.get("settle_request_id")
        if rid:
            response.headers[REQUEST_ID_HEADER] = rid
        if app.config.get(ACCESS_LOG, True) and _access.isEnabledFor(logging.INFO):
            _log_access(request.method, request.path, response, g.get("settle_started"))
        return response

    @app.teardown_request
    def _unbind(exc: BaseException | None) -> None:
        token = g.pop("settle_request_token", None)
        if token is not None:
            _current.reset(token)


def _log_access(method: str, path: str, response: Response, started: float | None) -> None:
    took = (time.perf_counter() - started) * 1000 if started is not None else 0.0
    code = ""
    if response.status_code >= 400 and response.is_json:
        body = response.get_json(silent=True)
        if isinstance(body, dict) and isinstance(body.get("code"), str):
            code = f" {_printable(body['code'])}"
    _access.info(
        "%s %s -> %d%s in %.0f ms",
        method,
        _printable(path),
        response.status_code,
        code,
        took,
    )
