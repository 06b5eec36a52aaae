"""The key that signs statements: Ed25519, over the exact bytes of a statement.

Where it comes from: SETTLE_STATEMENT_SIGNING_KEY when set (32 bytes, base64), else
derived from SETTLE_SECRET_KEY with HKDF-SHA256 under a salt of its own (so it shares
nothing with the keys that encrypt secrets at rest). Its id is `stk_` and the first 16
hex digits of SHA-256 over the raw public key: anyone holding the public key computes
the same id, and a rotated key has another.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from services.core.statements.settings import KEY_BYTES, StatementSettings

ALGORITHM = "Ed25519"
#: HKDF's salt and info for the derived key: changing either changes the key.
_SALT = b"settle.statements"
_INFO = b"ed25519-signing-key-v1"


def derive_seed(secret_key: str) -> bytes:
    """The Ed25519 private key (seed) SETTLE_SECRET_KEY gives."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=_SALT, info=_INFO)
    return hkdf.derive(secret_key.encode("utf-8"))


def key_id(public_key: bytes) -> str:
    return "stk_" + hashlib.sha256(public_key).hexdigest()[:16]


@dataclass(frozen=True)
class PublicKey:
    """A public key as GET /v1/statements/key publishes it."""

    raw: bytes

    @property
    def key_id(self) -> str:
        return key_id(self.raw)

    @property
    def algorithm(self) -> str:
        return ALGORITHM

    @property
    def public_key(self) -> str:
        """The raw key, base64."""
        return base64.b64encode(self.raw).decode("ascii")

    @property
    def public_key_pem(self) -> str:
        """The key as PEM (SubjectPublicKeyInfo), as `openssl pkey -pubin` reads it."""
        pem = Ed25519PublicKey.from_public_bytes(self.raw).public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return pem.decode("ascii")


class StatementSigner:
    """Signs statements with the current key; knows the retired keys' public halves."""

    def __init__(self, seed: bytes, retired: tuple[bytes, ...] = ()) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        raw = self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public = PublicKey(raw)
        self.retired = tuple(PublicKey(r) for r in retired if r != raw)

    @classmethod
    def from_settings(cls, settings: StatementSettings, secret_key: str) -> StatementSigner:
        seed = settings.signing_key or derive_seed(secret_key)
        return cls(seed, settings.retired_public_keys)

    @property
    def key_id(self) -> str:
        return self.public.key_id

    def sign(self, data: Any) -> bytes:
        """The 64-byte signature of `data` (bytes, or any buffer: a mapped file)."""
        return self._key.sign(data)
