"""Endpoint signing secrets: made here, encrypted at rest, shown once.

Encryption is `shared.secretbox` (Fernet under a key derived from SETTLE_SECRET_KEY
with HKDF), with this purpose's own salt.
"""

from __future__ import annotations

import secrets

from shared import secretbox
from shared.secretbox import SecretDecryptError

__all__ = ["PREFIX", "SECRET_BYTES", "SecretBox", "SecretDecryptError", "new_secret"]

PREFIX = "whsec_"
#: Random bytes in a secret (DESIGN.md: at least 32).
SECRET_BYTES = 32
#: HKDF salt of the webhook secrets' key (changing it would make stored secrets unreadable).
SALT = b"settle-webhook-secrets"


def new_secret() -> str:
    """`whsec_` + 32 random bytes, URL-safe base64."""
    return PREFIX + secrets.token_urlsafe(SECRET_BYTES)


class SecretBox(secretbox.SecretBox):
    """Encrypts and decrypts endpoint secrets with the service's secret key."""

    def __init__(self, secret_key: str) -> None:
        super().__init__(secret_key, salt=SALT)
