"""A circuit breaker per endpoint, per worker process: stop hammering what always fails.

After `threshold` attempts in a row fail, the endpoint's breaker opens: its
deliveries are put back until the cool-down ends (no attempt, no attempt number
spent, so the retry schedule does not run out meanwhile). Then one attempt at a time
goes as a probe: a success closes the breaker and everything flows; a failure opens
it again for twice as long (up to `max_cooldown_s`). Any answer that is not a 2xx
counts as a failure, as for the endpoint's failure streak.

State lives in each worker process (N processes probe N times per cool-down); it is
rebuilt from the first failures after a restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: A breaker's states as `states()` and the metrics name them (closed ones have none).
OPEN, HALF_OPEN = "open", "half_open"


@dataclass
class _State:
    failures: int = 0
    open_until: float = 0.0
    cooldown_s: float = 0.0
    probing: bool = False


class CircuitBreakers:
    """Every endpoint's breaker in this process (only failing endpoints have state)."""

    def __init__(
        self,
        *,
        threshold: int,
        cooldown_s: float,
        max_cooldown_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = max(1, threshold)
        self.cooldown_s = cooldown_s
        self.max_cooldown_s = max(cooldown_s, max_cooldown_s)
        self._clock = clock
        self._states: dict[str, _State] = {}
        self._lock = threading.Lock()

    def wait_s(self, endpoint_id: str, *, peek: bool = False) -> float:
        """0 when an attempt may go now (maybe as the probe); else seconds to wait first.

        `peek`: only look; the probe is not taken (the claim's path takes it).
        """
        if endpoint_id not in self._states:  # the common case, without the lock
            return 0.0
        with self._lock:
            state = self._states.get(endpoint_id)
            if state is None or state.failures < self.threshold:
                return 0.0
            now = self._clock()
            if now < state.open_until:
                return state.open_until - now
            if state.probing:
                # One probe at a time; the others look again a little later.
                return min(1.0, state.cooldown_s)
            if not peek:
                state.probing = True
            return 0.0

    def release_probe(self, endpoint_id: str) -> None:
        """The probe taken by `wait_s` made no attempt (or its outcome is recorded): free it.

        Without this, a probe that ended without an outcome (put back, paced, an error
        before sending) left the endpoint half-open for good: every later delivery held.
        """
        if endpoint_id not in self._states:
            return
        with self._lock:
            state = self._states.get(endpoint_id)
            if state is not None:
                state.probing = False

    def record(self, endpoint_id: str, *, ok: bool) -> bool:
        """The outcome of an attempt; True when this failure opened (or re-opened) it."""
        if ok:
            if endpoint_id in self._states:
                with self._lock:
                    self._states.pop(endpoint_id, None)
            return False
        with self._lock:
            state = self._states.setdefault(endpoint_id, _State())
            state.failures += 1
            if state.failures < self.threshold:
                return False
            if state.probing or state.open_until == 0.0:
                state.cooldown_s = (
                    self.cooldown_s
                    if state.open_until == 0.0
                    else min(self.max_cooldown_s, state.cooldown_s * 2)
                )
                state.open_until = self._clock() + state.cooldown_s
                state.probing = False
                return True
            return False

    def states(self) -> dict[str, int]:
        """How many endpoints' breakers are OPEN (cooling down) and HALF_OPEN (a probe may go
        or is out)."""
        counts = {OPEN: 0, HALF_OPEN: 0}
        now = self._clock()
        with self._lock:
            for state in self._states.values():
                if state.failures >= self.threshold:
                    counts[OPEN if now < state.open_until else HALF_OPEN] += 1
        return counts

    def open_count(self) -> int:
        """Endpoints whose breaker is open or probing."""
        with self._lock:
            return sum(1 for s in self._states.values() if s.failures >= self.threshold)
