"""The sender's transport: kept connections, TLS handshakes, receivers on 127.0.0.1.

A certificate is made for the test (cryptography); the sender trusts it only when
told to, as production trusts the system's store.
"""

from __future__ import annotations

import datetime as dt
import http.server
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.notifier.sender import TIMEOUT, TLS_ERROR, Sender

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1: (cert file, key file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


class _Hook(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections: set[int] = set()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Hook.connections.add(self.client_address[1])  # one source port per connection
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_receiver(cert: tuple[Path, Path]) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Hook.connections = set()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_trusted_receiver_gets_its_deliveries_over_one_kept_connection(
    cert: tuple[Path, Path], https_receiver: int
) -> None:
    # Given a sender that trusts the receiver's certificate
    trusting = ssl.create_default_context(cafile=str(cert[0]))
    sender = Sender(timeout_s=2.0, allow_private=True, tls=trusting)
    # When it delivers three times to the receiver's name
    results = [sender.send(f"https://localhost:{https_receiver}/hook", b"{}", {}) for _ in range(3)]
    # Then each is answered, and the TLS connection was made once and kept
    assert [(r.status, r.error) for r in results] == [(200, None)] * 3
    assert len(_Hook.connections) == 1


def test_an_untrusted_certificate_is_a_tls_error(https_receiver: int) -> None:
    # Given the system's trust store (which knows nothing of the test's certificate)
    sender = Sender(timeout_s=2.0, allow_private=True)
    # When a delivery is sent there
    result = sender.send(f"https://localhost:{https_receiver}/hook", b"{}", {})
    # Then nothing is sent and the attempt says why
    assert result.status is None and result.error == TLS_ERROR


def test_a_certificate_for_another_name_is_a_tls_error(
    cert: tuple[Path, Path], https_receiver: int
) -> None:
    # Given a trusted certificate that names localhost and 127.0.0.1 only
    trusting = ssl.create_default_context(cafile=str(cert[0]))
    sender = Sender(timeout_s=2.0, allow_private=True, tls=trusting)
    # When the URL names the receiver by another name that resolves to it
    result = sender.send(f"https://127.0.0.2:{https_receiver}/hook", b"{}", {})
    # Then the host name check refuses it (or nothing listens there): never a 200
    assert result.status is None and result.error is not None


def test_a_receiver_that_never_finishes_the_handshake_is_cut_at_the_deadline() -> None:
    # Given a TCP listener that accepts and then says nothing (no ServerHello, ever)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    try:
        sender = Sender(timeout_s=1.0, allow_private=True)
        # When a delivery is sent there
        started = time.monotonic()
        result = sender.send(f"https://127.0.0.1:{port}/hook", b"{}", {})
        took = time.monotonic() - started
        # Then the attempt ends at its deadline, as a timeout
        assert result.error == TIMEOUT and result.status is None
        assert took < 1.5, f"the handshake held the attempt {took:.2f}s"
    finally:
        for conn in accepted:
            conn.close()
        listener.close()


def test_a_kept_connection_the_receiver_closed_is_not_used_again() -> None:
    # Given a receiver that answers HTTP/1.1 keep-alive, then closes idle connections
    # 0.1 s after each answer (as servers with a short keep-alive timeout do)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    served: list[int] = []

    def serve() -> None:
        for _ in range(2):
            conn, _addr = listener.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            served.append(1)
            time.sleep(0.1)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        sender = Sender(timeout_s=2.0, allow_private=True)
        first = sender.send(f"http://127.0.0.1:{port}/hook", b"{}", {})
        time.sleep(0.4)
        # When the next delivery goes to the same receiver
        second = sender.send(f"http://127.0.0.1:{port}/hook", b"{}", {})
        # Then it is sent on a new connection and answered, not lost to the closed one
        assert (first.status, first.error) == (200, None)
        assert (second.status, second.error) == (200, None)
        thread.join(2)
        assert len(served) == 2
    finally:
        listener.close()
