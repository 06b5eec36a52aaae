"""Rate limits per API key and per client IP: 429 with Retry-After, budget in headers.

Buckets are GCRA (a token bucket kept as one timestamp, its "theoretical arrival
time") in a `Store` with one method, `hit(key, rate, burst) -> Decision`:

- `RedisStore` (`SETTLE_REDIS_URL` set): one bucket per key for every API process
  that uses the same Redis, checked and updated atomically by a Lua script on Redis's
  own clock, so N processes allow the limit once, not N times. When Redis cannot be
  reached, each process falls back to its own in-memory buckets (the limit holds per
  process: degraded, neither open nor closed) and tries Redis again after
  `REDIS_RETRY_S`; a check never waits on Redis longer than `REDIS_TIMEOUT_S`.
- `MemoryStore` (no Redis URL): the buckets of this process alone; with N processes
  behind the ingress a client gets up to N x the limit (docs/DECISIONS.md).

The API-key bucket is keyed on a hash of the bearer token, not on a database
lookup, so unknown keys are limited too (guessing is throttled) and a check needs
no query. Other limits (sign-in throttling) use the same store under their own keys:
`store(app)` or `current_store()`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import redis
from flask import Flask, Response, current_app, g, request
from werkzeug.middleware.proxy_fix import ProxyFix

from shared.clients import client_key
from shared.errors import RateLimited
from shared.settings import env_float, env_int, env_str, environ

log = logging.getLogger(__name__)

#: app.extensions key of the app's Store.
EXTENSION = "settle.ratelimit"
#: Forget idle in-memory buckets after this many checks.
_SWEEP_EVERY = 10_000
#: Most failure counters a MemoryStore keeps (~100 bytes each); past it, the oldest go.
MAX_COUNTERS = 200_000
#: Longest a check waits on Redis (connect or answer) before using the local buckets.
REDIS_TIMEOUT_S = 0.25
#: How long after a Redis failure the local buckets are used before Redis is tried again.
REDIS_RETRY_S = 1.0
#: Longest a process keeps tokens it leased from Redis before they lapse unspent.
LEASE_S = 1.0
#: Prefix of every Redis key this module writes.
REDIS_PREFIX = "settle:ratelimit:"


@dataclass(frozen=True)
class RateLimitConfig:
    """Requests per second and burst, per API key and per client IP; 0 turns one off."""

    per_key_rate: float = 100.0
    per_key_burst: int = 200
    per_ip_rate: float = 200.0
    per_ip_burst: int = 400
    #: Proxies in front of the app whose X-Forwarded-For to trust (1 behind our ingress).
    trusted_proxies: int = 0
    #: Redis shared by every API process; None: each process keeps its own buckets.
    redis_url: str | None = None
    #: Prefix of the bucket keys in Redis (deployments or test runs sharing one Redis).
    redis_prefix: str = REDIS_PREFIX

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RateLimitConfig:
        env = environ() if env is None else env
        return cls(
            per_key_rate=env_float(env, "SETTLE_RATE_LIMIT_PER_KEY", 100.0),
            per_key_burst=env_int(env, "SETTLE_RATE_LIMIT_PER_KEY_BURST", 200),
            per_ip_rate=env_float(env, "SETTLE_RATE_LIMIT_PER_IP", 200.0),
            per_ip_burst=env_int(env, "SETTLE_RATE_LIMIT_PER_IP_BURST", 400),
            trusted_proxies=env_int(env, "SETTLE_TRUSTED_PROXIES", 0),
            redis_url=env_str(env, "SETTLE_REDIS_URL"),
            redis_prefix=env_str(env, "SETTLE_REDIS_PREFIX") or REDIS_PREFIX,
        )


#: No limits: what a config built in code gets unless it asks (tests, benchmarks).
RATE_LIMITS_OFF = RateLimitConfig(per_key_rate=0, per_ip_rate=0)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    #: Seconds until a request would be allowed (0 when allowed).
    retry_after_s: float
    #: Seconds until the bucket is full again.
    reset_s: float


#: One bucket to take a request from: (key, rate per second, burst).
Hit = tuple[str, float, int]


@dataclass(frozen=True)
class Throttle:
    """A failure counter: after `free` failures each attempt waits longer than the last.

    The wait after the (free + k)th failure is `first_s` x 2^k, at most `cap_s`, counted
    from the last failure. Failures are forgotten `ttl_s` after the last one. A counter
    whose `unless` key exists (a mark `remember` made) is skipped.
    """

    key: str
    free: int
    first_s: float
    cap_s: float
    ttl_s: float
    unless: str | None = None

    def wait_s(self, failures: int, since_last_s: float) -> float:
        """How long an attempt must still wait, `since_last_s` after the last failure."""
        if failures < max(self.free, 1):
            return 0.0
        # min() before the power: 2^k overflows a float for k past ~1000.
        delay = min(self.first_s * 2.0 ** min(failures - self.free, 64), self.cap_s)
        return max(0.0, delay - since_last_s)


@dataclass(frozen=True)
class Charge:
    """What `Store.charge` decided: counted (wait 0) or refused with a wait."""

    wait_s: float
    #: The counters that counted the attempt (those that applied), empty when refused.
    charged: tuple[str, ...]

    @property
    def allowed(self) -> bool:
        return self.wait_s <= 0


class Store(Protocol):
    """Where buckets live. `rate` per second, `burst` at once; `key` names the bucket."""

    def hit(self, key: str, rate: float, burst: int) -> Decision: ...

    def hit_all(self, hits: Sequence[Hit]) -> list[Decision]:
        """Several buckets at once (for Redis: one round trip); each is charged."""
        ...

    def charge(self, throttles: Sequence[Throttle]) -> Charge:
        """One attempt against each failure counter, if none of them makes it wait.

        Atomic: either every counter that applies counts the attempt (as a failure
        until `refund` says otherwise) or none does and the answer says how long to
        wait. A counter whose `unless` key exists does not apply.
        """
        ...

    def refund(self, keys: Sequence[str]) -> None:
        """Take back one counted attempt from each counter (it did not fail)."""
        ...

    def failed_now(self, keys: Sequence[str]) -> None:
        """The counted attempt failed just now: waits count from now, not from its start
        (a password check can take a while on a loaded machine)."""
        ...

    def forget(self, keys: Sequence[str]) -> None:
        """Drop these counters and marks."""
        ...

    def remember(self, key: str, ttl_s: float) -> None:
        """A mark that exists for `ttl_s` (what a counter's `unless` names)."""
        ...


def _check(rate: float, burst: int) -> tuple[float, float]:
    """(interval, tolerance) of a GCRA bucket, in seconds."""
    if rate <= 0 or burst < 1:
        raise ValueError("rate must be > 0 and burst >= 1")
    interval = 1.0 / rate
    return interval, interval * (burst - 1)


def _decision(
    allowed: bool, burst: int, interval: float, tolerance: float, wait: float, full_in: float
) -> Decision:
    if not allowed:
        return Decision(False, burst, 0, wait, full_in)
    # + 1e-3: Redis answers whole microseconds; never count a bucket one short for it.
    remaining = int((tolerance - (full_in - interval)) / interval + 1e-3)
    return Decision(True, burst, max(0, remaining), 0.0, full_in)


class MemoryStore:
    """GCRA buckets in this process, thread-safe; idle ones are forgotten."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, max_counters: int = MAX_COUNTERS
    ) -> None:
        self._clock = clock
        self._max_counters = max_counters
        self._tat: dict[str, float] = {}
        #: Failure counters: key -> (failures, last failure, forgotten at).
        self._failures: dict[str, tuple[int, float, float]] = {}
        #: Marks: key -> when it lapses.
        self._marks: dict[str, float] = {}
        self._lock = threading.Lock()
        self._checks = 0

    def hit(self, key: str, rate: float, burst: int) -> Decision:
        """Take one request from `key`'s bucket if it has one."""
        interval, tolerance = _check(rate, burst)
        with self._lock:
            now = self._clock()
            self._checks += 1
            if self._checks % _SWEEP_EVERY == 0:
                self._tat = {k: t for k, t in self._tat.items() if t > now}
            tat = max(self._tat.get(key, now), now)
            allow_at = tat - tolerance
            if now < allow_at:
                return _decision(False, burst, interval, tolerance, allow_at - now, tat - now)
            self._tat[key] = tat + interval
            return _decision(True, burst, interval, tolerance, 0.0, tat + interval - now)

    def hit_all(self, hits: Sequence[Hit]) -> list[Decision]:
        return [self.hit(key, rate, burst) for key, rate, burst in hits]

    def charge(self, throttles: Sequence[Throttle]) -> Charge:
        with self._lock:
            now = self._clock()
            self._sweep_failures(now)
            applying = [
                t for t in throttles if t.unless is None or self._marks.get(t.unless, 0) <= now
            ]
            counts = {t.key: self._count(t.key, now) for t in applying}
            wait = max(
                (t.wait_s(counts[t.key][0], now - counts[t.key][1]) for t in applying),
                default=0.0,
            )
            if wait > 0:
                return Charge(wait, ())
            for t in applying:
                self._failures[t.key] = (counts[t.key][0] + 1, now, now + t.ttl_s)
            if len(self._failures) > self._max_counters:
                self._shed(now)
            return Charge(0.0, tuple(t.key for t in applying))

    def refund(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                found = self._failures.get(key)
                if found is None:
                    continue
                if found[0] <= 1:
                    # Nothing left to count: a flood of given-back attempts keeps nothing.
                    del self._failures[key]
                else:
                    self._failures[key] = (found[0] - 1, found[1], found[2])

    def failed_now(self, keys: Sequence[str]) -> None:
        with self._lock:
            now = self._clock()
            for key in keys:
                found = self._failures.get(key)
                if found is not None:
                    self._failures[key] = (found[0], max(found[1], now), found[2])

    def forget(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)
                self._marks.pop(key, None)

    def remember(self, key: str, ttl_s: float) -> None:
        with self._lock:
            self._marks[key] = self._clock() + ttl_s

    def _count(self, key: str, now: float) -> tuple[int, float]:
        """(failures, last failure) of a live counter; (0, now) for none or a lapsed one."""
        found = self._failures.get(key)
        if found is None or found[2] <= now:
            return 0, now
        return found[0], found[1]

    def counters(self) -> int:
        """How many failure counters this store holds (for tests and metrics)."""
        with self._lock:
            return len(self._failures)

    def _shed(self, now: float) -> None:
        """Over the bound: drop lapsed counters, then the oldest failures, to 3/4 of it.

        Only a flood of distinct clients gets here; dropping its oldest counters gives
        those clients fresh free failures, which is better than the process running out
        of memory (with Redis the bound is Redis's memory and the counters' TTL).
        """
        self._failures = {k: v for k, v in self._failures.items() if v[2] > now}
        keep = self._max_counters * 3 // 4
        if len(self._failures) > keep:
            newest = sorted(self._failures.items(), key=lambda kv: kv[1][1])[-keep:]
            self._failures = dict(newest)

    def _sweep_failures(self, now: float) -> None:
        self._checks += 1
        if self._checks % _SWEEP_EVERY == 0:
            self._failures = {k: v for k, v in self._failures.items() if v[2] > now}
            self._marks = {k: v for k, v in self._marks.items() if v > now}


#: GCRA in one atomic step, on Redis's clock (microseconds), for each bucket in KEYS;
#: ARGV: interval, tolerance (microseconds) and the tokens wanted, per bucket. Takes as
#: many of the wanted tokens as the bucket has (at least 1, or it refuses). Returns,
#: per bucket, flattened: tokens taken (0: refused), wait, full_in.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i, key in ipairs(KEYS) do
  local interval = tonumber(ARGV[3 * i - 2])
  local tolerance = tonumber(ARGV[3 * i - 1])
  local wanted = tonumber(ARGV[3 * i])
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  local available = math.floor((tolerance + interval - (tat - now)) / interval)
  if available < 1 then
    out[#out + 1] = 0
    out[#out + 1] = tat - tolerance - now
    out[#out + 1] = tat - now
  else
    local taken = math.min(wanted, available)
    tat = tat + taken * interval
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
    out[#out + 1] = taken
    out[#out + 1] = 0
    out[#out + 1] = tat - now
  end
end
return out
"""


#: Store.charge in one atomic step, on Redis's clock (microseconds). KEYS: the failure
#: counters (hashes: n failures, t last failure); ARGV per counter: free, first wait and
#: cap (microseconds), time to live (milliseconds), the key whose existence skips it
#: ('' for none). Returns {wait} when refused, or {0, indexes of the counters charged}.
_CHARGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local wait = 0
local applying = {}
for i, key in ipairs(KEYS) do
  local unless = ARGV[5 * i]
  if unless == '' or redis.call('EXISTS', unless) == 0 then
    applying[#applying + 1] = i
    local free = tonumber(ARGV[5 * i - 4])
    local n = tonumber(redis.call('HGET', key, 'n') or '0')
    if n >= free and n > 0 then
      local last = tonumber(redis.call('HGET', key, 't') or now)
      local delay = math.min(tonumber(ARGV[5 * i - 3]) * 2 ^ math.min(n - free, 64),
                             tonumber(ARGV[5 * i - 2]))
      if last + delay - now > wait then wait = last + delay - now end
    end
  end
end
if wait > 0 then return {math.ceil(wait)} end
local out = {0}
for _, i in ipairs(applying) do
  redis.call('HINCRBY', KEYS[i], 'n', 1)
  redis.call('HSET', KEYS[i], 't', string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[i], ARGV[5 * i - 1])
  out[#out + 1] = i
end
return out
"""

#: Store.refund: one failure fewer on each counter in KEYS that still exists; a counter
#: at zero is deleted (a flood of given-back attempts leaves nothing behind).
_REFUND = """
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 and redis.call('HINCRBY', key, 'n', -1) <= 0 then
    redis.call('DEL', key)
  end
end
return 0
"""


#: Store.failed_now: the last failure of each counter in KEYS that exists is now.
_FAILED_NOW = """
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then redis.call('HSET', key, 't', now) end
end
return 0
"""


def lease_size(burst: int) -> int:
    """Tokens a process takes from Redis at once for a bucket of this burst.

    1 (every request asks Redis: exact) for bursts under 40, such as sign-in
    throttling; up to 10 for the API's bursts (200, 400), so a busy client costs one
    Redis round trip per 10 requests per process.
    """
    return max(1, min(10, burst // 20))


@dataclass
class _Lease:
    """What this process holds for a bucket: tokens taken from Redis and not spent yet,
    or a refusal and until when it stands."""

    tokens: int
    #: When it lapses (unspent tokens are never handed back).
    until: float
    #: What the client is told meanwhile.
    decision: Decision


class RedisStore:
    """GCRA buckets in Redis, shared by every process using the same URL.

    For a bucket with a large burst a process takes a lease of `lease_size(burst)`
    tokens in one round trip and spends them locally within `LEASE_S`. Each process
    holds at most one lease per bucket, so at any moment a client can get at most one
    lease per process beyond its limit, or be refused up to one lease per process early
    (tokens leased by another process and not spent). Small bursts are exact. A
    refusal is remembered until its wait is over. Falls back to `fallback` (this
    process's buckets) while Redis is unreachable.
    """

    def __init__(
        self,
        url: str,
        *,
        fallback: Store | None = None,
        prefix: str = REDIS_PREFIX,
        timeout_s: float = REDIS_TIMEOUT_S,
        retry_s: float = REDIS_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._script = self._redis.register_script(_GCRA)
        self._charge = self._redis.register_script(_CHARGE)
        self._refund = self._redis.register_script(_REFUND)
        self._failed_now = self._redis.register_script(_FAILED_NOW)
        self._fallback = fallback or MemoryStore()
        self._prefix = prefix
        self._retry_s = retry_s
        self._clock = clock
        self._down_until = 0.0
        self._leases: dict[str, _Lease] = {}
        self._lock = threading.Lock()

    def hit(self, key: str, rate: float, burst: int) -> Decision:
        return self.hit_all([(key, rate, burst)])[0]

    def hit_all(self, hits: Sequence[Hit]) -> list[Decision]:
        shapes = [_check(rate, burst) for _, rate, burst in hits]
        now = self._clock()
        if now < self._down_until:
            return self._fallback.hit_all(hits)
        decisions: list[Decision | None] = [self._from_lease(key, now) for key, _, _ in hits]
        ask = [i for i, d in enumerate(decisions) if d is None]
        if ask:
            try:
                answer = self._script(
                    keys=[self._prefix + hits[i][0] for i in ask],
                    args=[
                        v
                        for i in ask
                        for v in (*(x * 1e6 for x in shapes[i]), lease_size(hits[i][2]))
                    ],
                )
            except redis.RedisError as err:
                self._went_down(err)
                return self._fallback.hit_all(hits)
            if self._down_until:
                log.warning("rate limits: Redis answers again; limits are shared again")
                self._down_until = 0.0
            for n, i in enumerate(ask):
                taken, wait, full_in = answer[3 * n : 3 * n + 3]
                decisions[i] = self._taken(hits[i], shapes[i], taken, wait / 1e6, full_in / 1e6)
        return [d for d in decisions if d is not None]

    def charge(self, throttles: Sequence[Throttle]) -> Charge:
        if not self._up():
            return self._fallback.charge(throttles)
        args: list[object] = []
        for t in throttles:
            unless = self._prefix + t.unless if t.unless else ""
            args += [t.free, t.first_s * 1e6, t.cap_s * 1e6, math.ceil(t.ttl_s * 1000), unless]
        try:
            answer = self._charge(keys=[self._prefix + t.key for t in throttles], args=args)
        except redis.RedisError as err:
            self._went_down(err)
            return self._fallback.charge(throttles)
        if answer[0]:
            return Charge(answer[0] / 1e6, ())
        return Charge(0.0, tuple(throttles[i - 1].key for i in answer[1:]))

    def refund(self, keys: Sequence[str]) -> None:
        self._run(lambda: self._refund(keys=[self._prefix + k for k in keys]), "refund", keys)

    def failed_now(self, keys: Sequence[str]) -> None:
        call = lambda: self._failed_now(keys=[self._prefix + k for k in keys])  # noqa: E731
        self._run(call, "failed_now", keys)

    def forget(self, keys: Sequence[str]) -> None:
        self._run(lambda: self._redis.delete(*[self._prefix + k for k in keys]), "forget", keys)

    def remember(self, key: str, ttl_s: float) -> None:
        self._run(
            lambda: self._redis.set(self._prefix + key, 1, px=math.ceil(ttl_s * 1000)),
            "remember",
            key,
            ttl_s,
        )

    def _up(self) -> bool:
        """Whether Redis is to be asked (not within REDIS_RETRY_S of a failure)."""
        return self._clock() >= self._down_until

    def _run(self, call: Callable[[], object], fallback: str, *args: object) -> None:
        """`call` on Redis, or the same method of the fallback while Redis is down."""
        if self._up():
            try:
                call()
                return
            except redis.RedisError as err:
                self._went_down(err)
        getattr(self._fallback, fallback)(*args)

    def _from_lease(self, key: str, now: float) -> Decision | None:
        """This request's decision from what this process holds for `key`, or None."""
        with self._lock:
            lease = self._leases.get(key)
            if lease is None or now >= lease.until:
                self._leases.pop(key, None)
                return None
            if not lease.decision.allowed:
                # A refusal stands until its wait is over, whatever other processes do
                # (GCRA frees no token earlier): no round trip for a flood of them.
                wait = lease.until - now
                return replace(lease.decision, retry_after_s=wait)
            if lease.tokens < 1:
                del self._leases[key]
                return None
            lease.tokens -= 1
            remaining = max(0, lease.decision.remaining - 1)
            lease.decision = replace(lease.decision, remaining=remaining)
            return lease.decision

    def _taken(
        self, hit: Hit, shape: tuple[float, float], taken: int, wait: float, full_in: float
    ) -> Decision:
        key, _, burst = hit
        interval, tolerance = shape
        now = self._clock()
        if not taken:
            refused = _decision(False, burst, interval, tolerance, wait, full_in)
            self._hold(key, _Lease(0, now + wait, refused), now)
            return refused
        # As if the leased tokens were taken one by one, this request the first of them.
        first = _decision(True, burst, interval, tolerance, 0.0, full_in - (taken - 1) * interval)
        if taken > 1:
            self._hold(key, _Lease(taken - 1, now + LEASE_S, first), now)
        return first

    def _hold(self, key: str, lease: _Lease, now: float) -> None:
        with self._lock:
            self._leases[key] = lease
            if len(self._leases) > _SWEEP_EVERY:
                self._leases = {k: v for k, v in self._leases.items() if v.until > now}

    def _went_down(self, err: Exception) -> None:
        if self._down_until == 0.0:
            log.warning(
                "rate limits: Redis unreachable (%s); each process limits on its own "
                "until it answers",
                err,
            )
        self._down_until = self._clock() + self._retry_s

    def close(self) -> None:
        self._redis.close()


def make_store(config: RateLimitConfig) -> Store:
    """The store `config` asks for: Redis when it has a URL, this process's memory if not."""
    if config.redis_url:
        return RedisStore(config.redis_url, prefix=config.redis_prefix)
    return MemoryStore()


def store(app: Flask) -> Store:
    """The app's store (`install` puts it there)."""
    found: Store = app.extensions[EXTENSION]
    return found


def current_store() -> Store:
    return store(current_app)  # type: ignore[arg-type]


def _headers(response: Response, decision: Decision) -> None:
    response.headers["RateLimit-Limit"] = str(decision.limit)
    response.headers["RateLimit-Remaining"] = str(decision.remaining)
    response.headers["RateLimit-Reset"] = str(math.ceil(decision.reset_s))


def _bearer_fingerprint() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return hashlib.sha256(token.strip().encode()).hexdigest()[:32]


def install(app: Flask, config: RateLimitConfig, store: Store | None = None) -> None:
    """Check both limits before every request; report the tighter budget on every answer.

    The store (made from `config` unless given) is kept in `app.extensions` for other
    limits to share.
    """
    if config.trusted_proxies > 0:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=config.trusted_proxies)  # type: ignore[method-assign]
    buckets = store if store is not None else make_store(config)
    app.extensions[EXTENSION] = buckets
    if not config.per_key_rate and not config.per_ip_rate:
        return

    @app.before_request
    def _limit() -> None:
        hits: list[Hit] = []
        if config.per_ip_rate:
            # An IPv6 client is its /64, an IPv4 one its address (shared/clients.py).
            address = client_key(request.remote_addr or "unknown")
            hits.append((f"ip:{address}", config.per_ip_rate, config.per_ip_burst))
        fingerprint = _bearer_fingerprint() if config.per_key_rate else None
        if fingerprint is not None:
            hits.append((f"key:{fingerprint}", config.per_key_rate, config.per_key_burst))
        if not hits:
            return
        # Both buckets in one call: one Redis round trip per request.
        decisions = buckets.hit_all(hits)
        tightest = min(decisions, key=lambda d: (d.allowed, d.remaining))
        g.rate_limit = tightest
        if not tightest.allowed:
            wait = max(1, math.ceil(tightest.retry_after_s))
            raise RateLimited(
                f"too many requests; retry in {wait} s",
                headers={
                    "Retry-After": str(wait),
                    "RateLimit-Limit": str(tightest.limit),
                    "RateLimit-Remaining": "0",
                    "RateLimit-Reset": str(math.ceil(tightest.reset_s)),
                },
            )

    @app.after_request
    def _report(response: Response) -> Response:
        decision = g.get("rate_limit")
        if decision is not None and decision.allowed:
            _headers(response, decision)
        return response
