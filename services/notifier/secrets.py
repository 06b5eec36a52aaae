"""Endpoint signing secrets: made here, encrypted at rest, shown once.

Encryption is Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) under a key
derived from SETTLE_SECRET_KEY with HKDF, so any length of setting works.
"""

from __future__ import annotations

import base64
import hmac
import secrets

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PREFIX = "whsec_"
#: Random bytes in a secret (DESIGN.md: at least 32).
SECRET_BYTES = 32


class SecretDecryptError(RuntimeError):
    """A stored secret cannot be decrypted: SETTLE_SECRET_KEY changed?"""


def new_secret() -> str:
    """`whsec_` + 32 random bytes, URL-safe base64."""
    return PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def same_secret(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class SecretBox:
    """Encrypts and decrypts endpoint secrets with the service's secret key."""

    def __init__(self, secret_key: str) -> None:
        derived = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=b"settle-webhook-secrets", info=b"v1"
        ).derive(secret_key.encode("utf-8"))
        self._fernet = Fernet(base64.urlsafe_b64encode(derived))

    def encrypt(self, secret: str) -> str:
        return self._fernet.encrypt(secret.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except InvalidToken:
            raise SecretDecryptError(
                "stored secret does not decrypt with SETTLE_SECRET_KEY"
            ) from None
