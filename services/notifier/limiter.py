"""Fair shares of one worker process: per endpoint and per tenant, never blocking.

A worker has `worker_threads` threads. No endpoint may hold more than
`endpoint_limit` of them and no tenant more than `tenant_limit` (its share), so a
tenant whose endpoints all hang or trickle leaves the other threads to everyone
else. An attempt over either limit is put back (see actors.Deliverer) rather than
waited for.
"""

from __future__ import annotations

import math
import threading


def share_of(threads: int, share: float) -> int:
    """Threads a `share` (0 < share <= 1) of `threads` allows: at least 1."""
    return max(1, math.floor(threads * share))


class EndpointLimiter:
    """At most `limit` attempts at once per endpoint and `tenant_limit` per tenant here."""

    def __init__(self, limit: int, tenant_limit: int | None = None) -> None:
        self.tenant_limit = max(1, tenant_limit if tenant_limit is not None else 1 << 30)
        self.limit = min(max(1, limit), self.tenant_limit)
        self._busy: dict[str, int] = {}
        self._tenants: dict[str, int] = {}
        self._lock = threading.Lock()

    def try_acquire(self, endpoint_id: str, tenant_id: str = "") -> bool:
        """A slot for one attempt, or False when the endpoint or its tenant has its share."""
        with self._lock:
            busy = self._busy.get(endpoint_id, 0)
            tenant = self._tenants.get(tenant_id, 0)
            if busy >= self.limit or tenant >= self.tenant_limit:
                return False
            self._busy[endpoint_id] = busy + 1
            self._tenants[tenant_id] = tenant + 1
            return True

    def release(self, endpoint_id: str, tenant_id: str = "") -> None:
        with self._lock:
            _drop(self._busy, endpoint_id)
            _drop(self._tenants, tenant_id)

    def busy(self, endpoint_id: str) -> int:
        with self._lock:
            return self._busy.get(endpoint_id, 0)

    def tenant_busy(self, tenant_id: str) -> int:
        with self._lock:
            return self._tenants.get(tenant_id, 0)


def _drop(counts: dict[str, int], key: str) -> None:
    left = counts.get(key, 0) - 1
    if left <= 0:
        counts.pop(key, None)
    else:
        counts[key] = left
