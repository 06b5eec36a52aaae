"""One HTTP/1.1 POST and its answer on an open connection: the bytes, nothing more.

The sender (sender.py) opens, vets, watches and pools the connections; this writes
the request in one `sendall` and reads the answer's status, headers and the first
bytes of its body. It replaces http.client's request and response objects on the
hot path, whose header checks and email-parser header parsing were a third of a
worker's CPU per delivery. The framing rules are http.client's (and RFC 9112's):
a 100 Continue is skipped; a body is chunked, Content-Length long, or read until
the connection closes; a connection is kept only when the whole answer was read and
the receiver did not ask to close it. Errors are http.client's exception types, so
recorded attempt errors read as before (`connection_error: RemoteDisconnected`, ...).
"""

from __future__ import annotations

import http.client
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

#: Longest status or header line read (as http.client), and most header lines.
MAX_LINE = 65536
MAX_HEADERS = 100
#: Most interim (1xx) answers read before the answer.
MAX_INTERIM = 16
#: Statuses whose answer has no body.
_NO_BODY = frozenset({204, 304})
#: A chunk's size: hex digits only (int() would take "-1", and read(-1) reads to the end).
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


@dataclass(frozen=True, slots=True)
class Answer:
    """What a receiver answered: status, headers (names lower-cased, first value kept),
    the first bytes of the body, and whether the connection can carry another request."""

    status: int
    headers: Mapping[str, str]
    body_prefix: bytes
    reusable: bool


def request_head(host: str, target: str, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and headers of a POST of `length` bytes to `target` on `host`.

    ValueError for a target with spaces or control characters, or a header with a
    line break: either would let a value end the head early (request splitting).
    """
    if any(ch <= " " or ch == "\x7f" for ch in target):
        raise ValueError("the request target has a space or a control character")
    lines = [f"POST {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"header {name[:40]!r} has a line break")
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {length}\r\n\r\n")
    return "\r\n".join(lines).encode("latin-1")


def host_header(host: str, port: int, https: bool) -> str:
    """The Host header for `host`:`port` (brackets for IPv6, no default port)."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == (443 if https else 80) else f"{shown}:{port}"


def exchange(sock: socket.socket, request: bytes, keep_bytes: int) -> Answer:
    """Send `request` (head and body) and read the answer, at most `keep_bytes` of its body.

    A longer body is not read: the answer is then not reusable (its connection must
    be closed). Raises OSError or http.client.HTTPException when no (whole) status
    and headers came back.
    """
    sock.sendall(request)
    reader = sock.makefile("rb")
    try:
        return _read_answer(reader, keep_bytes)
    finally:
        reader.close()


def _read_answer(reader: BinaryIO, keep_bytes: int) -> Answer:
    for _ in range(MAX_INTERIM + 1):
        version, status = _status_line(reader)
        headers, close = _headers(reader)
        # An interim answer (100 Continue, 103 Early Hints, ...) is not the answer: the
        # real one follows on the same connection. 101 switches protocols: no HTTP after.
        if not 100 <= status < 200 or status == 101:
            break
    else:
        raise http.client.HTTPException(f"more than {MAX_INTERIM} interim answers")
    if status == 101:
        return Answer(status, headers, b"", False)
    if version == "HTTP/1.0":
        close = close or (
            headers.get("connection", "").lower() != "keep-alive" and "keep-alive" not in headers
        )
    if status in _NO_BODY:
        return Answer(status, headers, b"", not close)
    read = reader.read
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body, complete = _chunked(reader, keep_bytes)
        return Answer(status, headers, body, complete and not close)
    length = _content_length(headers.get("content-length"))
    if length is None:
        # Delimited by the connection's end: never reusable.
        return Answer(status, headers, read(keep_bytes), False)
    body = read(min(length, keep_bytes))
    return Answer(status, headers, body, length <= keep_bytes and len(body) == length and not close)


def _status_line(reader: BinaryIO) -> tuple[str, int]:
    line = reader.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise http.client.LineTooLong("status line")
    if not line:
        raise http.client.RemoteDisconnected("Remote end closed connection without response")
    text = line.decode("iso-8859-1")
    parts = text.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise http.client.BadStatusLine(text)
    code = parts[1]
    if len(code) != 3 or not (code.isascii() and code.isdigit()) or int(code) < 100:
        raise http.client.BadStatusLine(text)
    return parts[0], int(code)


def _headers(reader: BinaryIO) -> tuple[dict[str, str], bool]:
    """Headers (first value of each name) and whether the receiver asked to close (also
    when it sent two different Content-Lengths: which one frames the body is unknown)."""
    headers: dict[str, str] = {}
    close = False
    last = ""
    for _ in range(MAX_HEADERS + 1):
        line = reader.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return headers, close
        text = line.decode("iso-8859-1")
        if text[0] in " \t" and last:
            # An obsolete folded continuation of the header before.
            headers[last] = f"{headers[last]} {text.strip()}"
            continue
        name, sep, value = text.partition(":")
        if not sep:
            continue
        last = name.strip().lower()
        value = value.strip()
        if last == "connection" and "close" in (t.strip().lower() for t in value.split(",")):
            close = True
        if headers.setdefault(last, value) != value and last == "content-length":
            close = True
    raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")


def _content_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None


def _chunked(reader: BinaryIO, keep_bytes: int) -> tuple[bytes, bool]:
    """The first `keep_bytes` of a chunked body, and whether it ended within them."""
    parts: list[bytes] = []
    kept = 0
    while True:
        line = reader.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("chunk size")
        size_text = line.split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise http.client.IncompleteRead(b"".join(parts))
        size = int(size_text, 16)
        if size == 0:
            _headers(reader)  # the trailer
            return b"".join(parts), True
        if kept + size > keep_bytes:
            parts.append(reader.read(keep_bytes - kept))
            return b"".join(parts), False
        chunk = reader.read(size)
        if len(chunk) < size:
            raise http.client.IncompleteRead(chunk, size - len(chunk))
        parts.append(chunk)
        kept += size
        reader.read(2)  # the chunk's CRLF
