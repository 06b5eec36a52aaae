"""The worker's fair shares (limiter.py) and the circuit breaker (breaker.py), without I/O."""

from __future__ import annotations

from services.notifier.breaker import CircuitBreakers
from services.notifier.limiter import EndpointLimiter, WaitingRoom, share_of


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
    limiter = EndpointLimiter(8, 2)
    assert sum(limiter.try_acquire("ep", "t") for _ in range(8)) == 2  # nor than its tenant


def test_a_tenant_alone_may_use_all_but_a_reserve_until_another_shows_up() -> None:
    # Given 16 threads, half for any one tenant when several are busy
    limiter = EndpointLimiter(16, share_of(16, 0.5), threads=16)
    # When one tenant is alone here, it gets every thread but the reserve (2 of 16)
    got = sum(limiter.try_acquire("ep", "busy") for _ in range(16))
    assert got == 14
    # Then another tenant finds a free thread at once
    assert limiter.try_acquire("other-ep", "newcomer")
    # And while it is busy, the first is back to its share: no more until it drops below 8
    for _ in range(5):
        limiter.release("ep", "busy")
    assert limiter.tenant_busy("busy") == 9
    assert not limiter.try_acquire("ep", "busy")
    limiter.release("ep", "busy")
    limiter.release("ep", "busy")
    assert limiter.try_acquire("ep", "busy")
    # And once the newcomer is done, the first tenant may grow again
    limiter.release("other-ep", "newcomer")
    assert limiter.try_acquire("ep", "busy")


def test_a_tenant_between_bursts_keeps_the_others_at_their_share_for_a_deadline() -> None:
    # Given 16 threads and a 10 s attempt deadline
    now = [0.0]
    limiter = EndpointLimiter(
        16, share_of(16, 0.5), threads=16, alone_after_s=10.0, clock=lambda: now[0]
    )
    # When a healthy tenant sends one delivery, which ends at once
    assert limiter.try_acquire("fine", "healthy")
    limiter.release("fine", "healthy")
    # Then for the next 10 s a hanging tenant still gets only its share (8)
    now[0] = 5.0
    assert sum(limiter.try_acquire("hang", "hostile") for _ in range(16)) == 8
    # And once the healthy tenant has been quiet for a deadline, all but the reserve
    now[0] = 10.5
    assert sum(limiter.try_acquire("hang", "hostile") for _ in range(16)) == 6


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


def test_the_waiting_room_sends_on_by_tenant_and_lets_nothing_wait_too_long() -> None:
    clock = Clock()
    room = WaitingRoom(max_wait_s=5, clock=clock)
    for n in range(3):
        assert room.park("t1", f"ep{n}", f"d{n}", 1)
    room.park("t2", "ep9", "d9", 1)
    # A freed slot of t1 sends on t1's deliveries whose endpoint can go, oldest first
    taken = room.take("t1", lambda endpoint_id: endpoint_id != "ep0", most=4)
    assert [w.delivery_id for w in taken] == ["d1", "d2"]
    assert len(room) == 2
    # And whatever waited max_wait_s goes on if it can (its slots may have freed up here
    # without waking it); what still cannot go waits on, its time renewed
    clock.now += 5
    assert [w.delivery_id for w in room.overdue(lambda e, t: t == "t2")] == ["d9"]
    assert room.overdue(lambda e, t: True) == []
    clock.now += 5
    assert [w.delivery_id for w in room.overdue(lambda e, t: True)] == ["d0"]
    assert len(room) == 0


def test_a_delivery_already_waiting_is_not_parked_twice() -> None:
    """The sweeper re-sends deliveries that wait here (due, no lease): the repeat is
    dropped, so the room neither grows nor sends one delivery twice."""
    clock = Clock()
    room = WaitingRoom(max_wait_s=5, clock=clock)
    assert room.park("t1", "ep0", "d0", 0)
    assert room.park("t1", "ep0", "d0", 0)  # the sweeper's repeat
    assert len(room) == 1
    assert [w.delivery_id for w in room.take("t1", lambda e: True, most=4)] == ["d0"]
    # Once sent on, the same delivery may wait here again (its attempt was put back)
    assert room.park("t1", "ep0", "d0", 1)
    assert len(room) == 1
    clock.now += 5
    assert [w.delivery_id for w in room.overdue(lambda e, t: True)] == ["d0"]
    assert room.park("t1", "ep0", "d0", 1) and len(room) == 1


def test_a_probe_that_made_no_attempt_is_released() -> None:
    # Given an open breaker whose cool-down has passed
    clock = Clock()
    breakers = CircuitBreakers(threshold=2, cooldown_s=5, max_cooldown_s=40, clock=clock)
    breakers.record("ep", ok=False)
    breakers.record("ep", ok=False)
    clock.now += 5
    # When the probe is taken but no attempt is made (put back, paced, an error first)
    assert breakers.wait_s("ep") == 0
    assert breakers.wait_s("ep") > 0  # half-open: the others wait
    breakers.release_probe("ep")
    # Then the next delivery may probe: the endpoint is not held for good
    assert breakers.wait_s("ep") == 0
