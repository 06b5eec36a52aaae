"""Webhook signatures: `x-service-signature: v1=<hex HMAC-SHA256>`.

The HMAC key is the endpoint secret's UTF-8 bytes; the message is
`<timestamp>.<raw body>`. During a rotation overlap the header carries one
`v1=` value per valid secret, newest first: `v1=<new>,v1=<old>`.

A receiver calls `verify(secret, headers, raw_body)`; see docs/WEBHOOKS.md.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Iterable, Mapping

SIGNATURE_HEADER = "x-service-signature"
TIMESTAMP_HEADER = "x-service-timestamp"
EVENT_ID_HEADER = "x-service-event-id"
DELIVERY_ID_HEADER = "x-service-delivery-id"
SCHEME = "v1"
#: Receivers reject deliveries whose timestamp is further than this from their clock.
DEFAULT_TOLERANCE_S = 300
#: Unix seconds in ASCII digits only (`str.isdigit` also takes "²" and other scripts' digits).
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
#: A `v1=` value as `compute` writes it: lower-case hex (compare_digest refuses non-ASCII str).
_HEX = re.compile(r"[0-9a-f]{1,128}")


class SignatureError(Exception):
    """The delivery is not authentic or not fresh; answer 400 and drop it."""


class MissingHeader(SignatureError):
    """A signature or timestamp header is absent."""


class MalformedHeader(SignatureError):
    """A header is present but cannot be read."""


class TimestampOutOfTolerance(SignatureError):
    """The timestamp is too far from the receiver's clock (a replay, or a bad clock)."""


class SignatureMismatch(SignatureError):
    """No `v1=` value matches the HMAC computed with the secret."""


class InvalidSecret(SignatureError):
    """The secret is empty or not a string: nothing can be verified (or signed) with it.

    An unset environment variable read as `""` must not turn into a key every forger
    knows, so this fails closed on every delivery.
    """


class InvalidBody(SignatureError):
    """The body given is not the raw bytes of the request."""


def _checked_secret(secret: object) -> str:
    if not isinstance(secret, str) or not secret:
        raise InvalidSecret(
            "the endpoint secret is empty or missing: set it (whsec_...) before verifying"
        )
    return secret


def compute(secret: str, timestamp: int | str, raw_body: bytes) -> str:
    """Hex HMAC-SHA256 of `<timestamp>.<raw_body>` keyed with the secret's UTF-8 bytes."""
    message = str(timestamp).encode("ascii") + b"." + bytes(raw_body)
    key = _checked_secret(secret).encode("utf-8")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def signature_header(secrets: Iterable[str], timestamp: int, raw_body: bytes) -> str:
    """`v1=<hex>` per secret, comma-separated, in the order given (newest first)."""
    return ",".join(f"{SCHEME}={compute(s, timestamp, raw_body)}" for s in secrets)


def sign_headers(
    secrets: Iterable[str],
    raw_body: bytes,
    event_id: str,
    delivery_id: str,
    *,
    timestamp: int | None = None,
) -> dict[str, str]:
    """All headers of a delivery."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature_header(secrets, ts, raw_body),
        TIMESTAMP_HEADER: str(ts),
        EVENT_ID_HEADER: event_id,
        DELIVERY_ID_HEADER: delivery_id,
    }


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == name:
            if not isinstance(value, str):
                raise MalformedHeader(f"{name} is not text")
            return value
    raise MissingHeader(f"missing header {name}")


def verify(
    secret: str,
    headers: Mapping[str, str],
    raw_body: bytes,
    tolerance: int = DEFAULT_TOLERANCE_S,
    *,
    now: float | None = None,
) -> int:
    """Check a delivery; return its timestamp or raise a SignatureError subclass.

    Compares in constant time against every `v1=` value, so it keeps working
    while a sender holds two secrets during rotation. Whatever the headers hold, the
    only exception is a SignatureError (answer 400); an empty or missing secret is
    refused (InvalidSecret), never treated as a key.
    """
    secret = _checked_secret(secret)
    if not isinstance(raw_body, bytes | bytearray | memoryview):
        raise InvalidBody("pass the raw request body as bytes, before any parsing or decoding")
    raw_ts = _header(headers, TIMESTAMP_HEADER).strip()
    if not _TIMESTAMP.fullmatch(raw_ts):
        raise MalformedHeader(f"{TIMESTAMP_HEADER} must be unix seconds")
    timestamp = int(raw_ts)
    clock = time.time() if now is None else now
    if abs(clock - timestamp) > tolerance:
        raise TimestampOutOfTolerance(
            f"timestamp {timestamp} is {abs(clock - timestamp):.0f}s from now (> {tolerance}s)"
        )
    values = []
    for part in _header(headers, SIGNATURE_HEADER).split(","):
        scheme, sep, value = part.strip().partition("=")
        if sep and scheme == SCHEME and value:
            values.append(value)
    if not values:
        raise MalformedHeader(f"{SIGNATURE_HEADER} has no {SCHEME}= value")
    expected = compute(secret, timestamp, raw_body).encode("ascii")
    matched = False
    for value in values:
        # Garbage (non-hex, non-ASCII) can never match; it is skipped rather than compared
        # because compare_digest raises TypeError on non-ASCII text.
        candidate = value.encode("ascii") if _HEX.fullmatch(value) else b""
        # Check every value, so timing does not tell which one matched.
        matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise SignatureMismatch("signature does not match the body and secret")
    return timestamp
