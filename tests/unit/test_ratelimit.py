"""Rate limiting: a burst is allowed, then one request per interval; 429 says when."""

from __future__ import annotations

from flask import Flask

from shared.errors import register_error_handlers
from shared.ratelimit import MemoryStore, RateLimitConfig, install


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


def test_zero_turns_limits_off() -> None:
    app = make_app(RateLimitConfig(per_key_rate=0, per_ip_rate=0))
    client = app.test_client()
    assert all(client.get("/x").status_code == 200 for _ in range(50))
