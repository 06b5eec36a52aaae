"""Sending one signed delivery over HTTP: pooled, no redirects, one deadline, SSRF-safe.

One deadline per attempt (SETTLE_WEBHOOK_TIMEOUT_S) covers the name lookup, the
connect, the TLS handshake, sending and reading: a receiver (or its name server)
that answers a byte at a time is cut at the deadline, not at its leisure.

The SSRF guard works on the address actually connected to: each new connection
resolves the host, drops every loopback, private, link-local, reserved, multicast
or metadata address, and connects to a vetted address itself. Host header and TLS
SNI/certificate checks keep the host name, and pooled keep-alive connections were
all vetted when opened, so a DNS answer that changes between a check and the
connect (rebinding) cannot send a delivery anywhere else.
"""

from __future__ import annotations

import contextlib
import email.utils
import heapq
import http.client
import ipaddress
import itertools
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import h11

from services.notifier import http_wire

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Bytes of a response body kept in the attempt log.
RESPONSE_PREFIX_BYTES = 4096
#: The watchdog's thread exits after this long with nothing to watch.
IDLE_EXIT_S = 5.0
#: Kept-alive connections a worker keeps idle at most, in all, and for how long each.
IDLE_CONNECTIONS = 256
IDLE_CONNECTION_S = 30.0
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
DNS_TIMEOUT = "dns_timeout"
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


class _NoConnection(OSError):
    """No connection was made; `code` says why (an attempt error code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


#: One answer of getaddrinfo: (family, type, proto, canonname, sockaddr).
AddrInfo = tuple[Any, ...]
#: A blocking name lookup, as `socket.getaddrinfo(host, port, 0, SOCK_STREAM)`.
Lookup = Callable[[str, int], Sequence[AddrInfo]]


def _system_lookup(host: str, port: int) -> Sequence[AddrInfo]:
    # socket.getaddrinfo looked up at call time, so a test can swap it.
    return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)


class _PendingLookup:
    __slots__ = ("answer", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: Sequence[AddrInfo] = ()
        self.error: OSError | None = None


class Resolver:
    """Name lookups that an attempt waits for only until its deadline.

    getaddrinfo has no timeout of its own (the C library may wait 30 s and more), so
    each lookup runs on a daemon thread; a caller waits at most until its deadline
    and leaves the lookup to finish on its own. Concurrent lookups of one name share
    one thread, and at most `max_pending` lookups run at once, so a receiver whose
    name server never answers ties up one thread, not one per attempt. IP literals
    need no lookup. The answer is vetted by the caller, like any other.
    """

    def __init__(self, lookup: Lookup | None = None, *, max_pending: int = 256) -> None:
        self._lookup = lookup or _system_lookup
        self._max_pending = max_pending
        self._pending: dict[tuple[str, int], _PendingLookup] = {}
        self._lock = threading.Lock()

    def resolve(self, host: str, port: int, deadline: float) -> Sequence[AddrInfo]:
        """The addresses of `host`; DnsTimeoutError-worthy `TimeoutError` after `deadline`."""
        literal = _literal_info(host, port)
        if literal is not None:
            return literal
        key = (host, port)
        with self._lock:
            pending = self._pending.get(key)
            if pending is None:
                if len(self._pending) >= self._max_pending:
                    raise socket.gaierror(socket.EAI_AGAIN, "too many name lookups in flight")
                pending = self._pending[key] = _PendingLookup()
                threading.Thread(
                    target=self._run, args=(key, pending), name="dns-lookup", daemon=True
                ).start()
        if not pending.done.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"no answer for {host} before the attempt's deadline")
        if pending.error is not None:
            raise pending.error
        return pending.answer

    def _run(self, key: tuple[str, int], pending: _PendingLookup) -> None:
        try:
            pending.answer = list(self._lookup(*key))
        except OSError as err:
            pending.error = err
        except Exception as err:  # a broken lookup must not leave its callers waiting
            pending.error = socket.gaierror(socket.EAI_FAIL, str(err))
        finally:
            with self._lock:
                self._pending.pop(key, None)
            pending.done.set()


def _literal_info(host: str, port: int) -> list[AddrInfo] | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port, 0, 0))]
    return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]


class _Watch:
    """One connection watched for one attempt: a duplicate of its socket's descriptor.

    Shutting the duplicate down ends the connection (TCP or TLS alike) and wakes the
    thread blocked on it, and owning the duplicate means the descriptor number can
    never be some other connection's by the time the deadline comes.
    """

    __slots__ = ("active", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = socket.fromfd(sock.fileno(), sock.family, sock.type)
        self.active = True


class Watchdog:
    """Cuts the connections of attempts that pass their deadline: one thread, one heap.

    A per-read socket timeout lets a receiver that sends a byte now and then hold an
    attempt for as long as it likes; this bounds the whole attempt instead. Watching
    costs a descriptor dup and a heap push; the thread sleeps until the earliest
    deadline and exits when there is nothing to watch.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Watch]] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._running = False

    def watch(self, sock: socket.socket, deadline: float) -> _Watch:
        watch = _Watch(sock)
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._seq), watch))
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="webhook-deadlines", daemon=True).start()
            elif self._heap[0][2] is watch:
                self._cond.notify()
        return watch

    def release(self, watch: _Watch) -> None:
        with self._cond:
            watch.active = False
        watch.sock.close()

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and (not self._heap[0][2].active or self._heap[0][0] <= now):
                    watch = heapq.heappop(self._heap)[2]
                    if watch.active:
                        watch.active = False
                        with contextlib.suppress(OSError):
                            watch.sock.shutdown(socket.SHUT_RDWR)
                if not self._heap:
                    if not self._cond.wait(IDLE_EXIT_S) and not self._heap:
                        self._running = False
                        return
                    continue
                self._cond.wait(self._heap[0][0] - now)


class _Attempt:
    """The attempt this thread is making: its deadline and the connections it used."""

    __slots__ = ("conns", "deadline", "watchdog", "watches")

    def __init__(self, deadline: float, watchdog: Watchdog) -> None:
        self.deadline = deadline
        self.watchdog = watchdog
        self.watches: list[_Watch] = []
        self.conns: list[object] = []

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def watch(self, conn: object, sock: socket.socket) -> None:
        if any(c is conn for c in self.conns):
            return
        self.conns.append(conn)
        self.watches.append(self.watchdog.watch(sock, self.deadline))

    def end(self) -> None:
        for watch in self.watches:
            self.watchdog.release(watch)


@dataclass(frozen=True)
class _ConnectPolicy:
    """What a Sender's connections share: the resolver, and whether addresses are vetted."""

    resolver: Resolver
    vet: bool


def _open_socket(policy: _ConnectPolicy, host: str, port: int, deadline: float) -> socket.socket:
    """A TCP connection to a vetted address of `host`, made before `deadline`.

    See the module doc for why the address connected to is the one vetted.
    """
    try:
        infos = policy.resolver.resolve(host, port, deadline)
    except TimeoutError as err:
        raise _NoConnection(DNS_TIMEOUT, str(err)) from err
    except socket.gaierror as err:
        raise _NoConnection(DNS_ERROR, f"{host}: {err}") from err
    if policy.vet:
        allowed = [info for info in infos if not is_blocked_ip(info[4][0].split("%", 1)[0])]
        if not allowed:
            shown = ", ".join(sorted({str(info[4][0]) for info in infos}))
            raise _NoConnection(
                BLOCKED_ADDRESS, f"{host} resolves only to refused addresses: {shown}"
            )
    else:
        allowed = list(infos)
    last_error: OSError | None = None
    for family, socktype, proto, _name, sockaddr in allowed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _NoConnection(TIMEOUT, f"the deadline passed connecting to {host}")
        sock = socket.socket(family, socktype, proto)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(remaining)
            sock.connect(sockaddr)
        except OSError as err:
            sock.close()
            last_error = err
            continue
        return sock
    if last_error is None:
        raise _NoConnection(DNS_ERROR, f"{host} has no address")
    raise last_error


@dataclass(frozen=True)
class _Origin:
    """Where a request goes: connections are kept per origin."""

    https: bool
    host: str
    port: int


class _Connection:
    """One keep-alive HTTP/1.1 connection on a socket we open (`_open_socket`) and, for
    https, wrap in TLS ourselves (SNI, certificate and host name checked against the
    URL's host); http_wire speaks HTTP on it."""

    __slots__ = ("host", "origin", "policy", "sock", "tls")

    def __init__(self, origin: _Origin, policy: _ConnectPolicy, tls: ssl.SSLContext) -> None:
        self.origin = origin
        self.policy = policy
        self.tls = tls
        self.sock: socket.socket | None = None
        #: The Host header of its requests.
        self.host = http_wire.host_header(origin.host, origin.port, origin.https)

    def connect(self, attempt: _Attempt) -> socket.socket:
        """Open (and for https, wrap in TLS) the connection, within the attempt's deadline."""
        origin = self.origin
        sock = _open_socket(self.policy, origin.host, origin.port, attempt.deadline)
        # Watched from here, so the deadline bounds the TLS handshake too.
        attempt.watch(self, sock)
        if origin.https:
            try:
                sock = self.tls.wrap_socket(sock, server_hostname=origin.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock
        return sock

    def reusable(self) -> bool:
        """Still open and silent: a receiver that closed an idle connection made it readable."""
        sock = self.sock
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


class _Pool:
    """Idle connections per origin (most recently used last), for every worker thread.

    Bounded three ways, so that receivers (or one tenant's many host names) cannot make
    a worker hoard descriptors: at most `per_origin` per origin, `total` in all (the
    least recently used origin's go first), and none idle longer than `idle_s` (most
    receivers close sooner anyway; a kept connection is also checked before reuse).
    """

    def __init__(
        self,
        *,
        per_origin: int,
        total: int,
        idle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_origin = per_origin
        self._total = total
        self._idle_s = idle_s
        self._clock = clock
        #: origin -> [(returned at, connection)], oldest first; origins in LRU order.
        self._idle: dict[_Origin, list[tuple[float, _Connection]]] = {}
        self._count = 0
        self._next_sweep = 0.0
        self._lock = threading.Lock()

    def take(self, origin: _Origin) -> _Connection | None:
        while True:
            stale: list[_Connection] = []
            with self._lock:
                stale = self._expire(self._clock())
                idle = self._idle.get(origin)
                conn = idle.pop()[1] if idle else None
                if conn is not None:
                    self._count -= 1
                    if not idle:
                        del self._idle[origin]
            for old in stale:
                old.close()
            if conn is None or conn.reusable():
                return conn
            conn.close()

    def give(self, origin: _Origin, conn: _Connection) -> None:
        now = self._clock()
        with self._lock:
            dropped = self._expire(now)
            idle = self._idle.pop(origin, [])
            self._idle[origin] = idle  # re-inserted last: the most recently used origin
            idle.append((now, conn))
            self._count += 1
            while len(idle) > self._per_origin:
                dropped.append(idle.pop(0)[1])
                self._count -= 1
            while self._count > self._total:
                oldest_origin = next(iter(self._idle))
                victims = self._idle[oldest_origin]
                dropped.append(victims.pop(0)[1])
                self._count -= 1
                if not victims:
                    del self._idle[oldest_origin]
        for extra in dropped:
            extra.close()

    def idle_count(self) -> int:
        with self._lock:
            return self._count

    def _expire(self, now: float) -> list[_Connection]:
        """Take out every connection idle longer than `idle_s` (the caller closes them).

        At most once a second: a sweep walks every origin, and runs under the lock.
        """
        expired: list[_Connection] = []
        if now < self._next_sweep:
            return expired
        self._next_sweep = now + 1.0
        limit = now - self._idle_s
        for origin in list(self._idle):
            idle = self._idle[origin]
            while idle and idle[0][0] < limit:
                expired.append(idle.pop(0)[1])
                self._count -= 1
            if not idle:
                del self._idle[origin]
        return expired


def _split(url: str) -> tuple[_Origin, str]:
    """The origin and the request target of `url`; ValueError if it cannot be sent to."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url[:100]}")
    host = parts.hostname.encode("idna").decode("ascii")
    port = parts.port or (443 if scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Origin(scheme == "https", host, port), target


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


def _classify(err: BaseException, attempt: _Attempt) -> str:
    """An error code for a request that got no (whole) response."""
    if isinstance(err, _NoConnection):
        return err.code
    if attempt.remaining() <= 0:
        # Whatever the cut connection raised (EOF, reset), the deadline is what happened.
        return TIMEOUT
    if isinstance(err, ssl.SSLError | ssl.CertificateError):
        return TLS_ERROR
    if isinstance(err, ConnectionRefusedError):
        return CONNECTION_REFUSED
    if isinstance(err, TimeoutError):
        return TIMEOUT
    return f"{CONNECTION_ERROR}: {type(err).__name__}"


class Sender:
    """POSTs deliveries over keep-alive connections shared by every worker thread.

    Each attempt has one deadline, `timeout_s` from its start, for the name lookup,
    the connect, the TLS handshake, sending and reading the answer together: the
    lookup is waited for only until then (Resolver) and the watchdog cuts the
    connection at the deadline, so no receiver can hold a worker thread longer.
    The transport is sockets we open and wrap in TLS, with the request and answer
    written and read by h11 (http_wire): no cookies, no proxy settings from the
    environment, no redirects, no retries.
    `allow_private` (dev) turns the SSRF guard off and admits http://; otherwise
    only https:// to public addresses, checked on the address connected to.
    """

    def __init__(
        self,
        *,
        timeout_s: float,
        allow_private: bool,
        pool_per_host: int = 16,
        resolver: Lookup | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.allow_private = allow_private
        self._watchdog = Watchdog()
        self._policy = _ConnectPolicy(Resolver(resolver), vet=not allow_private)
        self._pool = _Pool(
            per_origin=pool_per_host, total=IDLE_CONNECTIONS, idle_s=IDLE_CONNECTION_S
        )
        # The system's trust store; tests pass a context trusting their own CA.
        self._tls = tls or ssl.create_default_context()

    @property
    def deadline_s(self) -> float:
        """The longest an attempt takes, from the lookup to the last byte read."""
        return self.timeout_s

    def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> SendResult:
        """One POST of the exact body bytes; never raises for network or HTTP failures."""
        if not self.allow_private and not url.lower().startswith("https://"):
            return SendResult(None, 0.0, INVALID_URL)
        try:
            origin, target = _split(url)
        except (ValueError, UnicodeError):
            return SendResult(None, 0.0, INVALID_URL)
        request_headers = {**BASE_HEADERS, **headers}
        started = time.monotonic()
        attempt = _Attempt(started + self.timeout_s, self._watchdog)
        conn = self._pool.take(origin)
        if conn is None:
            conn = _Connection(origin, self._policy, self._tls)
        keep = False
        try:
            result, keep = self._exchange(attempt, conn, target, body, request_headers, started)
            return result
        finally:
            attempt.end()
            if keep:
                self._pool.give(origin, conn)
            else:
                conn.close()

    def _exchange(
        self,
        attempt: _Attempt,
        conn: _Connection,
        target: str,
        body: bytes,
        headers: Mapping[str, str],
        started: float,
    ) -> tuple[SendResult, bool]:
        """(what the attempt came to, whether the connection may be used again)."""
        try:
            request = http_wire.post(conn.host, target, headers, body)
            sock = conn.sock if conn.sock is not None else conn.connect(attempt)
            # The watchdog bounds the exchange (a kept connection is watched from
            # here, a new one since it connected); the socket timeout is a backstop.
            attempt.watch(conn, sock)
            sock.settimeout(max(attempt.remaining(), 0.001))
            answer = http_wire.exchange(sock, request, RESPONSE_PREFIX_BYTES)
        except (OSError, http.client.HTTPException, h11.ProtocolError, ValueError) as err:
            return SendResult(None, _ms_since(started), _classify(err, attempt)), False
        latency = _ms_since(started)
        status = answer.status
        # A longer body than we keep is not read: its connection is dropped instead.
        keep = answer.reusable
        # PostgreSQL text refuses NUL: a receiver answering one must not make the
        # attempt unrecordable (it would then be re-sent every lease, forever).
        text = answer.body_prefix.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        if attempt.remaining() <= 0:
            # The answer began in time but did not end in time (cut, or just too slow).
            return SendResult(status, latency, TIMEOUT, text), False
        if 200 <= status < 300:
            return SendResult(status, latency, None, text), keep
        retry_after = (
            parse_retry_after(answer.headers.get("retry-after")) if status in (429, 503) else None
        )
        return SendResult(status, latency, f"http_{status}", text, retry_after), keep


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000.0, 3)
