"""A threaded JSON-RPC-over-HTTP server on 127.0.0.1 (a free port) for test nodes.

    server = JsonRpcServer(answer)   # answer(call: dict) -> response dict
    with server:
        url = server.url

Batches are answered call by call. Keep-alive connections, as real nodes allow.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any

Answer = Callable[[Any], dict[str, Any]]


class JsonRpcServer:
    """Serves `answer` until stopped."""

    def __init__(self, answer: Answer) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.answer = answer
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> JsonRpcServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def __enter__(self) -> JsonRpcServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    answer: Answer


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length))
        except ValueError:
            body: Any = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32700, "message": "parse"},
            }
        else:
            answer = self.server.answer
            body = [answer(c) for c in request] if isinstance(request, list) else answer(request)
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass
