"""Sending one signed delivery over HTTP: pooled, no redirects, strict timeouts, SSRF-safe.

The SSRF guard works on the address actually connected to: each new connection
resolves the host, drops every loopback, private, link-local, reserved, multicast
or metadata address, and connects to a vetted address itself. Host header and TLS
SNI/certificate checks keep the host name, and pooled keep-alive connections were
all vetted when opened, so a DNS answer that changes between a check and the
connect (rebinding) cannot send a delivery anywhere else.
"""

from __future__ import annotations

import email.utils
import ipaddress
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NameResolutionError, NewConnectionError
from urllib3.util.timeout import _DEFAULT_TIMEOUT

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Bytes of a response body kept in the attempt log.
RESPONSE_PREFIX_BYTES = 4096
#: Connecting may take at most this (or the whole timeout, if shorter).
CONNECT_TIMEOUT_MAX_S = 5.0
#: Sent on every delivery so receivers can tell our requests apart.
USER_AGENT = "Settle-Webhooks/1"
#: Headers of every request, before the delivery's own (built once, not per request).
BASE_HEADERS = {"User-Agent": USER_AGENT, "Accept": "*/*", "Accept-Encoding": "identity"}
#: Cloud metadata services, refused even though some sit in ranges judged elsewhere.
METADATA_ADDRESSES = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack
        ipaddress.ip_address("169.254.170.2"),  # AWS ECS task metadata
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
        ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
    }
)
#: Ranges refused whatever this Python's `ipaddress` thinks (its tables vary by version).
_NON_PUBLIC = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/128",
        "::1/128",
        "100::/64",
        "2001::/23",
        "2001:db8::/32",
        "3fff::/20",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
    )
)
#: IPv6 prefixes that embed an IPv4 address the packet really goes to (NAT64).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))

#: Attempt error codes.
TIMEOUT = "timeout"
CONNECTION_REFUSED = "connection_refused"
CONNECTION_ERROR = "connection_error"
BLOCKED_ADDRESS = "blocked_address"
DNS_ERROR = "dns_error"
TLS_ERROR = "tls_error"
INVALID_URL = "invalid_url"


def is_blocked_ip(address: str | IPAddress) -> bool:
    """True for any address a webhook must never reach outside dev.

    Judges IPv4 inside IPv6 (mapped, 6to4, NAT64) by the IPv4 address, refuses
    Teredo, and refuses anything not globally routable unicast.
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if ip in METADATA_ADDRESSES:
        return True
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return True
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and any(ip in net for net in _NAT64):
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_blocked_ip(embedded)
        if ip.teredo is not None:
            return True
    if any(ip.version == net.version and ip in net for net in _NON_PUBLIC):
        return True
    return (
        not ip.is_global
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_private
        or ip.is_unspecified
    )


class BlockedAddressError(NewConnectionError):
    """Every address the host resolved to is refused by the SSRF guard."""


class _GuardedConnectionMixin:
    """Resolves, vets and connects to the vetted address itself (see module doc)."""

    host: str
    port: int
    timeout: Any
    source_address: tuple[str, int] | None
    socket_options: Any

    def _new_conn(self) -> socket.socket:
        host = self.host.strip("[]")
        try:
            infos = socket.getaddrinfo(host, self.port, 0, socket.SOCK_STREAM)
        except socket.gaierror as err:
            raise NameResolutionError(host, self, err) from err  # type: ignore[arg-type]
        allowed = [info for info in infos if not is_blocked_ip(info[4][0].split("%", 1)[0])]
        if not allowed:
            shown = ", ".join(sorted({str(info[4][0]) for info in infos}))
            raise BlockedAddressError(self, f"{host} resolves only to refused addresses: {shown}")  # type: ignore[arg-type]
        last_error: OSError | None = None
        for family, socktype, proto, _name, sockaddr in allowed:
            sock = socket.socket(family, socktype, proto)
            try:
                for option in self.socket_options or ():
                    sock.setsockopt(*option)
                if self.timeout is not _DEFAULT_TIMEOUT:
                    sock.settimeout(self.timeout)
                sock.connect(sockaddr)
                return sock
            except OSError as err:
                sock.close()
                last_error = err
        assert last_error is not None
        if isinstance(last_error, TimeoutError | socket.timeout):
            raise urllib3.exceptions.ConnectTimeoutError(
                self, f"connection to {host} timed out"
            ) from last_error
        raise NewConnectionError(self, f"failed to connect: {last_error}") from last_error  # type: ignore[arg-type]


class GuardedHTTPConnection(_GuardedConnectionMixin, HTTPConnection):
    pass


class GuardedHTTPSConnection(_GuardedConnectionMixin, HTTPSConnection):
    pass


class GuardedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = GuardedHTTPConnection


class GuardedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = GuardedHTTPSConnection


def guarded_pool_manager(*, num_pools: int, maxsize: int) -> urllib3.PoolManager:
    """A urllib3 PoolManager whose pools open only guarded connections."""
    manager = urllib3.PoolManager(num_pools=num_pools, maxsize=maxsize, block=False)
    manager.pool_classes_by_scheme = {
        "http": GuardedHTTPConnectionPool,
        "https": GuardedHTTPSConnectionPool,
    }
    return manager


@dataclass(frozen=True)
class SendResult:
    """What one HTTP attempt came to."""

    status: int | None
    latency_ms: float
    #: None on success; otherwise a code (`timeout`, `http_500`, `blocked_address`, ...).
    error: str | None
    #: The first 4 KiB of the response body, decoded leniently.
    body: str | None = None
    #: Seconds a 429/503 asked us to wait (Retry-After), if it said.
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _classify(err: BaseException) -> str:
    """An error code for a request that got no response."""
    if isinstance(err, BlockedAddressError):
        return BLOCKED_ADDRESS
    if isinstance(err, NameResolutionError):
        return DNS_ERROR
    if isinstance(err, urllib3.exceptions.SSLError):
        return TLS_ERROR
    if isinstance(err, urllib3.exceptions.LocationValueError):
        return INVALID_URL
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(c, ConnectionRefusedError) for c in chain):
        return CONNECTION_REFUSED
    # NewConnectionError subclasses urllib3's TimeoutError: judge it by its cause.
    if any(
        isinstance(c, TimeoutError)
        or (
            isinstance(c, urllib3.exceptions.TimeoutError) and not isinstance(c, NewConnectionError)
        )
        for c in chain
    ):
        return TIMEOUT
    if "Connection refused" in str(err):
        return CONNECTION_REFUSED
    if isinstance(err, urllib3.exceptions.ProtocolError) and len(err.args) > 1:
        # ("Connection aborted.", RemoteDisconnected(...)): name what happened.
        return f"{CONNECTION_ERROR}: {type(err.args[1]).__name__}"
    return f"{CONNECTION_ERROR}: {type(err).__name__}"


class Sender:
    """POSTs deliveries through one thread-safe urllib3 pool shared by every worker thread.

    urllib3 directly (what requests uses underneath) costs a third of the CPU per
    request, keeps no cookies and reads no proxy settings from the environment.
    `allow_private` (dev) turns the SSRF guard off and admits http://; otherwise
    only https:// to public addresses, checked on the address connected to.
    """

    def __init__(self, *, timeout_s: float, allow_private: bool, pool_per_host: int = 16) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = min(timeout_s, CONNECT_TIMEOUT_MAX_S)
        self.allow_private = allow_private
        self._timeout = urllib3.Timeout(connect=self.connect_timeout_s, read=timeout_s)
        if allow_private:
            self._pool = urllib3.PoolManager(num_pools=256, maxsize=pool_per_host, block=False)
        else:
            self._pool = guarded_pool_manager(num_pools=256, maxsize=pool_per_host)

    @property
    def max_duration_s(self) -> float:
        """Longest an attempt normally takes: connecting, then waiting for the answer."""
        return self.connect_timeout_s + self.timeout_s

    def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> SendResult:
        """One POST of the exact body bytes; never raises for network or HTTP failures."""
        if not self.allow_private and not url.lower().startswith("https://"):
            return SendResult(None, 0.0, INVALID_URL)
        request_headers = {**BASE_HEADERS, **headers}
        started = time.perf_counter()
        try:
            response = self._pool.urlopen(
                "POST",
                url,
                body=body,
                headers=request_headers,
                timeout=self._timeout,
                redirect=False,
                retries=False,
                preload_content=False,
            )
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            return SendResult(None, _ms_since(started), _classify(err))
        try:
            prefix = _read_prefix(response)
        except (urllib3.exceptions.HTTPError, OSError) as err:
            return SendResult(response.status, _ms_since(started), _classify(err))
        latency = _ms_since(started)
        status = response.status
        # PostgreSQL text refuses NUL: a receiver answering one must not make the
        # attempt unrecordable (it would then be re-sent every lease, forever).
        text = prefix.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        if latency > self.timeout_s * 1000:
            # Headers came in time but the whole answer did not (a trickling receiver).
            return SendResult(status, latency, TIMEOUT, text)
        if 200 <= status < 300:
            return SendResult(status, latency, None, text)
        retry_after = (
            parse_retry_after(response.headers.get("Retry-After")) if status in (429, 503) else None
        )
        return SendResult(status, latency, f"http_{status}", text, retry_after)


def _read_prefix(response: urllib3.BaseHTTPResponse) -> bytes:
    """The first 4 KiB of the body. A longer body is not read: its connection is closed."""
    try:
        data: bytes = response.read(RESPONSE_PREFIX_BYTES, decode_content=False) or b""
    except BaseException:
        response.close()
        response.release_conn()
        raise
    if not response.closed:
        # More body than we keep: drop the connection rather than read it all.
        response.close()
    # Fully read responses already went back to the pool; this returns the others.
    response.release_conn()
    return data


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)
