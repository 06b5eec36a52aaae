"""The ingress: the real nginx binary, run with deploy/nginx/settle.conf.template.

Two tiny HTTP servers stand in for core and the notifier; each answers with what it
received, so the tests see which service a path reached and with which headers.
nginx runs in the foreground as a child of the test, on free loopback ports, with its
pid and temp files in a temporary directory, and is stopped (whole process group) at
the end. Without nginx on the machine the tests skip; in CI (`CI` set) they fail.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.tls import self_signed

ROOT = Path(__file__).resolve().parents[2]


def _load_render() -> ModuleType:
    """deploy/nginx/render.py (not a package), under a name of its own."""
    name = "settle_nginx_render"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "deploy/nginx/render.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


render = _load_render()

pytestmark = pytest.mark.e2e

NOT_FOUND = {"error": "not_found: no such route", "code": "not_found"}
TOO_LARGE = {"error": "payload_too_large: body exceeds 256 KiB", "code": "payload_too_large"}
START_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0


def find_nginx() -> str | None:
    # Debian installs it in /usr/sbin, which a non-root PATH may lack.
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)),
        None,
    )


def require_nginx() -> str:
    nginx = find_nginx()
    if nginx is None:
        reason = "nginx is not installed (apt-get install nginx-light) — ingress tests need it"
        if os.environ.get("CI"):
            pytest.fail(f"CI: {reason}; .ci/run must install it", pytrace=False)
        pytest.skip(reason)
    return nginx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the stand-in services ---------------------------------------------------------


@dataclass
class Upstream:
    service: str
    server: ThreadingHTTPServer
    thread: threading.Thread
    #: (client port, path) of every request, in order: the client port tells connections apart.
    seen: list[tuple[int, str]] = field(default_factory=list)

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=STOP_TIMEOUT_S)


class EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as nginx's upstream keepalive needs
    disable_nagle_algorithm = True
    timeout = 10  # bounds a keep-alive connection left idle
    upstream: Upstream

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self) -> None:
        body = self._body()
        self.upstream.seen.append((self.client_address[1], self.path))
        payload = {
            "service": self.upstream.service,
            "method": self.command,
            "path": self.path,
            "host": self.headers.get("Host"),
            "xff": self.headers.get("X-Forwarded-For"),
            "proto": self.headers.get("X-Forwarded-Proto"),
            "requestId": self.headers.get("X-Request-Id"),
            "connection": self.headers.get("Connection"),
            "bodyBytes": len(body),
        }
        data = json.dumps(payload).encode()
        status = 200
        if "respond=" in self.path:  # ?respond=NNN: answer with that status
            status = int(self.path.split("respond=")[1][:3])
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Request-Id", "set-by-upstream")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # nginx hanging up mid-request (the 413 tests) is expected here


def start_upstream(service: str) -> Upstream:
    handler = type(f"{service}Handler", (EchoHandler,), {})
    server = QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    upstream = Upstream(service, server, thread)
    handler.upstream = upstream
    thread.start()
    return upstream


# --- nginx ---------------------------------------------------------------------------


@dataclass
class Ingress:
    port: int
    proc: subprocess.Popen[bytes]
    run_dir: Path
    #: The HTTPS port; its certificate (self-signed, its own CA) is run_dir/fullchain.pem.
    tls_port: int = 0

    @property
    def ca_file(self) -> Path:
        return self.run_dir / "fullchain.pem"

    def log(self) -> str:
        path = self.run_dir / "nginx.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: nginx's fast shutdown, workers included
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        # nginx runs in its own session: whatever of it is left (a worker whose master
        # died first) goes with the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=STOP_TIMEOUT_S)


def start_ingress(nginx: str, core: str, notifier: str, *, https_redirect: bool = False) -> Ingress:
    """nginx on free loopback ports: plain HTTP (served, or redirected to HTTPS with
    `https_redirect`) and HTTPS with a self-signed certificate."""
    run_dir = Path(tempfile.mkdtemp(prefix="settle-nginx-"))
    # As root, nginx's workers run as an unprivileged user: they must reach the temp dirs.
    run_dir.chmod(0o755)
    cert, key = self_signed(run_dir)
    try:
        for _attempt in range(3):  # the free port may be taken between probe and bind
            port, tls_port = free_port(), free_port()
            conf = run_dir / "nginx.conf"
            text = render.render(
                render.TEMPLATE.read_text(encoding="utf-8"),
                {
                    "CORE_UPSTREAM": core,
                    "NOTIFIER_UPSTREAM": notifier,
                    "LISTEN_PORT": f"127.0.0.1:{port}",
                    "TLS_LISTEN": f"127.0.0.1:{tls_port}",
                    "TLS_CERT": str(cert),
                    "TLS_KEY": str(key),
                    "HTTPS_REDIRECT": "1" if https_redirect else "0",
                    "PUBLIC_HTTPS_PORT": str(tls_port),
                    "NGINX_RUN_DIR": str(run_dir),
                },
            )
            assert render.unfilled(text) == []
            conf.write_text(text, encoding="utf-8")
            with (run_dir / "nginx.log").open("ab") as log:
                argv = [nginx, "-p", str(run_dir), "-e", "stderr", "-c", str(conf)]
                proc = subprocess.Popen(
                    [*argv, "-g", "daemon off;"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            ingress = Ingress(port, proc, run_dir, tls_port)
            if _wait_listening(ingress):
                return ingress
            ingress.stop()
            if "Address already in use" not in ingress.log():
                break
        raise AssertionError(f"nginx did not start:\n{ingress.log()}")
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _wait_listening(ingress: Ingress) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if ingress.proc.poll() is not None:
            return False
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", ingress.port), timeout=0.2),
        ):
            return True
        time.sleep(0.02)
    return False


@contextlib.contextmanager
def running_ingress(
    nginx: str, core: str, notifier: str, *, https_redirect: bool = False
) -> Iterator[Ingress]:
    ingress = start_ingress(nginx, core, notifier, https_redirect=https_redirect)
    try:
        yield ingress
    finally:
        ingress.stop()
        shutil.rmtree(ingress.run_dir, ignore_errors=True)


@dataclass
class Stack:
    ingress: Ingress
    core: Upstream
    notifier: Upstream


@pytest.fixture(scope="module")
def nginx_bin() -> str:
    return require_nginx()


@pytest.fixture(scope="module")
def stack(nginx_bin: str) -> Iterator[Stack]:
    core, notifier = start_upstream("core"), start_upstream("notifier")
    try:
        with running_ingress(nginx_bin, core.address, notifier.address) as ingress:
            yield Stack(ingress, core, notifier)
    finally:
        core.stop()
        notifier.stop()


# --- a raw client (no URL normalisation: paths go out exactly as written) -----------


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def send(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    conn: http.client.HTTPConnection | None = None,
) -> Reply:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        if own:
            conn.close()


def get(stack: Stack, path: str, **kw: Any) -> Reply:
    return send(stack.ingress.port, "GET", path, **kw)


# --- routing -------------------------------------------------------------------------

NOTIFIER_PATHS = [
    "/v1/webhook-endpoints",
    "/v1/webhook-endpoints/",
    "/v1/webhook-endpoints/we_1",
    "/v1/webhook-endpoints/we_1/rotate-secret",
    "/v1/webhook-deliveries",
    "/v1/webhook-deliveries?status=failed",
    "/v1/webhook-deliveries/wd_1/replay",
    "/v1/notifier/openapi.json",
    "/v1/notifier/status",
]

CORE_PATHS = [
    "/v1",
    "/v1/",
    "/v1/chains",
    "/v1/chains?chainId=8453&asset=USDC",
    "/v1/deposit-accounts/u1",
    "/v1/openapi.json",
    "/v1/status",
    "/v1/webhook-endpointsX",
    "/v1/webhook-endpoints-old/x",
    "/v1/webhook-deliveriesX",
    "/v1/webhook",
    "/v1/notifier",
    "/v1/notifierX/openapi.json",
    "/v1/notifications",
]

#: The portal's pages (and `/`, which redirects to them): core serves them.
PORTAL_PATHS = ["/", "/portal", "/portal/", "/portal/link", "/portal/static/js/app.js"]

NGINX_404_PATHS = [
    "/metrics",
    "/metrics/",
    "/metrics?name=x",
    "/other",
    "/v1x",
    "/v10/chains",
    "/V1/chains",
    "/v1/metrics",
    "/v1/notifier/metrics",
    "/openapi.json",
    "/webhook-endpoints",
    "/portalX",
    "/portal-admin/",
    "/PORTAL/",
]


@pytest.mark.parametrize("path", NOTIFIER_PATHS)
def test_notifier_paths_reach_the_notifier(stack: Stack, path: str) -> None:
    reply = get(stack, path)
    assert reply.status == 200, reply.body
    assert reply.json()["service"] == "notifier"
    assert reply.json()["path"] == path  # unchanged, query string included


@pytest.mark.parametrize("path", CORE_PATHS)
def test_other_v1_paths_reach_core(stack: Stack, path: str) -> None:
    reply = get(stack, path)
    assert reply.status == 200, reply.body
    assert reply.json()["service"] == "core"
    assert reply.json()["path"] == path


@pytest.mark.parametrize("path", PORTAL_PATHS)
def test_the_portal_reaches_core(stack: Stack, path: str) -> None:
    reply = get(stack, path)
    assert reply.status == 200, reply.body
    assert reply.json()["service"] == "core"
    assert reply.json()["path"] == path


@pytest.mark.parametrize("path", NGINX_404_PATHS)
def test_paths_outside_the_api_are_404_json_from_nginx(stack: Stack, path: str) -> None:
    before = len(stack.core.seen) + len(stack.notifier.seen)
    reply = get(stack, path)
    assert reply.status == 404
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.json() == NOT_FOUND
    assert len(stack.core.seen) + len(stack.notifier.seen) == before  # nobody was asked


@pytest.mark.parametrize(
    "path",
    [
        "/metrics/..%2Fv1/chains",
        "/metrics/%2e%2e/v1/chains",
        "/v1/chains/../../metrics",
        "/v1/notifier/./openapi.json",
        "/v1/webhook-endpoints/..",
    ],
)
def test_dot_segments_are_refused(stack: Stack, path: str) -> None:
    # nginx matches locations on the normalised path but forwards the raw one.
    reply = get(stack, path)
    assert reply.status == 400
    assert reply.json()["code"] == "invalid_request"


def test_methods_and_bodies_pass_through(stack: Stack) -> None:
    body = json.dumps({"url": "https://example.test/hook"}).encode()
    reply = send(
        stack.ingress.port,
        "POST",
        "/v1/webhook-endpoints/we_1/rotate-secret?dry=1",
        body=body,
        headers={"Content-Type": "application/json"},
    )
    got = reply.json()
    assert (got["service"], got["method"], got["bodyBytes"]) == ("notifier", "POST", len(body))
    assert got["path"] == "/v1/webhook-endpoints/we_1/rotate-secret?dry=1"
    reply = send(stack.ingress.port, "DELETE", "/v1/deposit-accounts/u1")
    assert (reply.json()["service"], reply.json()["method"]) == ("core", "DELETE")


# --- headers -------------------------------------------------------------------------


def test_forwarded_headers(stack: Stack) -> None:
    got = get(stack, "/v1/chains", headers={"Host": "api.settle.test:8443"}).json()
    assert got["host"] == "api.settle.test:8443"  # the client's Host, port included
    assert got["xff"] == "127.0.0.1"
    assert got["proto"] == "http"
    assert got["connection"] is None  # Connection: "" (upstream keep-alive)

    got = get(stack, "/v1/notifier/x", headers={"X-Forwarded-For": "203.0.113.7"}).json()
    assert got["xff"] == "203.0.113.7, 127.0.0.1"  # appended: the last hop is nginx's peer


def test_request_id_generated_or_kept(stack: Stack) -> None:
    reply = get(stack, "/v1/chains")
    generated = reply.json()["requestId"]
    assert len(generated) == 32 and int(generated, 16) >= 0  # nginx's $request_id
    assert reply.headers.get_all("X-Request-Id") == [generated]  # one, the same

    reply = get(stack, "/v1/webhook-endpoints", headers={"X-Request-Id": "req_abc-123"})
    assert reply.json()["requestId"] == "req_abc-123"
    assert reply.headers["X-Request-Id"] == "req_abc-123"

    odd = "x" * 200  # not a plausible id: replaced
    replaced = get(stack, "/v1/chains", headers={"X-Request-Id": odd}).json()["requestId"]
    assert replaced != odd and len(replaced) == 32

    # nginx's own answers carry it too
    assert get(stack, "/metrics").headers["X-Request-Id"]


def test_no_server_version(stack: Stack) -> None:
    reply = get(stack, "/other")
    assert reply.headers["Server"] == "nginx"


def test_upstream_connections_are_reused(stack: Stack) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", stack.ingress.port, timeout=5)
    try:
        start = len(stack.core.seen)
        for i in range(8):
            assert send(stack.ingress.port, "GET", f"/v1/chains?i={i}", conn=conn).status == 200
    finally:
        conn.close()
    ports = {port for port, _ in stack.core.seen[start:]}
    assert len(ports) == 1, f"8 requests used {len(ports)} upstream connections"


# --- limits and nginx's own errors ---------------------------------------------------


def test_body_up_to_256_kib_passes(stack: Stack) -> None:
    body = b"x" * (256 * 1024)
    reply = send(stack.ingress.port, "POST", "/v1/deposit-accounts", body=body)
    assert reply.status == 200
    assert reply.json()["bodyBytes"] == len(body)


def test_body_over_256_kib_is_413_json(stack: Stack) -> None:
    before = len(stack.core.seen)
    reply = send(stack.ingress.port, "POST", "/v1/deposit-accounts", body=b"x" * (300 * 1024))
    assert reply.status == 413
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.json() == TOO_LARGE
    assert len(stack.core.seen) == before


def _chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
    while total > 0:
        yield b"x" * min(size, total)
        total -= size


def send_chunked(port: int, path: str, total: int) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", path, body=_chunks(total), encode_chunked=True)
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        conn.close()


def test_chunked_bodies_pass_through_and_are_limited_too(stack: Stack) -> None:
    # No Content-Length: nginx reads the chunked body whole (proxy_request_buffering on)
    # and counts as it goes.
    reply = send_chunked(stack.ingress.port, "/v1/webhook-endpoints", 100 * 1024)
    assert reply.status == 200
    assert reply.json()["bodyBytes"] == 100 * 1024
    reply = send_chunked(stack.ingress.port, "/v1/webhook-endpoints", 300 * 1024)
    assert reply.status == 413
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.json() == TOO_LARGE


def test_malformed_request_is_400_json(stack: Stack) -> None:
    with socket.create_connection(("127.0.0.1", stack.ingress.port), timeout=5) as s:
        s.sendall(b"GET /v1/chains HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["code"] == "invalid_request"


def test_upstream_down_is_502_json(nginx_bin: str) -> None:
    live = start_upstream("core")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    try:
        with running_ingress(nginx_bin, live.address, dead) as ingress:
            reply = send(ingress.port, "GET", "/v1/webhook-endpoints")
            assert reply.status == 502
            assert reply.headers["Content-Type"] == "application/json"
            got = reply.json()
            assert got["code"] == "upstream_unavailable"
            assert got["error"].startswith("upstream_unavailable: ")
            assert reply.headers["X-Request-Id"]
            # the other service is unaffected
            assert send(ingress.port, "GET", "/v1/chains").json()["service"] == "core"
    finally:
        live.stop()


@pytest.mark.parametrize("status", [404, 413, 502, 503, 504])
def test_a_services_own_errors_pass_through(stack: Stack, status: int) -> None:
    # Only nginx's own failures become its error pages: core's degraded /v1/status (503)
    # or its own 404 reach the client as the service wrote them.
    reply = get(stack, f"/v1/status?respond={status}")
    assert reply.status == status
    assert reply.json()["service"] == "core"


def test_template_keeps_nginx_variables() -> None:
    text = render.render(
        render.TEMPLATE.read_text(encoding="utf-8"),
        {"CORE_UPSTREAM": "c:1", "NOTIFIER_UPSTREAM": "n:2", "LISTEN_PORT": "8080"},
    )
    assert render.unfilled(text) == sorted(
        {
            "NGINX_RUN_DIR",
            "TLS_LISTEN",
            "TLS_CERT",
            "TLS_KEY",
            "HTTPS_REDIRECT",
            "PUBLIC_HTTPS_PORT",
        }
    )
    for var in ("$host", "$request_id", "$proxy_add_x_forwarded_for", "$scheme", "$http_host"):
        assert var in text
    with pytest.raises(ValueError):
        render.render("${A}", {"A": "x; include /etc/passwd"})


def test_render_cli(tmp_path: Path) -> None:
    script = str(ROOT / "deploy/nginx/render.py")
    args = ["--core", "127.0.0.1:8000", "--notifier", "127.0.0.1:8001", "--port", "8080"]
    args += ["--tls-port", "8443", "--tls-cert", "tls/a.pem", "--tls-key", "tls/b.pem"]
    out = subprocess.run(
        [sys.executable, script, *args, "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "server 127.0.0.1:8000;" in out and "server 127.0.0.1:8001;" in out
    assert "listen 8080 default_server;" in out
    assert "listen 8443 ssl default_server;" in out
    assert "return 308 https://$host:8443$request_uri;" in out
    assert f"pid {tmp_path}/nginx.pid;" in out
    assert render.unfilled(out) == []


#: Request targets nginx's own parser refuses or cannot route (issue 23: `/v1/../../x`
#: answered nginx's HTML 500 page), control characters and spaces among them.
MALFORMED = [
    b"/v1/../../x",
    b"/../x",
    b"/v1/%2e%2e/%2e%2e/x",
    b"/v1/chains/%00",
    b"/v1/%",
    b"/v1/chains%",
    b"/%zz",
    b"/v1/\x00",
    b"/v1/\x01",
    b"/v1/\x7f",
    b"/v1/a b",
    b"/v1/" + b"a" * 9000,
    b"x",
    b"*",
]


def raw_request(port: int, target: bytes) -> tuple[int, dict[str, str], bytes]:
    """GET `target` written into the request line as it is (no client cleans it up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("target", MALFORMED, ids=lambda t: repr(t[:20]))
def test_malformed_paths_answer_the_json_error_format(stack: Stack, target: bytes) -> None:
    before = len(stack.core.seen) + len(stack.notifier.seen)
    status, headers, body = raw_request(stack.ingress.port, target)
    assert 400 <= status < 500, (status, body[:300])
    assert headers["content-type"] == "application/json", body[:300]
    answer = json.loads(body)
    assert answer["code"] in ("invalid_request", "not_found"), answer
    assert answer["error"].startswith(answer["code"] + ": "), answer
    assert len(stack.core.seen) + len(stack.notifier.seen) == before  # nobody was asked


def test_the_error_pages_location_is_internal(stack: Stack) -> None:
    reply = get(stack, "/.settle-errors/400")
    assert reply.status == 404 and reply.json() == NOT_FOUND
