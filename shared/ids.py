"""Identifiers: a prefix that names the kind, then a time-ordered random part.

The random part is 26 Crockford base32 characters (48-bit millisecond clock + 80
random bits, like a ULID), so ids sort by creation time and keyset pagination on
the id alone is stable.
"""

from __future__ import annotations

import base64
import secrets
import time

#: Crockford's base32 alphabet: no I, L, O, U, so ids survive being read aloud.
_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: RFC 4648 base32 digit -> the Crockford digit of the same value.
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())


def ulid(now_ms: int | None = None) -> str:
    """26 characters, sortable by creation time."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms << 80) | secrets.randbits(80)  # 130 bits: 26 digits of 5 bits
    # The C base32 encoder on 160 bits (20 bytes, 32 digits): the first 26 digits are
    # ours, the last 6 the 30 zero bits shifted in. An id is made on every write.
    digits = base64.b32encode((value << 30).to_bytes(20, "big")).translate(_TO_CROCKFORD)
    return digits[:26].decode("ascii")


def new_id(prefix: str) -> str:
    """`<prefix>_<ulid>`, e.g. `acc_01JD3Y...`."""
    return f"{prefix}_{ulid()}"


#: Crockford digit -> its value.
_DIGIT_VALUE = {c: i for i, c in enumerate(_ALPHABET)}


def ulid_bytes(text: str) -> bytes:
    """The 16 bytes (128 bits) a 26-character ULID encodes; ValueError if it is not one."""
    if len(text) != 26 or not set(text) <= _DIGIT_VALUE.keys():
        raise ValueError(f"not a ULID: {text[:40]!r}")
    value = 0
    for char in text:
        value = (value << 5) | _DIGIT_VALUE[char]
    if value >> 128:
        raise ValueError(f"not a ULID: {text!r}")
    return value.to_bytes(16, "big")


def ulid_text(raw: bytes) -> str:
    """The 26-character ULID of 16 bytes (the inverse of `ulid_bytes`)."""
    if len(raw) != 16:
        raise ValueError("a ULID is 16 bytes")
    value = int.from_bytes(raw, "big")
    return "".join(_ALPHABET[(value >> (5 * i)) & 31] for i in range(25, -1, -1))


def ulid_time_prefix(ms: int) -> str:
    """The first 10 characters of every ULID made at millisecond `ms` (its clock part):
    ids made before `ms` sort below it, ids made at or after it at or above."""
    return ulid(ms)[:10]
