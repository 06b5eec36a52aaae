"""Core's settings, read once from the environment into a typed, frozen object."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.core.deposits.settings import PipelineSettings
from services.core.retention import OutboxRetention
from services.core.statements.settings import StatementSettings
from shared.identity.signin_guard import SIGNIN_THROTTLE_OFF, SignInLimits
from shared.partitions import PartitionSettings
from shared.ratelimit import RATE_LIMITS_OFF, RateLimitConfig
from shared.settings import (
    DEV_SECRET_KEY,
    SettingsError,
    data_dir,
    default_database_url,
    env_bool,
    env_float,
    env_mode,
    env_secret_key,
    env_str,
    environ,
)

_RPC_VAR = re.compile(r"^SETTLE_RPC_URL_(\d+)$")


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    value = env_float(env, name, default)
    if value <= 0:
        raise SettingsError(f"{name} must be greater than 0, got {value}")
    return value


def _public_url(env: Mapping[str, str]) -> str | None:
    value = env_str(env, "SETTLE_PUBLIC_URL")
    if value is None:
        return None
    if not value.startswith(("https://", "http://")) or "#" in value or "?" in value:
        raise SettingsError(f"SETTLE_PUBLIC_URL must be an http(s) base URL, got {value!r}")
    return value.rstrip("/")


@dataclass(frozen=True)
class CoreConfig:
    database_url: str
    identity_database_url: str
    env: str = "dev"
    amqp_url: str | None = None
    data_dir: Path = Path("./.settle")
    chains_file: Path | None = None
    #: BIP32 extended public key the deposit addresses derive from.
    deposit_xpub: str | None = None
    #: Sandbox deposits for every tenant (not only sandbox tenants).
    sandbox: bool = False
    rpc_urls: Mapping[int, str] = field(default_factory=dict)
    fee_refresh_s: float = 30.0
    #: How long GET /v1/chains may serve fees read from the database.
    chains_cache_s: float = 1.0
    #: How often the worker gives accounts created since its last pass the addresses of
    #: chains activated since they were created (services/core/backfill.py).
    address_backfill_interval_s: float = 300.0
    db_pool_size: int = 10
    #: Per-key and per-IP request limits (from_env: on; built in code: off).
    rate_limits: RateLimitConfig = RATE_LIMITS_OFF
    #: Sign-in failure counters and the bound on password checks (from_env: counting on).
    signin: SignInLimits = SIGNIN_THROTTLE_OFF
    #: The deposit pipeline's knobs (docs/DEPOSITS.md, "Settings").
    deposits: PipelineSettings = field(default_factory=PipelineSettings)
    #: The base URL people open Settle at (portal links); None: the request's own.
    public_url: str | None = None
    #: SETTLE_SECRET_KEY: encrypts what must not rest in plaintext (idempotency records).
    secret_key: str = DEV_SECRET_KEY
    #: Statements' limits and signing key (docs/DEPOSITS.md, "Statements").
    statements: StatementSettings = field(default_factory=StatementSettings)
    #: How long outbox rows are kept (their partitions dropped after: retention.py).
    retention: OutboxRetention = field(default_factory=OutboxRetention)
    #: Partition length, how many are made ahead, how often (shared.partitions).
    partitions: PartitionSettings = field(default_factory=PartitionSettings)

    @property
    def is_dev(self) -> bool:
        return self.env == "dev"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CoreConfig:
        env = environ() if env is None else env
        mode = env_mode(env)
        database_url = default_database_url(env)
        xpub = env_str(env, "SETTLE_DEPOSIT_XPUB")
        if mode == "production" and not xpub:
            raise SettingsError("SETTLE_DEPOSIT_XPUB is required in production")
        chains_file = env_str(env, "SETTLE_CHAINS_FILE")
        rpc_urls = {
            int(m.group(1)): value
            for name, value in env.items()
            if (m := _RPC_VAR.match(name)) and value
        }
        return cls(
            database_url=database_url,
            identity_database_url=env_str(env, "SETTLE_IDENTITY_DATABASE_URL", database_url)
            or database_url,
            env=mode,
            amqp_url=env_str(env, "SETTLE_AMQP_URL"),
            data_dir=data_dir(env),
            chains_file=Path(chains_file) if chains_file else None,
            deposit_xpub=xpub,
            sandbox=env_bool(env, "SETTLE_SANDBOX", mode == "dev"),
            rpc_urls=rpc_urls,
            fee_refresh_s=env_float(env, "SETTLE_FEE_REFRESH_S", 30.0),
            chains_cache_s=env_float(env, "SETTLE_CHAINS_CACHE_S", 1.0),
            address_backfill_interval_s=_positive(env, "SETTLE_ADDRESS_BACKFILL_INTERVAL_S", 300.0),
            rate_limits=RateLimitConfig.from_env(env),
            signin=SignInLimits.from_env(env),
            deposits=PipelineSettings.from_env(env),
            public_url=_public_url(env),
            secret_key=env_secret_key(env, mode),
            statements=StatementSettings.from_env(env),
            retention=OutboxRetention.from_env(env),
            partitions=PartitionSettings.from_env(env),
        )
