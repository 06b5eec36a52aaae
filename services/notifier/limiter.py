"""Fair shares of one worker process: per endpoint and per tenant, never blocking.

A worker has `worker_threads` threads. No endpoint may hold more than
`endpoint_limit` of them and no tenant more than `tenant_limit` (its share), so a
tenant whose endpoints all hang or trickle leaves the other threads to everyone
else. An attempt over either limit is put back (see actors.Deliverer) rather than
waited for.

The tenant share is work-conserving: while no other tenant has an attempt in flight
here, nor started one within the last attempt deadline, a tenant may use every thread
but a small reserve, so a worker serving one
busy tenant runs at full speed (a fixed share halved a lone tenant's throughput and
put its deliveries back for nothing). The reserve is what another tenant finds free
the moment it shows up; from then on each tenant is held to its share again.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


def share_of(threads: int, share: float) -> int:
    """Threads a `share` (0 < share <= 1) of `threads` allows: at least 1."""
    return max(1, math.floor(threads * share))


def reserve_of(threads: int) -> int:
    """Threads a lone tenant leaves free for the next tenant to show up: an eighth, at least 1."""
    return max(1, threads // 8)


class EndpointLimiter:
    """At most `limit` attempts at once per endpoint and `tenant_limit` per tenant here."""

    def __init__(
        self,
        limit: int,
        tenant_limit: int | None = None,
        *,
        threads: int | None = None,
        alone_after_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tenant_limit = max(1, tenant_limit if tenant_limit is not None else 1 << 30)
        self.limit = max(1, limit)
        #: What a tenant alone here may use: all threads but the reserve (at least its share).
        self.alone_limit = (
            max(self.tenant_limit, threads - reserve_of(threads))
            if threads is not None
            else self.tenant_limit
        )
        #: A tenant counts as alone only when no other started an attempt for this long
        #: (one attempt deadline): a bursty tenant between bursts keeps the others capped.
        self.alone_after_s = alone_after_s
        self._clock = clock
        self._busy: dict[str, int] = {}
        self._tenants: dict[str, int] = {}
        #: The last two distinct tenants to start an attempt, and when: (tenant, time).
        self._latest: tuple[str, float] = ("", float("-inf"))
        self._before: tuple[str, float] = ("", float("-inf"))
        self._lock = threading.Lock()

    def try_acquire(self, endpoint_id: str, tenant_id: str = "") -> bool:
        """A slot for one attempt, or False when the endpoint or its tenant has its share."""
        with self._lock:
            busy = self._busy.get(endpoint_id, 0)
            tenant = self._tenants.get(tenant_id, 0)
            if busy >= self.limit or tenant >= self._tenant_cap(tenant_id):
                return False
            self._busy[endpoint_id] = busy + 1
            self._tenants[tenant_id] = tenant + 1
            now = self._clock()
            if self._latest[0] != tenant_id:
                self._before = self._latest
            self._latest = (tenant_id, now)
            return True

    def _tenant_cap(self, tenant_id: str) -> int:
        """The tenant's share, or more while no other tenant has attempts here, nor had lately."""
        others_busy = len(self._tenants) > (1 if tenant_id in self._tenants else 0)
        if others_busy:
            return self.tenant_limit
        other_last = self._before[1] if self._latest[0] == tenant_id else self._latest[1]
        if self._clock() - other_last < self.alone_after_s:
            return self.tenant_limit
        return self.alone_limit

    def is_full(self, endpoint_id: str, tenant_id: str) -> bool:
        """Would `try_acquire` refuse now? (A hint, read without the lock: no slot taken.)"""
        return not (self.endpoint_room(endpoint_id) and self.room(tenant_id))

    def endpoint_room(self, endpoint_id: str) -> int:
        """How many more attempts the endpoint may start here now (a hint: no slot taken)."""
        return max(0, self.limit - self._busy.get(endpoint_id, 0))

    def room(self, tenant_id: str) -> int:
        """How many more attempts the tenant may start here now (a hint: no slot taken)."""
        return max(0, self._tenant_cap(tenant_id) - self._tenants.get(tenant_id, 0))

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


class EndpointRates:
    """Each endpoint's own `rateLimitPerSecond` in this process: a bucket of one token.

    An attempt takes the token; it comes back after 1/rate seconds, so attempts are
    paced evenly, never in bursts.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next: dict[str, float] = {}
        self._lock = threading.Lock()

    def wait_s(self, endpoint_id: str, rate: float | None) -> float:
        """0 and the token taken, or how long until the endpoint's next token."""
        if not rate:
            return 0.0
        with self._lock:
            now = self._clock()
            due = self._next.get(endpoint_id, 0.0)
            if due > now:
                return due - now
            self._next[endpoint_id] = now + 1.0 / rate
            if len(self._next) > 10_000:
                # Forget endpoints whose token is back (bounded memory).
                self._next = {k: v for k, v in self._next.items() if v > now}
            return 0.0


class WaitingRoom:
    """Deliveries put back for want of a slot here, waiting by tenant for one to free up.

    A put-back delivery is due again at once in the database, but its job waits here
    (in memory) instead of bouncing through the broker every few seconds: when an
    attempt of its tenant ends, the next waiting deliveries whose endpoints have a free
    slot are sent on, and one that has waited `max_wait_s` is sent on if it can start
    here now (else it waits on: an attempt of its tenant here ends soon and wakes it).
    The worker keeps the rows of waiting deliveries due (actors.Deliverer.keep_waiting)
    so the sweeper leaves them alone; losing this memory (a restart) loses nothing: the
    rows are due, and the sweeper sends them a grace later.
    """

    #: How far into a tenant's queue a freed slot looks for an endpoint that can go.
    SCAN = 64

    def __init__(
        self,
        *,
        max_waiting: int = 100_000,
        max_wait_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._by_tenant: dict[str, deque[Waiting]] = {}
        #: The deliveries waiting here (their number is the room's length).
        self._waiting_ids: set[str] = set()
        self._lock = threading.Lock()

    def park(self, tenant_id: str, endpoint_id: str, delivery_id: str, bounces: int) -> bool:
        """Wait for a slot of the tenant; False when the room is full (bounce instead).

        A delivery already waiting here is not added twice (True: this job is a repeat,
        e.g. the sweeper's, which finds waiting deliveries due with no lease)."""
        with self._lock:
            if delivery_id in self._waiting_ids:
                return True
            if len(self._waiting_ids) >= self.max_waiting:
                return False
            self._by_tenant.setdefault(tenant_id, deque()).append(
                Waiting(delivery_id, endpoint_id, tenant_id, bounces, self._clock())
            )
            self._waiting_ids.add(delivery_id)
            return True

    def take(self, tenant_id: str, can_go: Callable[[str], bool], most: int) -> list[Waiting]:
        """Up to `most` of the tenant's longest-waiting deliveries whose endpoint `can_go`."""
        taken: list[Waiting] = []
        with self._lock:
            waiting = self._by_tenant.get(tenant_id)
            if not waiting:
                return taken
            kept: list[Waiting] = []
            while waiting and len(taken) < most and len(kept) < self.SCAN:
                entry = waiting.popleft()
                (taken if can_go(entry.endpoint_id) else kept).append(entry)
            waiting.extendleft(reversed(kept))
            self._waiting_ids.difference_update(entry.delivery_id for entry in taken)
            if not waiting:
                del self._by_tenant[tenant_id]
        return taken

    def overdue(self, can_go: Callable[[str, str], bool]) -> list[Waiting]:
        """Deliveries that have waited `max_wait_s` or more and `can_go` (endpoint,
        tenant), taken out. One that cannot go waits on, its time renewed: its tenant's
        slots here are all busy, so one of its attempts here ends soon and wakes it
        (sending them all on would only bring them back, a storm every `max_wait_s`)."""
        if not self._waiting_ids:
            return []
        now = self._clock()
        limit = now - self.max_wait_s
        taken: list[Waiting] = []
        with self._lock:
            for tenant_id in list(self._by_tenant):
                waiting = self._by_tenant[tenant_id]
                looked = 0
                while waiting and waiting[0].parked_at <= limit and looked < self.SCAN:
                    entry = waiting.popleft()
                    looked += 1
                    if can_go(entry.endpoint_id, tenant_id):
                        taken.append(entry)
                    else:
                        waiting.append(
                            Waiting(
                                entry.delivery_id, entry.endpoint_id, tenant_id, entry.bounces, now
                            )
                        )
                if not waiting:
                    del self._by_tenant[tenant_id]
            self._waiting_ids.difference_update(entry.delivery_id for entry in taken)
        return taken

    def ids(self) -> list[str]:
        """The deliveries waiting here now (a copy)."""
        with self._lock:
            return list(self._waiting_ids)

    def __len__(self) -> int:
        return len(self._waiting_ids)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A delivery in the waiting room."""

    delivery_id: str
    endpoint_id: str
    tenant_id: str
    bounces: int
    parked_at: float
