"""Verify Settle webhook deliveries.

    from settle_webhooks import WebhookVerificationError, verify

    try:
        event = verify(secret, request.headers, request.get_data())  # the raw body bytes
    except WebhookVerificationError:
        return "", 400
    # deduplicate on event["id"], then act on event["type"] and event["data"]

A delivery carries `x-service-timestamp` (unix seconds) and `x-service-signature`:
`v1=<hex HMAC-SHA256>` keyed with the endpoint secret's UTF-8 bytes, over
`<timestamp>.<raw body>`. During a secret rotation it holds one `v1=` value per
valid secret (`v1=<new>,v1=<old>`); any match is enough. Deliveries whose timestamp
is more than `tolerance` seconds (300) from this machine's clock are refused, so a
captured delivery cannot be replayed later.

No dependencies beyond the standard library.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "InvalidSignature",
    "MalformedHeader",
    "MissingHeader",
    "TimestampOutOfTolerance",
    "WebhookVerificationError",
    "sign",
    "sign_standard",
    "verify",
    "verify_standard",
]

__version__ = "1.0.0"

SIGNATURE_HEADER = "x-service-signature"
TIMESTAMP_HEADER = "x-service-timestamp"
#: Deliveries further than this from the receiver's clock are refused (seconds).
DEFAULT_TOLERANCE_S = 300
_SCHEME = "v1"
#: Longest header value read: a rotation carries two values, leave room for more.
_MAX_HEADER = 4096


class WebhookVerificationError(Exception):
    """The delivery is not authentic or not fresh: answer 400 and drop it."""


class MissingHeader(WebhookVerificationError):
    """The signature or timestamp header is absent."""


class MalformedHeader(WebhookVerificationError):
    """A header is present but cannot be read."""


class TimestampOutOfTolerance(WebhookVerificationError):
    """The timestamp is too far from this machine's clock (a replay, or a wrong clock)."""


class InvalidSignature(WebhookVerificationError):
    """No `v1=` value matches the body signed with the secret."""


def sign(secret: str, timestamp: int | str, body: bytes | str) -> str:
    """The hex HMAC-SHA256 Settle puts after `v1=` (useful in your own tests)."""
    _check_secret(secret)
    message = str(timestamp).encode("ascii") + b"." + _as_bytes(body)
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def verify(
    secret: str,
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: bytes | str,
    *,
    tolerance: int = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a delivery and return its event (the parsed body).

    `headers` is any mapping (Flask/Werkzeug, Django's `request.headers`, a dict) or a
    list of (name, value) pairs; names are matched case-insensitively. `body` must be
    the raw bytes as received: JSON parsed and serialised again will not match.
    Raises a `WebhookVerificationError` subclass when the delivery is not genuine or
    not fresh, and `ValueError` for an empty secret (a configuration error).
    """
    _check_secret(secret)
    raw = _as_bytes(body)
    timestamp = _timestamp(_header(headers, TIMESTAMP_HEADER), tolerance, now)
    offered = _signatures(_header(headers, SIGNATURE_HEADER))
    expected = sign(secret, timestamp, raw).encode("ascii")
    matched = False
    for value in offered:
        # Compare with every value, so the time taken does not tell which one matched.
        matched |= hmac.compare_digest(expected, value)
    if not matched:
        raise InvalidSignature("no v1= signature matches the body and the secret")
    return _event(raw)


def _event(raw: bytes) -> dict[str, Any]:
    try:
        event = json.loads(raw.decode("utf-8"))
    except ValueError:
        raise MalformedHeader("the body is not UTF-8 JSON") from None
    if not isinstance(event, dict):
        raise MalformedHeader("the body is not a JSON object")
    return event


# -- Standard Webhooks (an endpoint with signatureScheme "standard") --------------------

STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"


def _standard_key(secret: str) -> bytes:
    """The key of the standard scheme: the base64 after `whsec_`, decoded."""
    _check_secret(secret)
    text = secret[len("whsec_") :] if secret.startswith("whsec_") else secret
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the secret is not whsec_ followed by base64: rotate it") from None
    if not key:
        raise ValueError("the secret's key is empty")
    return key


def sign_standard(secret: str, message_id: str, timestamp: int | str, body: bytes | str) -> str:
    """The base64 HMAC-SHA256 Standard Webhooks puts after `v1,`."""
    message = f"{message_id}.{timestamp}.".encode() + _as_bytes(body)
    digest = hmac.new(_standard_key(secret), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def verify_standard(
    secret: str,
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    body: bytes | str,
    *,
    tolerance: int = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> dict[str, Any]:
    """`verify` for Standard Webhooks' headers (webhook-id, webhook-timestamp,
    webhook-signature: `v1,<base64>` values separated by spaces)."""
    raw = _as_bytes(body)
    message_id = _header(headers, STANDARD_ID_HEADER)
    timestamp = _timestamp(_header(headers, STANDARD_TIMESTAMP_HEADER), tolerance, now)
    expected = sign_standard(secret, message_id, timestamp, raw).encode("ascii")
    offered = [
        part[len("v1,") :].encode("ascii", "replace")
        for part in _header(headers, STANDARD_SIGNATURE_HEADER).split(" ")
        if part.startswith("v1,")
    ]
    if not offered:
        raise MalformedHeader(f"{STANDARD_SIGNATURE_HEADER} has no v1, value")
    matched = False
    for value in offered:
        matched |= hmac.compare_digest(expected, value)
    if not matched:
        raise InvalidSignature("no v1, signature matches the body and the secret")
    return _event(raw)


def _check_secret(secret: object) -> None:
    if not isinstance(secret, str) or not secret:
        # An empty key would make every forger's HMAC "valid" for anyone who guesses it.
        raise ValueError("the endpoint secret is empty: set it to the whsec_... value")


def _as_bytes(body: bytes | str) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError("body must be the raw request body (bytes)")


def _header(headers: Mapping[str, str] | Iterable[tuple[str, str]], name: str) -> str:
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if str(key).lower() == name:
            text = str(value)
            if len(text) > _MAX_HEADER:
                raise MalformedHeader(f"{name} is too long")
            return text
    raise MissingHeader(f"missing header {name}")


def _timestamp(raw: str, tolerance: int, now: float | None) -> int:
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 12:
        raise MalformedHeader(f"{TIMESTAMP_HEADER} must be unix seconds")
    timestamp = int(text)
    clock = time.time() if now is None else now
    if abs(clock - timestamp) > tolerance:
        raise TimestampOutOfTolerance(
            f"timestamp {timestamp} is {abs(clock - timestamp):.0f}s from this clock "
            f"(more than {tolerance}s)"
        )
    return timestamp


def _signatures(raw: str) -> list[bytes]:
    values = []
    for part in raw.split(","):
        scheme, sep, value = part.strip().partition("=")
        if sep and scheme == _SCHEME and value:
            try:
                values.append(value.encode("ascii"))
            except UnicodeEncodeError:
                continue  # not hex: cannot match
    if not values:
        raise MalformedHeader(f"{SIGNATURE_HEADER} has no {_SCHEME}= value")
    return values
