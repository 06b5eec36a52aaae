"""The worker's fair shares (limiter.py) and the circuit breaker (breaker.py), without I/O."""

from __future__ import annotations

from services.notifier.breaker import CircuitBreakers
from services.notifier.limiter import EndpointLimiter, share_of


def test_a_tenant_holds_at_most_its_share_whatever_its_endpoints() -> None:
    # Given 16 threads, half for any one tenant, 4 for any one endpoint
    limiter = EndpointLimiter(4, share_of(16, 0.5))
    # When one tenant tries 3 endpoints x 4 attempts
    got = [limiter.try_acquire(f"ep{e}", "hostile") for e in range(3) for _ in range(4)]
    # Then it gets 8 slots, and another tenant still gets its own
    assert sum(got) == 8
    assert limiter.try_acquire("ep9", "other")
    # And a released slot is free again
    limiter.release("ep0", "hostile")
    assert limiter.try_acquire("ep2", "hostile")
    assert limiter.tenant_busy("hostile") == 8


def test_shares_are_at_least_one_thread() -> None:
    assert share_of(1, 0.5) == 1
    assert share_of(16, 0.25) == 4
    assert EndpointLimiter(8, 2).limit == 2  # an endpoint never gets more than its tenant


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_opens_after_failures_in_a_row_and_probes_one_at_a_time() -> None:
    clock = Clock()
    breakers = CircuitBreakers(threshold=3, cooldown_s=10, max_cooldown_s=40, clock=clock)
    # Given two failures, then a success: still closed
    breakers.record("ep", ok=False)
    breakers.record("ep", ok=False)
    breakers.record("ep", ok=True)
    assert breakers.wait_s("ep") == 0
    # When three attempts in a row fail
    opened = [breakers.record("ep", ok=False) for _ in range(3)]
    # Then it opens on the third and holds deliveries for the cool-down
    assert opened == [False, False, True]
    assert breakers.wait_s("ep") == 10
    # And after the cool-down one probe goes; the others wait
    clock.now += 10
    assert breakers.wait_s("ep") == 0
    assert breakers.wait_s("ep") > 0
    # And a failed probe opens it for twice as long, up to the maximum
    assert breakers.record("ep", ok=False)
    assert breakers.wait_s("ep") == 20
    clock.now += 20
    assert breakers.wait_s("ep") == 0
    breakers.record("ep", ok=False)
    clock.now += 40
    assert breakers.wait_s("ep") == 0
    breakers.record("ep", ok=False)
    assert breakers.wait_s("ep") == 40
    # And a successful probe closes it
    clock.now += 40
    assert breakers.wait_s("ep") == 0
    breakers.record("ep", ok=True)
    assert breakers.wait_s("ep") == 0 and breakers.open_count() == 0
