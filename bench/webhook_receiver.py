"""A lean webhook receiver for the benchmark, run as its own process.

    python bench/webhook_receiver.py            # prints its port, then serves

POST any path: answers 200 at once and notes (path, event id, receipt time).
GET /_stats: JSON `{"counts": {path: n}, "hits": {event_id: [t, ...]}}`.
GET /_count: JSON `{"events": <distinct event ids received>}` (cheap, for polling).
GET /_reset: forget everything.
"""

from __future__ import annotations

import http.server
import json
import re
import sys
import threading
import time
from collections import defaultdict

_ID = re.compile(rb'"id":"([^"]+)"')


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = defaultdict(int)
        self.hits: dict[str, list[float]] = defaultdict(list)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        now = time.time()
        match = _ID.search(body)
        state = self.server.state
        with state.lock:
            state.counts[self.path] += 1
            if match and self.path != "/bare":
                state.hits[match.group(1).decode()].append(now)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_GET(self) -> None:
        state = self.server.state
        with state.lock:
            if self.path == "/_reset":
                state.counts.clear()
                state.hits.clear()
                payload = b"{}"
            elif self.path == "/_count":
                payload = json.dumps({"events": len(state.hits)}).encode()
            else:
                payload = json.dumps({"counts": state.counts, "hits": state.hits}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    state: _State


def main() -> None:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = _State()
    sys.stdout.write(f"{server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever(poll_interval=0.2)


if __name__ == "__main__":
    main()
