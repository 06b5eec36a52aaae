"""Rate limits per API key and per client IP: 429 with Retry-After, budget in headers.

Buckets are GCRA (a token bucket kept as one timestamp) held in the process, so a
check costs no I/O. Each API process enforces its own share: with N gunicorn
workers behind the ingress a client gets at most N x the limit, so set the limits
per process (docs/DECISIONS.md). Buckets idle for longer than they take to refill
are forgotten, so memory stays bounded by the number of active clients.

The API-key bucket is keyed on a hash of the bearer token, not on a database
lookup, so unknown keys are limited too (guessing is throttled) and a check needs
no query.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flask import Flask, Response, g, request
from werkzeug.middleware.proxy_fix import ProxyFix

from shared.errors import RateLimited
from shared.settings import env_float, env_int, environ

#: Forget idle buckets after this many checks.
_SWEEP_EVERY = 10_000


@dataclass(frozen=True)
class RateLimitConfig:
    """Requests per second and burst, per API key and per client IP; 0 turns one off."""

    per_key_rate: float = 100.0
    per_key_burst: int = 200
    per_ip_rate: float = 200.0
    per_ip_burst: int = 400
    #: Proxies in front of the app whose X-Forwarded-For to trust (1 behind our ingress).
    trusted_proxies: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RateLimitConfig:
        env = environ() if env is None else env
        return cls(
            per_key_rate=env_float(env, "SETTLE_RATE_LIMIT_PER_KEY", 100.0),
            per_key_burst=env_int(env, "SETTLE_RATE_LIMIT_PER_KEY_BURST", 200),
            per_ip_rate=env_float(env, "SETTLE_RATE_LIMIT_PER_IP", 200.0),
            per_ip_burst=env_int(env, "SETTLE_RATE_LIMIT_PER_IP_BURST", 400),
            trusted_proxies=env_int(env, "SETTLE_TRUSTED_PROXIES", 0),
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


class Limiter:
    """GCRA buckets by key, thread-safe."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._interval = 1.0 / rate
        self._tolerance = self._interval * (burst - 1)
        self._clock = clock
        self._tat: dict[str, float] = {}
        self._lock = threading.Lock()
        self._checks = 0

    def check(self, key: str) -> Decision:
        """Take one request from `key`'s bucket if it has one."""
        with self._lock:
            now = self._clock()
            self._checks += 1
            if self._checks % _SWEEP_EVERY == 0:
                self._tat = {k: t for k, t in self._tat.items() if t > now}
            tat = max(self._tat.get(key, now), now)
            allow_at = tat - self._tolerance
            if now < allow_at:
                return Decision(False, self.burst, 0, allow_at - now, tat - now)
            new_tat = tat + self._interval
            self._tat[key] = new_tat
            remaining = int((self._tolerance - (new_tat - now - self._interval)) / self._interval)
            return Decision(True, self.burst, max(0, remaining), 0.0, new_tat - now)


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


def install(app: Flask, config: RateLimitConfig) -> None:
    """Check both limits before every request; report the tighter budget on every answer."""
    if config.trusted_proxies > 0:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=config.trusted_proxies)  # type: ignore[method-assign]
    per_key = Limiter(config.per_key_rate, config.per_key_burst) if config.per_key_rate else None
    per_ip = Limiter(config.per_ip_rate, config.per_ip_burst) if config.per_ip_rate else None
    if per_key is None and per_ip is None:
        return

    @app.before_request
    def _limit() -> None:
        decisions = []
        if per_ip is not None:
            decisions.append(per_ip.check(request.remote_addr or "unknown"))
        fingerprint = _bearer_fingerprint() if per_key is not None else None
        if per_key is not None and fingerprint is not None:
            decisions.append(per_key.check(fingerprint))
        if not decisions:
            return
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
