"""Identifiers: a prefix that names the kind, then a time-ordered random part.

The random part is 26 Crockford base32 characters (48-bit millisecond clock + 80
random bits, like a ULID), so ids sort by creation time and keyset pagination on
the id alone is stable.
"""

from __future__ import annotations

import secrets
import time

#: Crockford's base32 alphabet: no I, L, O, U, so ids survive being read aloud.
_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, rem = divmod(value, 32)
        chars.append(_ALPHABET[rem])
    return "".join(reversed(chars))


def ulid(now_ms: int | None = None) -> str:
    """26 characters, sortable by creation time."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return _encode(ms, 10) + _encode(secrets.randbits(80), 16)


def new_id(prefix: str) -> str:
    """`<prefix>_<ulid>`, e.g. `acc_01JD3Y...`."""
    return f"{prefix}_{ulid()}"
