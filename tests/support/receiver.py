"""A webhook receiver for tests: a threaded HTTP server on 127.0.0.1 with scripted answers.

    with Receiver() as rx:
        rx.script("/flaky", Answer.status(500), Answer.status(500), Answer.ok())
        url = rx.url("/flaky")
        ...
        hits = rx.wait_for(lambda r: len(r.hits("/flaky")) >= 3, timeout=10)

Each path answers its scripted answers in order, then repeats the last one
(default: 200). Every request is recorded with its raw body bytes and headers.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Answer:
    """What the receiver does with one request."""

    kind: str  # "status", "hang", "close", "redirect", "trickle", "huge"
    status: int = 200
    seconds: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    #: trickle: the status line and headers come byte by byte too.
    slow_head: bool = False
    #: huge: the body's length.
    size: int = 0

    @classmethod
    def ok(cls, status: int = 200, body: bytes = b"ok") -> Answer:
        return cls("status", status=status, body=body)

    @classmethod
    def fail(cls, status: int = 500, body: bytes = b"boom") -> Answer:
        return cls("status", status=status, body=body)

    @classmethod
    def hang(cls, seconds: float, then_status: int = 200) -> Answer:
        """Sleep before answering (longer than the sender's timeout: a timeout)."""
        return cls("hang", status=then_status, seconds=seconds)

    @classmethod
    def close(cls) -> Answer:
        """Drop the connection without any answer."""
        return cls("close")

    @classmethod
    def trickle(
        cls, every_s: float, *, headers_too: bool = True, body: bytes = b"ok" * 64
    ) -> Answer:
        """A 200 sent one byte every `every_s` seconds: from the status line on, or (with
        `headers_too=False`) the headers at once and then the body byte by byte."""
        return cls("trickle", seconds=every_s, body=body, slow_head=headers_too)

    @classmethod
    def huge(cls, size: int) -> Answer:
        """A 200 whose body is `size` bytes, sent as fast as the client reads."""
        return cls("huge", size=size)

    @classmethod
    def retry_after(cls, seconds: int, status: int = 429) -> Answer:
        return cls("status", status=status, headers=(("Retry-After", str(seconds)),))

    @classmethod
    def redirect(cls, location: str, status: int = 302) -> Answer:
        return cls("redirect", status=status, headers=(("Location", location),))


@dataclass(frozen=True)
class Hit:
    """One request as received."""

    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float  # time.time()
    answered: int | None


@dataclass
class _State:
    scripts: dict[str, list[Answer]] = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)
    closing: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def next_answer(self, path: str, event_id: str | None = None) -> Answer:
        with self.lock:
            script = self.scripts.get(f"{path}#{event_id}") or self.scripts.get(path)
            if not script:
                return Answer.ok()
            return script.pop(0) if len(script) > 1 else script[0]

    def record(self, hit: Hit) -> None:
        with self.changed:
            self.hits.append(hit)
            self.changed.notify_all()


def _event_id(body: bytes) -> str | None:
    """The `id` of a delivery's JSON body, if it has one."""
    try:
        found = json.loads(body).get("id")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_POST(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def _handle(self) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        answer = state.next_answer(path, _event_id(body))
        received = time.time()
        headers = {k.lower(): v for k, v in self.headers.items()}
        if answer.kind == "close":
            state.record(Hit(path, headers, body, received, None))
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if answer.kind == "hang":
            state.record(Hit(path, headers, body, received, None))
            state.closing.wait(answer.seconds)
        elif answer.kind in ("trickle", "huge"):
            # A trickled answer is never complete in time: the sender cuts it (not answered).
            state.record(Hit(path, headers, body, received, 200 if answer.kind == "huge" else None))
            self.close_connection = True
            with contextlib.suppress(OSError):
                if answer.kind == "trickle":
                    self._trickle(answer)
                else:
                    self._huge(answer.size)
            return
        else:
            state.record(Hit(path, headers, body, received, answer.status))
        try:
            self.send_response(answer.status)
            for name, value in answer.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            if answer.body:
                self.wfile.write(answer.body)
        except OSError:
            self.close_connection = True

    def _trickle(self, answer: Answer) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(answer.body)}\r\n\r\n".encode()
        slow = head + answer.body if answer.slow_head else answer.body
        if not answer.slow_head:
            self.wfile.write(head)
            self.wfile.flush()
        for byte in slow:
            if self.server.state.closing.wait(answer.seconds):
                return
            self.wfile.write(bytes([byte]))
            self.wfile.flush()

    def _huge(self, size: int) -> None:
        self.wfile.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = b"x" * 65536
        sent = 0
        while sent < size and not self.server.state.closing.is_set():
            part = chunk[: size - sent]
            self.wfile.write(part)
            sent += len(part)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    state: _State


def closed_port_url(path: str = "/gone") -> str:
    """A URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


class Receiver:
    """Start with `with Receiver() as rx:` (or start()/stop()); always stopped after."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port), _Handler)
        self._server.state = _State()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *answers: Answer, event_id: str | None = None) -> None:
        """Answers for `path`, in order; the last repeats. With `event_id`: for the
        requests of that event only (ahead of the path's own script)."""
        key = path if event_id is None else f"{path}#{event_id}"
        with self._server.state.lock:
            self._server.state.scripts[key] = list(answers)

    def hits(self, path: str | None = None) -> list[Hit]:
        with self._server.state.lock:
            return [h for h in self._server.state.hits if path is None or h.path == path]

    def wait_for(self, predicate: Callable[[Receiver], bool], timeout: float) -> bool:
        """Until `predicate(self)` holds (True) or `timeout` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        state = self._server.state
        while True:
            if predicate(self):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with state.changed:
                state.changed.wait(min(remaining, 0.2))

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.state.closing.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
