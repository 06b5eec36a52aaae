"""One HTTP/1.1 POST and its answer on an open connection, spoken by h11.

The sender (sender.py) opens, vets, watches and pools the connections; this writes
the request in one `sendall` and reads the answer's status, headers and the first
bytes of its body, with h11 (a sans-I/O HTTP/1.1 implementation) doing the framing:
interim (1xx) answers skipped, a body chunked, Content-Length long or read until the
connection closes, a connection kept only when the whole answer was read and both
sides may go on (h11 never keeps an HTTP/1.0 one). An answer that is not HTTP/1.1
(a bad status line, conflicting lengths, a malformed chunk, a 101 nobody asked for)
raises h11.RemoteProtocolError, an over-long head too; a receiver that closes before
answering raises http.client.RemoteDisconnected, as it always has, so recorded attempt
errors read `connection_error: RemoteDisconnected`.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import h11

#: Longest status line plus headers read (what http.client allowed a single line).
MAX_HEAD = 65536
#: Most interim (1xx) answers read before the answer.
MAX_INTERIM = 16
#: Bytes asked of the socket at a time.
_RECV = 65536


@dataclass(frozen=True, slots=True)
class Answer:
    """What a receiver answered: status, headers (names lower-cased, first value kept),
    the first bytes of the body, and whether the connection can carry another request."""

    status: int
    headers: Mapping[str, str]
    body_prefix: bytes
    reusable: bool


@dataclass(frozen=True, slots=True)
class Post:
    """A POST ready to send: its head, checked, and its body."""

    head: h11.Request
    body: bytes


def post(host: str, target: str, headers: Mapping[str, str], body: bytes) -> Post:
    """A POST of `body` to `target` on `host`, checked before any connection is made.

    ValueError for a target with spaces or control characters,
    or a header with a line break: either would let a value end the head early
    (request splitting).
    """
    fields = [("Host", host), *headers.items(), ("Content-Length", str(len(body)))]
    try:
        return Post(h11.Request(method="POST", target=target, headers=fields), body)
    except h11.LocalProtocolError as err:
        raise ValueError(str(err)) from err


def host_header(host: str, port: int, https: bool) -> str:
    """The Host header for `host`:`port` (brackets for IPv6, no default port)."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == (443 if https else 80) else f"{shown}:{port}"


def exchange(sock: socket.socket, request: Post, keep_bytes: int) -> Answer:
    """Send `request` (head and body in one write) and read the answer, at most
    `keep_bytes` of its body.

    A longer body is not read: the answer is then not reusable (its connection must
    be closed). Raises OSError, h11.RemoteProtocolError or http.client.RemoteDisconnected
    when no (whole) status and headers came back, or the body's framing broke.
    """
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    sock.sendall(
        b"".join(
            conn.send(event) or b""
            for event in (request.head, h11.Data(data=request.body), h11.EndOfMessage())
        )
    )
    status = 0
    headers: dict[str, str] = {}
    parts: list[bytes] = []
    kept = 0
    interim = 0
    heard = False
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = sock.recv(_RECV)
            if not data and not heard:
                raise http.client.RemoteDisconnected(
                    "Remote end closed connection without response"
                )
            heard = heard or bool(data)
            conn.receive_data(data)
        elif isinstance(event, h11.InformationalResponse):
            interim += 1
            if interim > MAX_INTERIM:
                raise h11.RemoteProtocolError(f"more than {MAX_INTERIM} interim answers")
        elif isinstance(event, h11.Response):
            status = event.status_code
            for name, value in event.headers:
                headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        elif isinstance(event, h11.Data):
            room = keep_bytes - kept
            parts.append(bytes(event.data[:room]))
            kept += len(event.data)
            if kept > keep_bytes:
                # Longer than we keep: not read to its end, so the connection goes.
                return Answer(status, headers, b"".join(parts), False)
        elif isinstance(event, h11.EndOfMessage):
            # Not after the receiver's EOF (a body read until the connection closed), nor
            # with bytes after the answer that no request asked for.
            extra, closed = conn.trailing_data
            reusable = conn.their_state is h11.DONE and not extra and not closed
            return Answer(status, headers, b"".join(parts), reusable)
        else:  # ConnectionClosed or PAUSED: no whole answer
            raise h11.RemoteProtocolError(f"the answer ended early ({event!r})")
