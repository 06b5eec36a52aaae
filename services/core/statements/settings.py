"""The statements' knobs: a frozen object that CoreConfig carries (`statements`).

Read from the environment once, by `CoreConfig.from_env`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass

from shared.settings import SettingsError, env_int, env_str

#: Bytes of an Ed25519 private key (its seed) and of a public key.
KEY_BYTES = 32


@dataclass(frozen=True)
class StatementSettings:
    #: Longest period a statement may cover, in days.
    max_days: int = 366
    #: Most deposits one statement may list; a period holding more is refused (422
    #: `statement_too_large`), to be asked for in shorter periods.
    max_deposits: int = 100_000
    #: Statements one process makes at once; one more is refused (503, Retry-After): a
    #: statement is seconds of CPU under the process's one GIL and holds a connection.
    concurrency: int = 1
    #: SETTLE_STATEMENT_SIGNING_KEY: an Ed25519 private key (32 bytes, base64). None:
    #: derived from SETTLE_SECRET_KEY (signing.py).
    signing_key: bytes | None = None
    #: SETTLE_STATEMENT_RETIRED_KEYS: public keys (32 bytes each, base64, comma-separated)
    #: of keys that signed statements before a rotation; still published, never used.
    retired_public_keys: tuple[bytes, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StatementSettings:
        max_days = env_int(env, "SETTLE_STATEMENT_MAX_DAYS", cls.max_days)
        max_deposits = env_int(env, "SETTLE_STATEMENT_MAX_DEPOSITS", cls.max_deposits)
        if not 1 <= max_days <= 3660:
            raise SettingsError(f"SETTLE_STATEMENT_MAX_DAYS must be 1..3660, got {max_days}")
        if max_deposits < 1:
            raise SettingsError(
                f"SETTLE_STATEMENT_MAX_DEPOSITS must be at least 1, got {max_deposits}"
            )
        concurrency = env_int(env, "SETTLE_STATEMENT_CONCURRENCY", cls.concurrency)
        if concurrency < 1:
            raise SettingsError(
                f"SETTLE_STATEMENT_CONCURRENCY must be at least 1, got {concurrency}"
            )
        key = env_str(env, "SETTLE_STATEMENT_SIGNING_KEY")
        retired = env_str(env, "SETTLE_STATEMENT_RETIRED_KEYS") or ""
        return cls(
            max_days=max_days,
            max_deposits=max_deposits,
            concurrency=concurrency,
            signing_key=None if key is None else key_bytes("SETTLE_STATEMENT_SIGNING_KEY", key),
            retired_public_keys=tuple(
                key_bytes("SETTLE_STATEMENT_RETIRED_KEYS", part)
                for part in retired.split(",")
                if part.strip()
            ),
        )


def key_bytes(name: str, text: str) -> bytes:
    """32 bytes written in base64 (standard or URL-safe, padded or not)."""
    cleaned = text.strip().replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(cleaned + "=" * (-len(cleaned) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise SettingsError(f"{name} must be base64 of {KEY_BYTES} bytes") from None
    if len(raw) != KEY_BYTES:
        raise SettingsError(f"{name} must be base64 of {KEY_BYTES} bytes, got {len(raw)}")
    return raw
