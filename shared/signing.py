"""Webhook signatures: `x-service-signature: v1=<hex HMAC-SHA256>`, and Standard Webhooks.

Settle's scheme: the HMAC key is the endpoint secret's UTF-8 bytes (the whole
`whsec_...` string); the message is `<timestamp>.<raw body>`. During a rotation overlap
the header carries one `v1=` value per valid secret, newest first: `v1=<new>,v1=<old>`.

Standard Webhooks (https://www.standardwebhooks.com/, an endpoint's
`signatureScheme: "standard"`): the key is the base64 decoding of the secret after its
`whsec_` prefix; the message is `<webhook-id>.<webhook-timestamp>.<raw body>`; the
`webhook-signature` header is `v1,<base64 HMAC-SHA256>` per valid secret, separated by
spaces, newest first. The same secret serves both schemes.

A receiver calls `verify(secret, headers, raw_body)`; see docs/WEBHOOKS.md.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Iterable, Mapping

SIGNATURE_HEADER = "x-service-signature"
TIMESTAMP_HEADER = "x-service-timestamp"
EVENT_ID_HEADER = "x-service-event-id"
DELIVERY_ID_HEADER = "x-service-delivery-id"
#: `1` on a delivery of a test event (`webhook.test`, "Send example"): never money.
TEST_HEADER = "x-service-test"
#: The id prefix of test events (shared/events.py: TEST_EVENT_PREFIX).
_TEST_EVENT_PREFIX = "evt_test_"
SCHEME = "v1"
#: Standard Webhooks' headers (sent besides ours when the endpoint asks for them).
STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
#: An endpoint's signatureScheme: ours alone, or ours and Standard Webhooks'.
SETTLE, STANDARD = "settle", "standard"
SIGNATURE_SCHEMES = (SETTLE, STANDARD)
#: Every secret starts with this (Standard Webhooks' libraries strip it before decoding).
SECRET_PREFIX = "whsec_"
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


def standard_key(secret: str) -> bytes:
    """The Standard Webhooks key of a secret: base64 of what follows `whsec_`, decoded.

    Secrets made before the standard scheme existed are URL-safe base64 without padding;
    they decode here too (the alphabet mapped, the padding restored), though the
    Standard Webhooks libraries cannot read them: rotate such a secret before switching.
    """
    text = _checked_secret(secret).removeprefix(SECRET_PREFIX)
    text = text.replace("-", "+").replace("_", "/")
    text += "=" * (-len(text) % 4)
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSecret("the secret is not whsec_ followed by base64") from None
    if not key:
        raise InvalidSecret("the secret's key is empty")
    return key


def is_standard_readable(secret: str) -> bool:
    """True when Standard Webhooks' libraries read the secret as `standard_key` does:
    `whsec_` then standard base64 with its padding (every secret made today)."""
    text = secret.removeprefix(SECRET_PREFIX)
    try:
        return bool(text) and base64.b64encode(base64.b64decode(text, validate=True)) == (
            text.encode("ascii")
        )
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False


def compute_standard(secret: str, message_id: str, timestamp: int | str, raw_body: bytes) -> str:
    """Base64 HMAC-SHA256 of `<message_id>.<timestamp>.<raw_body>` keyed with `standard_key`."""
    message = f"{message_id}.{timestamp}.".encode() + bytes(raw_body)
    digest = hmac.new(standard_key(secret), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def standard_signature_header(
    secrets: Iterable[str], message_id: str, timestamp: int, raw_body: bytes
) -> str:
    """`v1,<base64>` per secret, space-separated, in the order given (newest first)."""
    return " ".join(
        f"{SCHEME},{compute_standard(s, message_id, timestamp, raw_body)}" for s in secrets
    )


def sign_headers(
    secrets: Iterable[str],
    raw_body: bytes,
    event_id: str,
    delivery_id: str,
    *,
    timestamp: int | None = None,
    scheme: str = SETTLE,
) -> dict[str, str]:
    """All headers of a delivery: ours always; Standard Webhooks' too for `STANDARD`.

    The Standard Webhooks message id is the event id: the same on every retry and
    replay, so a receiver deduplicating on `webhook-id` sees one message per event.
    """
    ts = int(time.time()) if timestamp is None else timestamp
    secrets = list(secrets)
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature_header(secrets, ts, raw_body),
        TIMESTAMP_HEADER: str(ts),
        EVENT_ID_HEADER: event_id,
        DELIVERY_ID_HEADER: delivery_id,
    }
    if scheme == STANDARD:
        headers[STANDARD_ID_HEADER] = event_id
        headers[STANDARD_TIMESTAMP_HEADER] = str(ts)
        headers[STANDARD_SIGNATURE_HEADER] = standard_signature_header(
            secrets, event_id, ts, raw_body
        )
    headers.update(marked_as_test(event_id))
    return headers


def marked_as_test(event_id: str) -> dict[str, str]:
    """`x-service-test: 1` for a test event's delivery, nothing for a real one."""
    return {TEST_HEADER: "1"} if event_id.startswith(_TEST_EVENT_PREFIX) else {}


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
