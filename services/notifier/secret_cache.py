"""Decrypted endpoint secrets, cached per worker process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

from services.notifier.secrets import SecretBox
from services.notifier.webhook_endpoints import SecretFields, signing_secrets


class SecretCache:
    """Decrypted endpoint secrets, keyed by their ciphertext, per process.

    A Fernet decrypt (HMAC check + AES) per attempt is a measurable share of the
    worker's CPU. Keying by the stored token, not the endpoint id, means a rotation
    (a new token) applies on the very next attempt: a cached entry can never be
    stale, only unused. Entries expire after `ttl_s` so the plaintext of a deleted
    or rotated secret does not stay in memory for long, and the cache is bounded.
    """

    def __init__(
        self,
        box: SecretBox,
        *,
        ttl_s: float = 300.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.box = box
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def decrypt(self, token: str) -> str:
        """The plaintext of `token`; raises SecretDecryptError like SecretBox.decrypt."""
        now = self._clock()
        entry = self._entries.get(token)
        if entry is not None and entry[1] > now:
            return entry[0]
        secret = self.box.decrypt(token)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                # Rare (more live secrets than entries): start over rather than track LRU.
                self._entries.clear()
            self._entries[token] = (secret, now + self.ttl_s)
        return secret

    def signing_secrets(self, endpoint: SecretFields, now: datetime) -> list[str]:
        """webhook_endpoints.signing_secrets, decrypting through this cache."""
        return signing_secrets(endpoint, self, now)
