"""Rate limiting: a burst is allowed, then one request per interval; 429 says when."""

from __future__ import annotations

from flask import Flask

from shared.clients import client_key
from shared.errors import register_error_handlers
from shared.ratelimit import Charge, MemoryStore, RateLimitConfig, Throttle, install


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_steady_rate() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    # Given a fresh bucket, three requests pass at once, counting down the budget
    assert [store.hit("k", 2.0, 3).remaining for _ in range(3)] == [2, 1, 0]
    # When a fourth comes at the same instant, it is refused with a wait of one interval
    refused = store.hit("k", 2.0, 3)
    assert not refused.allowed and refused.retry_after_s == 0.5
    # Then after half a second one more passes, and other keys are unaffected
    clock.now += 0.5
    assert store.hit("k", 2.0, 3).allowed
    assert store.hit("other", 2.0, 3).remaining == 2


def test_idle_bucket_refills_completely() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    store.hit("k", 1.0, 2)
    store.hit("k", 1.0, 2)
    clock.now += 10
    assert store.hit("k", 1.0, 2).remaining == 1


def make_app(config: RateLimitConfig) -> Flask:
    app = Flask("t")
    register_error_handlers(app)
    install(app, config)
    app.add_url_rule("/x", "x", lambda: {"ok": True})
    return app


def test_429_carries_retry_after_and_the_error_shape() -> None:
    app = make_app(RateLimitConfig(per_key_rate=1, per_key_burst=2, per_ip_rate=0))
    client = app.test_client()
    headers = {"Authorization": "Bearer sk_test"}
    first = client.get("/x", headers=headers)
    assert first.status_code == 200 and first.headers["RateLimit-Remaining"] == "1"
    assert first.headers["RateLimit-Limit"] == "2"
    client.get("/x", headers=headers)
    limited = client.get("/x", headers=headers)
    assert limited.status_code == 429
    assert limited.json == {
        "error": "rate_limited: too many requests; retry in 1 s",
        "code": "rate_limited",
    }
    assert limited.headers["Retry-After"] == "1"
    # Another key has its own budget
    assert client.get("/x", headers={"Authorization": "Bearer sk_other"}).status_code == 200


def test_per_ip_limit_applies_without_a_key_and_honours_one_trusted_proxy() -> None:
    app = make_app(
        RateLimitConfig(per_key_rate=0, per_ip_rate=1, per_ip_burst=1, trusted_proxies=1)
    )
    client = app.test_client()
    a = {"X-Forwarded-For": "203.0.113.7"}
    b = {"X-Forwarded-For": "203.0.113.8"}
    assert client.get("/x", headers=a).status_code == 200
    assert client.get("/x", headers=a).status_code == 429
    assert client.get("/x", headers=b).status_code == 200


def test_per_ip_limit_counts_an_ipv6_client_by_its_64_and_ipv4_by_address() -> None:
    # Issue 23: each IPv6 address had a budget of its own, so one /64 was unlimited
    app = make_app(
        RateLimitConfig(per_key_rate=0, per_ip_rate=1, per_ip_burst=2, trusted_proxies=1)
    )
    client = app.test_client()

    def status(address: str) -> int:
        return client.get("/x", headers={"X-Forwarded-For": address}).status_code

    assert [status(f"2001:db8:1:2::{n:x}") for n in range(1, 4)] == [200, 200, 429]
    assert status("2001:db8:1:2:ffff:ffff:ffff:ffff") == 429  # the same /64
    assert status("2001:db8:1:3::1") == 200  # the next /64 is another client
    assert [status("198.51.100.7"), status("198.51.100.7"), status("198.51.100.8")] == [
        200,
        200,
        200,
    ]
    assert status("::ffff:198.51.100.7") == 429  # the IPv4 client, written as IPv6


def test_zero_turns_limits_off() -> None:
    app = make_app(RateLimitConfig(per_key_rate=0, per_ip_rate=0))
    client = app.test_client()
    assert all(client.get("/x").status_code == 200 for _ in range(50))


def throttle(key: str = "k", **shape: object) -> Throttle:
    values: dict[str, object] = {"free": 2, "first_s": 1.0, "cap_s": 8.0, "ttl_s": 100.0}
    values.update(shape)
    return Throttle(key, **values)  # type: ignore[arg-type]


def test_failure_waits_double_up_to_the_cap() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    t = throttle()
    # Given two free failures, at once
    assert store.charge([t]).charged == ("k",) and store.charge([t]).allowed
    # Then each further attempt waits 1, 2, 4, 8, 8 s after the last failure
    waits = []
    for _ in range(5):
        refused = store.charge([t])
        assert not refused.allowed and refused.charged == ()
        waits.append(refused.wait_s)
        clock.now += refused.wait_s
        assert store.charge([t]).allowed
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]


def test_a_refund_takes_one_failure_back_and_forget_clears() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    t = throttle()
    store.charge([t])
    store.charge([t])
    store.refund(["k"])
    assert store.charge([t]).allowed  # one back: still free
    assert not store.charge([t]).allowed
    store.forget(["k"])
    assert store.charge([t]).allowed and store.charge([t]).allowed


def test_failures_are_forgotten_after_their_time_to_live() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    t = throttle(ttl_s=10.0, cap_s=1000.0)
    for _ in range(2):
        store.charge([t])
    assert not store.charge([t]).allowed
    clock.now += 10.0
    assert store.charge([t]).allowed and store.charge([t]).allowed


def test_a_mark_skips_its_counter_and_a_refusal_charges_nothing() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    strict, lenient = throttle("strict", free=1), throttle("lenient", free=3)
    # Given a counter that makes the attempt wait, the other is not charged either
    assert store.charge([strict, lenient]).charged == ("strict", "lenient")
    assert not store.charge([strict, lenient]).allowed
    assert store.charge([lenient]).allowed and store.charge([lenient]).allowed  # 2 and 3
    assert not store.charge([lenient]).allowed
    # When a counter's mark exists, it is skipped (neither checked nor charged)
    gated = throttle("gated", free=1, unless="known")
    store.charge([gated])
    assert not store.charge([gated]).allowed
    store.remember("known", 5.0)
    assert store.charge([gated]) == Charge(0.0, ())
    # And once the mark lapses the counter applies again (its 1 s wait is over by then)
    clock.now += 5.0
    assert store.charge([gated]).charged == ("gated",)
    assert store.charge([gated]).wait_s == 2.0


def test_a_huge_failure_count_still_waits_the_cap() -> None:
    t = throttle(cap_s=60.0)
    assert t.wait_s(10_000, 0.0) == 60.0
    assert t.wait_s(1, 0.0) == 0.0
    assert t.wait_s(3, 1.5) == 0.5


def test_sign_in_counts_an_ipv6_client_by_its_64() -> None:
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:ffff::9")
    assert client_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:198.51.100.7") == "198.51.100.7" == client_key("198.51.100.7")
    assert client_key("unknown") == "unknown"


def test_a_counter_given_back_to_zero_is_dropped() -> None:
    # Given a flood whose attempts are all given back (refused while hashing is busy)
    store = MemoryStore(clock=Clock())
    for n in range(1000):
        key = f"signin:pair:{n}"
        assert store.charge([throttle(key)]).allowed
        store.refund([key])
    # Then nothing is kept for them: a flood of fresh names cannot grow the memory
    assert store.counters() == 0


def test_the_counters_kept_in_memory_are_bounded() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock, max_counters=100)
    # When more distinct failing clients come than the store keeps
    for n in range(1000):
        clock.now += 0.001
        store.charge([throttle(f"signin:client:{n}", free=1)])
    # Then it keeps at most its bound, the most recent failures first
    assert store.counters() <= 100
    assert not store.charge([throttle("signin:client:999", free=1)]).allowed


def test_a_wait_counts_from_when_the_failure_was_known() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    t = throttle(free=1)
    # Given a first attempt charged, whose password check then takes 3 s and fails
    assert store.charge([t]).allowed
    clock.now += 3.0
    store.failed_now(["k"])
    # Then the next attempt waits the full second from the failure, not from the start
    assert store.charge([t]).wait_s == 1.0
