"""Rate-limit buckets in the real Redis on 127.0.0.1: shared, atomic, and degraded safely.

Each test uses keys of its own (a random prefix), so tests sharing the Redis never
meet; every key expires by itself (a bucket lives until it is full again).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
import redis
from flask.testing import FlaskClient

from services.core.app import create_app
from services.core.context import CoreContext
from shared.ratelimit import (
    REDIS_TIMEOUT_S,
    MemoryStore,
    RateLimitConfig,
    RedisStore,
    Throttle,
    current_store,
)
from tests.conftest import TenantKeys
from tests.support.services import require_service

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def prefix() -> Iterator[str]:
    require_service("Redis", "127.0.0.1", 6379)
    name = f"settle-test:{uuid.uuid4().hex}:"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{name}*"):
        client.delete(key)
    client.close()


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_two_processes_share_one_bucket(prefix: str) -> None:
    # Given two API processes, each with its own connection to the same Redis
    a, b = RedisStore(REDIS_URL, prefix=prefix), RedisStore(REDIS_URL, prefix=prefix)
    # When they take turns with one client's requests (burst 4, then 1 a minute)
    answers = [(a if n % 2 else b).hit("key:k", 1 / 60, 4) for n in range(6)]
    # Then the burst is spent once between them, not once each
    assert [d.allowed for d in answers] == [True, True, True, True, False, False]
    assert [d.remaining for d in answers[:4]] == [3, 2, 1, 0]
    assert 58 < answers[4].retry_after_s <= 60
    # And another key has a bucket of its own
    assert a.hit("key:other", 1 / 60, 4).remaining == 3


def test_the_check_is_atomic_under_concurrency(prefix: str) -> None:
    # Given 8 threads, each with its own connection, hitting one bucket of burst 25
    stores = [RedisStore(REDIS_URL, prefix=prefix) for _ in range(8)]
    allowed: list[bool] = []
    lock = threading.Lock()
    start = threading.Barrier(len(stores))

    def hammer(store: RedisStore) -> None:
        start.wait()
        for _ in range(20):
            decision = store.hit("ip:203.0.113.9", 0.001, 25)
            with lock:
                allowed.append(decision.allowed)

    threads = [threading.Thread(target=hammer, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # Then exactly the burst got through: no read-modify-write race let one more pass
    assert len(allowed) == 160
    assert sum(allowed) == 25


def test_a_bucket_refills_on_redis_time_and_expires(prefix: str) -> None:
    store = RedisStore(REDIS_URL, prefix=prefix)
    assert store.hit("k", 10, 1).allowed
    refused = store.hit("k", 10, 1)
    assert not refused.allowed and 0 < refused.retry_after_s <= 0.1
    time.sleep(0.15)
    assert store.hit("k", 10, 1).allowed
    ttl = redis.Redis.from_url(REDIS_URL).pttl(f"{prefix}k")
    assert 0 < ttl <= 102  # gone once full again: memory stays bounded


def test_redis_down_falls_back_to_this_process_and_recovers(prefix: str) -> None:
    # Given a store whose Redis is a port nothing listens on
    store = RedisStore(f"redis://127.0.0.1:{dead_port()}/0", prefix=prefix, retry_s=0.2)
    # When a client spends its burst, each check answers quickly from local buckets
    started = time.monotonic()
    answers = [store.hit("ip:198.51.100.1", 1 / 60, 3) for _ in range(4)]
    elapsed = time.monotonic() - started
    # Then the limit still holds (per process: neither open nor closed)
    assert [d.allowed for d in answers] == [True, True, True, False]
    # and only the first check waited on the dead Redis (then it is skipped for retry_s)
    assert elapsed < 2.0, elapsed


def test_a_slow_redis_is_not_waited_for(prefix: str) -> None:
    # Given a "Redis" that accepts connections and never answers
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        port = server.getsockname()[1]
        store = RedisStore(f"redis://127.0.0.1:{port}/0", prefix=prefix, timeout_s=0.2)
        started = time.monotonic()
        decision = store.hit("ip:198.51.100.2", 1, 2)
        # Then the check gives up after the timeout and answers from local buckets
        assert decision.allowed
        assert time.monotonic() - started < 2.0
    finally:
        server.close()


@pytest.fixture
def shared_clients(core_context: CoreContext, prefix: str) -> list[FlaskClient]:
    """Two core apps (as two gunicorn workers would be) on one Redis, 3 requests per key."""
    config = replace(
        core_context.config,
        rate_limits=RateLimitConfig(
            per_key_rate=1 / 60,
            per_key_burst=3,
            per_ip_rate=0,
            redis_url=REDIS_URL,
            redis_prefix=prefix,
        ),
    )
    clients = []
    for _ in range(2):
        app = create_app(context=replace(core_context, config=config))
        with app.app_context():
            assert isinstance(current_store(), RedisStore)
        clients.append(app.test_client())
    return clients


def test_two_api_apps_on_one_redis_enforce_one_limit(
    shared_clients: list[FlaskClient], tenant: TenantKeys
) -> None:
    a, b = shared_clients
    statuses = [
        (a if n % 2 else b).get("/v1/destination-policy", headers=tenant.headers).status_code
        for n in range(4)
    ]
    assert statuses == [200, 200, 200, 429]


def test_without_a_redis_url_each_process_has_its_own_buckets(core_context: CoreContext) -> None:
    app = create_app(context=core_context)
    with app.app_context():
        assert isinstance(current_store(), MemoryStore)


def test_several_buckets_in_one_round_trip(prefix: str) -> None:
    store = RedisStore(REDIS_URL, prefix=prefix)
    calls: list[object] = []
    script = store._script

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return script(*args, **kwargs)

    store._script = counted  # type: ignore[method-assign,assignment]
    ip, key = store.hit_all([("ip:a", 1 / 60, 2), ("key:b", 1 / 60, 1)])
    assert (ip.allowed, ip.remaining, key.allowed, key.remaining) == (True, 1, True, 0)
    ip, key = store.hit_all([("ip:a", 1 / 60, 2), ("key:b", 1 / 60, 1)])
    assert (ip.allowed, ip.remaining, key.allowed) == (True, 0, False)
    assert len(calls) == 2  # one script call (one round trip) per request, not per bucket


def test_large_bursts_are_leased_within_the_documented_bound(prefix: str) -> None:
    # Given two processes and a bucket of burst 400 (leases of 10), refilling slowly
    a, b = RedisStore(REDIS_URL, prefix=prefix), RedisStore(REDIS_URL, prefix=prefix)
    calls = 0
    for store in (a, b):
        script = store._script

        def counted(*args: object, _script: object = script, **kwargs: object) -> object:
            nonlocal calls
            calls += 1
            return _script(*args, **kwargs)  # type: ignore[operator]

        store._script = counted  # type: ignore[method-assign,assignment]
    # When one client sends 500 requests, alternating between them
    allowed = sum((a if n % 2 else b).hit("ip:busy", 1 / 600, 400).allowed for n in range(500))
    # Then never more than the burst passes, at most a lease per process is stranded,
    # and Redis was asked about once per 10 requests, not once per request
    assert 400 - 2 * 9 <= allowed <= 400
    assert calls <= 500 // 10 + 2 * 10


def test_small_bursts_are_exact(prefix: str) -> None:
    a, b = RedisStore(REDIS_URL, prefix=prefix), RedisStore(REDIS_URL, prefix=prefix)
    allowed = sum((a if n % 2 else b).hit("ip:signin", 1 / 600, 39).allowed for n in range(60))
    assert allowed == 39


def _throttle(key: str, free: int = 2, unless: str | None = None) -> Throttle:
    return Throttle(key, free, first_s=1.0, cap_s=900.0, ttl_s=60.0, unless=unless)


def test_sign_in_failure_counters_are_shared_and_wait_on_redis_time(prefix: str) -> None:
    # Given two API processes counting one address's failures in the same Redis
    a, b = RedisStore(REDIS_URL, prefix=prefix), RedisStore(REDIS_URL, prefix=prefix)
    t = _throttle("signin:client:x")
    # When they take turns, the free failures are spent once between them
    assert a.charge([t]).charged == ("signin:client:x",)
    assert b.charge([t]).allowed
    refused = a.charge([t])
    assert not refused.allowed and 0.9 < refused.wait_s <= 1.0
    assert not b.charge([t]).allowed
    # Then after the wait one more is counted, and the next waits twice as long
    time.sleep(refused.wait_s + 0.02)
    assert b.charge([t]).allowed
    assert 1.9 < a.charge([t]).wait_s <= 2.0
    # A refund takes one back and forget clears the counter; both expire in Redis
    client = redis.Redis.from_url(REDIS_URL)
    assert 0 < client.pttl(prefix + "signin:client:x") <= 60_000
    a.refund(["signin:client:x", "signin:client:never-charged"])
    assert client.hget(prefix + "signin:client:x", "n") == b"2"
    assert not client.exists(prefix + "signin:client:never-charged")
    # (a counter given back to zero is deleted: a flood of refunds leaves nothing behind)
    once = _throttle("signin:client:once")
    assert a.charge([once]).allowed
    a.refund(["signin:client:once"])
    assert not client.exists(prefix + "signin:client:once")
    b.forget(["signin:client:x"])
    assert a.charge([t]).allowed and a.charge([t]).allowed
    client.close()


def test_a_burst_of_sign_ins_is_charged_atomically(prefix: str) -> None:
    # Given 8 threads at once on one counter with 3 free failures
    store = RedisStore(REDIS_URL, prefix=prefix)
    t = _throttle("signin:pair:p", free=3)
    go = threading.Barrier(8)
    answers: list[bool] = []

    def attempt() -> None:
        go.wait()
        answers.append(store.charge([t]).allowed)

    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    # Then exactly 3 are let through, as if they had come one by one
    assert sorted(answers) == [False] * 5 + [True] * 3


def test_a_known_address_skips_the_account_counter_in_redis(prefix: str) -> None:
    store = RedisStore(REDIS_URL, prefix=prefix)
    account = _throttle("signin:account:a", free=1, unless="signin:known:a:home")
    assert store.charge([account]).allowed
    assert not store.charge([account]).allowed
    store.remember("signin:known:a:home", 30.0)
    assert store.charge([account]).charged == ()


def test_sign_in_counters_fall_back_to_this_process_while_redis_is_down(prefix: str) -> None:
    store = RedisStore(f"redis://127.0.0.1:{dead_port()}/0", prefix=prefix, retry_s=60)
    t = _throttle("signin:client:y", free=1)
    started = time.monotonic()
    assert store.charge([t]).allowed
    assert not store.charge([t]).allowed
    store.refund(["signin:client:y"])
    assert store.charge([t]).allowed
    store.remember("m", 1.0)
    store.forget(["signin:client:y"])
    assert time.monotonic() - started < 2 * REDIS_TIMEOUT_S + 0.5


def test_a_wait_counts_from_the_failure_in_redis_too(prefix: str) -> None:
    store = RedisStore(REDIS_URL, prefix=prefix)
    t = _throttle("signin:pair:slow", free=1)
    assert store.charge([t]).allowed
    time.sleep(0.6)  # a slow password check
    store.failed_now(["signin:pair:slow", "signin:pair:never"])
    assert 0.9 < store.charge([t]).wait_s <= 1.0
    assert not redis.Redis.from_url(REDIS_URL).exists(prefix + "signin:pair:never")
