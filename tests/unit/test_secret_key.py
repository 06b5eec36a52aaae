"""SETTLE_SECRET_KEY: production starts only with a key as strong as 32 random bytes."""

from __future__ import annotations

import base64
import secrets

import pytest

from services.core.config import CoreConfig
from services.notifier.config import NotifierConfig
from shared.settings import (
    DEV_SECRET_KEY,
    MAKE_SECRET_KEY,
    SettingsError,
    env_secret_key,
    secret_key_weakness,
)
from tests.support.keys import test_xpub as make_xpub

#: What each service needs besides the key to start in production.
BASE = {
    "SETTLE_ENV": "production",
    "SETTLE_DEPOSIT_XPUB": make_xpub(),
    "SETTLE_DATABASE_URL": "postgresql+psycopg://settle@127.0.0.1:5432/settle",
}
WEAK = [
    DEV_SECRET_KEY,  # the dev default: public, in this repository
    f"  {DEV_SECRET_KEY}\n",
    "x",  # one character: production used to start with it
    "bench-secret",
    "soak-secret-key",
    secrets.token_urlsafe(24),  # random, but 24 bytes
    secrets.token_hex(31),  # 62 hex digits: 31 bytes
    "a" * 64,
    "ab" * 40,
]


@pytest.mark.parametrize("config", [CoreConfig, NotifierConfig])
@pytest.mark.parametrize("key", [None, "", *WEAK])
def test_production_refuses_a_missing_default_or_weak_key(config: type, key: str | None) -> None:
    # Given production with SETTLE_SECRET_KEY unset, the dev default, or short/patterned
    env = dict(BASE) if key is None else {**BASE, "SETTLE_SECRET_KEY": key}
    # When a service reads its settings, Then it stops, naming the variable and the fix
    with pytest.raises(SettingsError) as refused:
        config.from_env(env)
    message = str(refused.value)
    assert message.startswith("SETTLE_SECRET_KEY ")
    assert "32 random bytes" in message and MAKE_SECRET_KEY in message


@pytest.mark.parametrize(
    "key",
    [
        secrets.token_urlsafe(32),  # the documented command
        secrets.token_hex(32),
        secrets.token_hex(32).upper(),
        base64.b64encode(secrets.token_bytes(32)).decode(),  # openssl rand -base64 32
        secrets.token_urlsafe(64),
        "Zq7!" + secrets.token_urlsafe(48) + "#",  # a password manager's long random text
    ],
)
def test_production_starts_with_a_random_key_of_32_bytes(key: str) -> None:
    env = {**BASE, "SETTLE_SECRET_KEY": key}
    assert NotifierConfig.from_env(env).secret_key == key
    assert CoreConfig.from_env(env).secret_key == key


def test_the_documented_command_always_makes_an_accepted_key() -> None:
    for _ in range(2000):
        assert secret_key_weakness(secrets.token_urlsafe(32)) is None
        assert secret_key_weakness(secrets.token_hex(32)) is None


def test_dev_keeps_the_dev_default_and_takes_any_key() -> None:
    assert env_secret_key({}, "dev") == DEV_SECRET_KEY
    assert env_secret_key({"SETTLE_SECRET_KEY": "x"}, "dev") == "x"
    assert NotifierConfig.from_env({}).secret_key == DEV_SECRET_KEY
    assert CoreConfig.from_env({}).secret_key == DEV_SECRET_KEY


def test_a_hex_key_needs_ten_distinct_digits() -> None:
    assert secret_key_weakness("0123456789" * 7) is None
    assert secret_key_weakness("012345678" * 8) is not None
