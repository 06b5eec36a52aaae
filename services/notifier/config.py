"""Notifier's settings, read once from the environment."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.notifier.retention import WebhookRetention
from shared.partitions import PartitionSettings
from shared.ratelimit import RATE_LIMITS_OFF, RateLimitConfig
from shared.settings import (
    SettingsError,
    data_dir,
    default_database_url,
    env_bool,
    env_float,
    env_int,
    env_mode,
    env_secret_key,
    env_str,
    environ,
    parse_schedule,
)

#: Retry schedule of DESIGN.md: nine retries over about two days.
DEFAULT_RETRY_SCHEDULE = "5s,1m,5m,30m,2h,5h,10h,10h,24h"
#: The lease outlasts an attempt's deadline by at least this: the attempt is recorded
#: after the deadline, and that takes a round trip to PostgreSQL on a busy machine.
MIN_LEASE_MARGIN_S = 0.5
#: Longest attempt deadline accepted (a receiver has 10 s by default).
MAX_WEBHOOK_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class NotifierConfig:
    database_url: str
    identity_database_url: str
    secret_key: str
    env: str = "dev"
    amqp_url: str | None = None
    data_dir: Path = Path("./.settle")
    retry_schedule: tuple[float, ...] = parse_schedule(DEFAULT_RETRY_SCHEDULE)
    #: Fraction of each retry delay added or removed at random.
    retry_jitter: float = 0.2
    #: One deadline per attempt: DNS, connect, TLS, send and read together.
    webhook_timeout_s: float = 10.0
    #: Dev only: allow http:// URLs and loopback/private targets.
    allow_private: bool = False
    #: An endpoint whose attempts all failed for this long is disabled.
    disable_after_s: float = 3 * 86400.0
    #: Attempts to an endpoint failing in a row before the tenant is sent
    #: `webhook.endpoint_failing` (once per run).
    failing_after_attempts: int = 5
    #: Concurrent attempts to one endpoint per worker process.
    per_endpoint_concurrency: int = 4
    #: Most of a worker's threads one tenant's attempts may hold at once (a fraction).
    tenant_share: float = 0.5
    #: Attempts to one endpoint failing in a row before its breaker opens.
    breaker_threshold: int = 5
    #: First and longest time an open breaker holds an endpoint's deliveries back.
    breaker_cooldown_s: float = 10.0
    breaker_max_cooldown_s: float = 300.0
    #: Bounds on a receiver's Retry-After (429/503).
    retry_after_max_s: float = 3600.0
    #: The sweeper re-enqueues due deliveries whose lease lapsed, every this often.
    sweep_interval_s: float = 5.0
    #: How overdue a delivery must be before the sweeper re-sends it.
    sweep_grace_s: float = 30.0
    #: Most deliveries the sweeper re-sends per round.
    sweep_batch: int = 500
    #: A worker's lease on a delivery = the attempt's deadline + this.
    lease_margin_s: float = 5.0
    #: Consumer prefetch (unacked domain events in flight; it also bounds a batch).
    prefetch: int = 64
    worker_threads: int = 16
    #: Live (not deleted) webhook endpoints a tenant may have.
    max_endpoints_per_tenant: int = 20
    db_pool_size: int = 10
    #: Per-key and per-IP request limits (from_env: on; built in code: off).
    rate_limits: RateLimitConfig = RATE_LIMITS_OFF
    #: The RabbitMQ user core's relay publishes as: events with another AMQP user_id are
    #: dead-lettered (services/notifier/trust.py). guest suits dev and tests only.
    core_amqp_user: str = "guest"
    #: How long events, deliveries and attempts are kept (their partitions dropped after).
    retention: WebhookRetention = field(default_factory=WebhookRetention)
    #: Partition length, how many are made ahead, how often (shared.partitions).
    partitions: PartitionSettings = field(default_factory=PartitionSettings)

    @property
    def is_dev(self) -> bool:
        return self.env == "dev"

    @property
    def lease_s(self) -> float:
        """How long a worker holds a delivery: always longer than an attempt can take."""
        return self.webhook_timeout_s + self.lease_margin_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NotifierConfig:
        env = environ() if env is None else env
        mode = env_mode(env)
        core_url = default_database_url(env)
        secret_key = env_secret_key(env, mode)
        allow_private = env_bool(env, "SETTLE_WEBHOOK_ALLOW_PRIVATE", False)
        worker_threads = env_int(env, "SETTLE_NOTIFIER_WORKER_THREADS", 16)
        if allow_private and mode == "production":
            raise SettingsError("SETTLE_WEBHOOK_ALLOW_PRIVATE is for dev only")
        amqp_url = env_str(env, "SETTLE_AMQP_URL")
        core_amqp_user = env_str(env, "SETTLE_CORE_AMQP_USER")
        if mode == "production" and amqp_url and core_amqp_user in (None, "guest"):
            # Trusting guest would let anyone with the broker's default login forge events.
            raise SettingsError(
                "SETTLE_CORE_AMQP_USER must name the RabbitMQ user core publishes as "
                "(not guest) in production: see deploy/README.md, The bus"
            )
        return cls(
            database_url=env_str(env, "SETTLE_NOTIFIER_DATABASE_URL", core_url) or core_url,
            identity_database_url=env_str(env, "SETTLE_IDENTITY_DATABASE_URL", core_url)
            or core_url,
            secret_key=secret_key,
            env=mode,
            amqp_url=amqp_url,
            data_dir=data_dir(env),
            retry_schedule=parse_schedule(
                env_str(env, "SETTLE_WEBHOOK_RETRY_SCHEDULE", DEFAULT_RETRY_SCHEDULE)
                or DEFAULT_RETRY_SCHEDULE
            ),
            webhook_timeout_s=_timeout(env),
            allow_private=allow_private,
            disable_after_s=env_float(env, "SETTLE_WEBHOOK_DISABLE_AFTER_S", 3 * 86400.0),
            failing_after_attempts=_count(env, "SETTLE_WEBHOOK_FAILING_AFTER_ATTEMPTS", 5),
            per_endpoint_concurrency=env_int(env, "SETTLE_WEBHOOK_ENDPOINT_CONCURRENCY", 4),
            tenant_share=_share(env, "SETTLE_WEBHOOK_TENANT_SHARE", 0.5),
            breaker_threshold=_count(env, "SETTLE_WEBHOOK_BREAKER_FAILURES", 5),
            breaker_cooldown_s=_seconds(
                env, "SETTLE_WEBHOOK_BREAKER_COOLDOWN_S", 10.0, zero_ok=False
            ),
            breaker_max_cooldown_s=_seconds(
                env, "SETTLE_WEBHOOK_BREAKER_MAX_COOLDOWN_S", 300.0, zero_ok=False
            ),
            worker_threads=worker_threads,
            # Each worker thread holds a connection while its POST is in flight.
            db_pool_size=max(10, worker_threads + 4),
            max_endpoints_per_tenant=env_int(env, "SETTLE_WEBHOOK_MAX_ENDPOINTS", 20),
            # Engine knobs (sweeper, lease, consumer); EngineSettings derives from these.
            sweep_interval_s=_seconds(env, "SETTLE_WEBHOOK_SWEEP_INTERVAL_S", 5.0, zero_ok=False),
            sweep_grace_s=_seconds(env, "SETTLE_WEBHOOK_SWEEP_GRACE_S", 30.0, zero_ok=True),
            sweep_batch=_count(env, "SETTLE_WEBHOOK_SWEEP_BATCH", 500),
            lease_margin_s=_lease_margin(env),
            prefetch=_count(env, "SETTLE_NOTIFIER_PREFETCH", 64),
            rate_limits=RateLimitConfig.from_env(env),
            core_amqp_user=core_amqp_user or "guest",
            retention=WebhookRetention.from_env(env),
            partitions=PartitionSettings.from_env(env),
        )


def _seconds(env: Mapping[str, str], name: str, default: float, *, zero_ok: bool) -> float:
    """A finite, non-negative number of seconds; `zero_ok=False` also refuses 0.

    Why: a zero sweep interval would spin the sweeper, and NaN or a negative lease
    margin would make every lease expire at once.
    """
    value = env_float(env, name, default)
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = "0 or more" if zero_ok else "more than 0"
        raise SettingsError(f"{name} must be a number of seconds, {bound}, got {env.get(name)!r}")
    return value


def _share(env: Mapping[str, str], name: str, default: float) -> float:
    """A fraction of a worker's threads: more than 0, at most 1."""
    value = env_float(env, name, default)
    if not (math.isfinite(value) and 0 < value <= 1):
        raise SettingsError(
            f"{name} must be a fraction, more than 0 and at most 1, got {env.get(name)!r}"
        )
    return value


def _timeout(env: Mapping[str, str]) -> float:
    """The attempt deadline: more than 0, at most MAX_WEBHOOK_TIMEOUT_S."""
    name = "SETTLE_WEBHOOK_TIMEOUT_S"
    value = _seconds(env, name, 10.0, zero_ok=False)
    if value > MAX_WEBHOOK_TIMEOUT_S:
        raise SettingsError(
            f"{name} must be a number of seconds, at most {MAX_WEBHOOK_TIMEOUT_S:.0f}, "
            f"got {env.get(name)!r}"
        )
    return value


def _lease_margin(env: Mapping[str, str]) -> float:
    """At least MIN_LEASE_MARGIN_S, so the lease always outlasts the attempt's deadline.

    Why: a lease that lapses while its attempt is still running lets the sweeper send
    the same delivery again beside it.
    """
    name = "SETTLE_WEBHOOK_LEASE_MARGIN_S"
    value = _seconds(env, name, 5.0, zero_ok=True)
    if value < MIN_LEASE_MARGIN_S:
        raise SettingsError(
            f"{name} must be a number of seconds, at least {MIN_LEASE_MARGIN_S} (the lease "
            f"must outlast the attempt's deadline), got {env.get(name)!r}"
        )
    return value


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    """A whole number of at least 1 (a prefetch of 0 means unlimited to RabbitMQ)."""
    value = env_int(env, name, default)
    if value < 1:
        raise SettingsError(f"{name} must be a whole number of at least 1, got {env.get(name)!r}")
    return value
