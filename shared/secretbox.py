"""Encryption at rest for short secrets, under keys derived from SETTLE_SECRET_KEY.

Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) under a key derived with
HKDF-SHA256, one derived key per purpose (the salt), so the webhook secrets and the
idempotency records never share a key and any length of setting works.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


class SecretDecryptError(RuntimeError):
    """A stored value cannot be decrypted: SETTLE_SECRET_KEY changed?"""


def _derive(secret_key: str, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(
        secret_key.encode("utf-8")
    )


class SecretBox:
    """Encrypts and decrypts text with the service's secret key, for one purpose (`salt`)."""

    def __init__(self, secret_key: str, *, salt: bytes) -> None:
        self._fernet = Fernet(base64.urlsafe_b64encode(_derive(secret_key, salt, b"v1")))
        self._mac_key = _derive(secret_key, salt, b"mac-v1")

    def encrypt(self, plain: str) -> str:
        return self._fernet.encrypt(plain.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError):
            raise SecretDecryptError(
                "stored value does not decrypt with SETTLE_SECRET_KEY"
            ) from None

    def digest(self, data: bytes) -> str:
        """Keyed hex HMAC-SHA256 of `data`: a fingerprint that reveals nothing of it."""
        return hmac.new(self._mac_key, data, hashlib.sha256).hexdigest()
