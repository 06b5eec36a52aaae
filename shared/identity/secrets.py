"""Making and checking the secrets of identity: API keys, passwords, session tokens."""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()


@functools.cache
def _dummy_hash() -> str:
    """Checked against when the email is unknown, so both paths take as long.

    Made on first use, not at import: a hash costs ~0.1-0.5 s of CPU, which every
    process (and `settle --help`) would otherwise pay at start.
    """
    return _hasher.hash("settle-dummy-password")


def token_hash(token: str) -> str:
    """SHA-256 hex of a high-entropy token (API keys, session tokens, CSRF tokens).

    These tokens carry 256 random bits, so a fast hash is safe; lookups stay O(1).
    """
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def new_api_key() -> str:
    return "sk_" + secrets.token_urlsafe(32)


def new_session_token() -> str:
    return "sst_" + secrets.token_urlsafe(32)


def new_link_token() -> str:
    return "plk_" + secrets.token_urlsafe(32)


def new_csrf_token() -> str:
    return "csrf_" + secrets.token_urlsafe(24)


def hash_password(password: str) -> str:
    """argon2id, argon2-cffi's default parameters."""
    return _hasher.hash(password)


def check_password(password_hash: str | None, password: str) -> bool:
    """Constant work whether or not the member exists."""
    try:
        checked = _hasher.verify(password_hash or _dummy_hash(), password)
        return checked and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False
