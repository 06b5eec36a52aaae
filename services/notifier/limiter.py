"""Per-endpoint concurrency within one worker process."""

from __future__ import annotations

import threading


class EndpointLimiter:
    """At most `limit` attempts at once to one endpoint in this process; never blocks."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._busy: dict[str, int] = {}
        self._lock = threading.Lock()

    def try_acquire(self, endpoint_id: str) -> bool:
        with self._lock:
            busy = self._busy.get(endpoint_id, 0)
            if busy >= self.limit:
                return False
            self._busy[endpoint_id] = busy + 1
            return True

    def release(self, endpoint_id: str) -> None:
        with self._lock:
            busy = self._busy.get(endpoint_id, 0) - 1
            if busy <= 0:
                self._busy.pop(endpoint_id, None)
            else:
                self._busy[endpoint_id] = busy

    def busy(self, endpoint_id: str) -> int:
        with self._lock:
            return self._busy.get(endpoint_id, 0)
