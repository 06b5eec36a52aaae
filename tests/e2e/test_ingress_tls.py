"""The ingress over HTTPS, as compose runs it: the real nginx with the template rendered
for TLS (a self-signed certificate on 127.0.0.1) and plain HTTP redirected to HTTPS."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator

import pytest

from tests.e2e.test_ingress import (
    Ingress,
    Upstream,
    require_nginx,
    running_ingress,
    send,
    start_upstream,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tls_stack() -> Iterator[tuple[Ingress, Upstream, Upstream]]:
    nginx = require_nginx()
    core, notifier = start_upstream("core"), start_upstream("notifier")
    try:
        with running_ingress(nginx, core.address, notifier.address, https_redirect=True) as ing:
            yield ing, core, notifier
    finally:
        core.stop()
        notifier.stop()


def https(ingress: Ingress, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request over HTTPS, the certificate verified against the test's own CA."""
    context = ssl.create_default_context(cafile=str(ingress.ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", ingress.tls_port, timeout=5, context=context)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, dict(response.headers), response.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("path", "service"),
    [("/v1/chains", "core"), ("/v1/webhook-endpoints", "notifier"), ("/portal/", "core")],
)
def test_https_routes_to_the_services_with_the_scheme_forwarded(
    tls_stack: tuple[Ingress, Upstream, Upstream], path: str, service: str
) -> None:
    ingress, _, _ = tls_stack
    status, headers, body = https(ingress, "GET", path)
    assert status == 200
    seen = json.loads(body)
    assert seen["service"] == service and seen["path"] == path
    assert seen["proto"] == "https"
    # HTTPS answers tell browsers to stay on HTTPS
    assert headers["Strict-Transport-Security"] == "max-age=31536000"


def test_tls_below_1_2_is_refused(tls_stack: tuple[Ingress, Upstream, Upstream]) -> None:
    ingress, _, _ = tls_stack
    context = ssl.create_default_context(cafile=str(ingress.ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    conn = http.client.HTTPSConnection("127.0.0.1", ingress.tls_port, timeout=5, context=context)
    conn.request("GET", "/v1/chains")
    assert conn.getresponse().status == 200  # 1.2 is served
    conn.close()
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(str(ingress.ca_file))
    try:
        old.minimum_version = ssl.TLSVersion.TLSv1_1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    except ValueError:
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    conn = http.client.HTTPSConnection("127.0.0.1", ingress.tls_port, timeout=5, context=old)
    with pytest.raises((ssl.SSLError, OSError)):
        conn.request("GET", "/v1/chains")
    conn.close()


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_plain_http_is_redirected_to_https_keeping_method_path_and_query(
    tls_stack: tuple[Ingress, Upstream, Upstream], method: str
) -> None:
    ingress, core, notifier = tls_stack
    reached = len(core.seen) + len(notifier.seen)
    reply = send(
        ingress.port,
        method,
        "/v1/deposit-accounts?limit=5",
        body=b"{}" if method == "POST" else None,
        headers={"Host": "settle.example.com"},
    )
    assert reply.status == 308
    assert reply.headers["Location"] == (
        f"https://settle.example.com:{ingress.tls_port}/v1/deposit-accounts?limit=5"
    )
    # Nothing went to a service over plain HTTP
    assert len(core.seen) + len(notifier.seen) == reached
