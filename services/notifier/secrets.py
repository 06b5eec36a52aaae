"""Endpoint signing secrets: made here, encrypted at rest, shown once.

Encryption is `shared.secretbox` (Fernet under a key derived from SETTLE_SECRET_KEY
with HKDF), with this purpose's own salt.
"""

from __future__ import annotations

import base64
import secrets

from shared import secretbox, signing
from shared.secretbox import SecretDecryptError

__all__ = ["PREFIX", "SECRET_BYTES", "SecretBox", "SecretDecryptError", "new_secret"]

PREFIX = signing.SECRET_PREFIX
#: Random bytes in a secret (DESIGN.md: at least 32).
SECRET_BYTES = 32
#: HKDF salt of the webhook secrets' key (changing it would make stored secrets unreadable).
SALT = b"settle-webhook-secrets"


def new_secret() -> str:
    """`whsec_` + 32 random bytes in standard base64 (with its padding).

    The form Standard Webhooks asks for, so its libraries read the key unchanged; Settle's
    own scheme keys the HMAC with the whole string, whatever its alphabet.
    """
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


class SecretBox(secretbox.SecretBox):
    """Encrypts and decrypts endpoint secrets with the service's secret key."""

    def __init__(self, secret_key: str) -> None:
        super().__init__(secret_key, salt=SALT)
