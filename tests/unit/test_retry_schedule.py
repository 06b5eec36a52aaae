"""When the next attempt of a failed delivery happens, and the per-endpoint limiter."""

from __future__ import annotations

import pytest

from services.notifier.limiter import EndpointLimiter
from services.notifier.retry_policy import retry_delay

SCHEDULE = (5.0, 60.0, 300.0)


@pytest.mark.parametrize(("attempt", "step"), [(1, 5.0), (2, 60.0), (3, 300.0)])
def test_each_failed_attempt_waits_its_step(attempt: int, step: float) -> None:
    # Given no jitter draw (rand = 0.5 is the middle of +-jitter)
    assert retry_delay(attempt, SCHEDULE, jitter=0.2, rand=lambda: 0.5) == step


def test_jitter_stays_within_its_fraction() -> None:
    assert retry_delay(2, SCHEDULE, jitter=0.2, rand=lambda: 0.0) == pytest.approx(48.0)
    assert retry_delay(2, SCHEDULE, jitter=0.2, rand=lambda: 1.0) == pytest.approx(72.0)


def test_no_retry_is_left_after_the_schedule() -> None:
    # Given three steps, the 4th failed attempt is the last
    assert retry_delay(4, SCHEDULE, jitter=0.2) is None
    assert retry_delay(0, SCHEDULE, jitter=0.2) is None


def test_retry_after_can_push_later_up_to_the_cap() -> None:
    assert retry_delay(1, SCHEDULE, jitter=0, retry_after_s=30) == 30
    assert retry_delay(1, SCHEDULE, jitter=0, retry_after_s=99999, retry_after_max_s=3600) == 3600


def test_retry_after_never_makes_a_retry_earlier_than_the_schedule() -> None:
    assert retry_delay(3, SCHEDULE, jitter=0, retry_after_s=1) == 300
    assert retry_delay(3, SCHEDULE, jitter=0, retry_after_s=0) == 300


def test_retry_after_cannot_shorten_a_step_longer_than_the_cap() -> None:
    # Given a 24 h step and a 1 h cap, a Retry-After of 2 h keeps the 24 h step
    assert retry_delay(1, (86400.0,), jitter=0, retry_after_s=7200, retry_after_max_s=3600) == 86400


def test_the_limiter_never_blocks_and_counts_per_endpoint() -> None:
    # Given two slots per endpoint
    limiter = EndpointLimiter(2)
    # When three attempts to one endpoint ask for a slot
    assert limiter.try_acquire("we_a") and limiter.try_acquire("we_a")
    # Then the third is told no at once, while another endpoint is unaffected
    assert not limiter.try_acquire("we_a")
    assert limiter.try_acquire("we_b")
    # And a released slot can be taken again
    limiter.release("we_a")
    assert limiter.busy("we_a") == 1
    assert limiter.try_acquire("we_a")
