"""When a delivery is tried again: after a failure (the retry schedule) and when busy.

Pure functions of the attempt so far; the worker (actors.py) applies them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from services.notifier.config import MIN_LEASE_MARGIN_S


@dataclass(frozen=True)
class DeliveryTuning:
    """Knobs of the attempt logic beyond NotifierConfig (see delivery_engine.EngineSettings)."""

    #: Added to the attempt's deadline to make the lease: the attempt is recorded by then.
    lease_margin_s: float = 5.0
    #: A message may claim a delivery due this much later (clock skew, early delayed messages).
    due_slack_s: float = 0.25
    #: First and longest wait before a delivery whose endpoint is saturated is tried again.
    saturated_first_s: float = 0.05
    saturated_max_s: float = 5.0
    #: Longest an ordered delivery waits for the events numbered before its own to arrive
    #: (two relays or consumers may store them out of order; see ordering.py).
    order_gap_wait_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.lease_margin_s >= MIN_LEASE_MARGIN_S:
            raise ValueError(
                f"lease_margin_s must be at least {MIN_LEASE_MARGIN_S} s: the lease must "
                "outlast the attempt's deadline"
            )


def retry_delay(
    attempt_number: int,
    schedule: tuple[float, ...],
    *,
    jitter: float,
    retry_after_s: float | None = None,
    retry_after_max_s: float = 3600.0,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """Seconds until the attempt after `attempt_number` (1-based), or None when none is left.

    The schedule step gets +-`jitter` (a fraction). A receiver's Retry-After can
    push the retry later, up to `retry_after_max_s`, never earlier than the step.
    """
    if attempt_number < 1 or attempt_number > len(schedule):
        return None
    step = schedule[attempt_number - 1]
    delay = step * (1.0 + jitter * (2.0 * rand() - 1.0))
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, retry_after_max_s))
    return max(0.0, delay)


def saturated_delay(bounces: int, tuning: DeliveryTuning) -> float:
    """Seconds before a delivery put back `bounces` times (endpoint saturated) is tried again.

    Doubling from `saturated_first_s` up to `saturated_max_s`, plus up to 50 % at random
    so deliveries put back together do not come back together.
    """
    delay = min(tuning.saturated_max_s, tuning.saturated_first_s * (2**bounces))
    return delay * random.uniform(1.0, 1.5)
