"""NotifierConfig's engine knobs (sweeper, lease, prefetch) and EngineSettings built from them."""

from __future__ import annotations

import pytest

from services.notifier.config import NotifierConfig
from services.notifier.delivery_engine import EngineSettings
from shared.bus import BusNames
from shared.settings import SettingsError

ENGINE_ENV = {
    "SETTLE_WEBHOOK_SWEEP_INTERVAL_S": "0.5",
    "SETTLE_WEBHOOK_SWEEP_GRACE_S": "0",
    "SETTLE_WEBHOOK_SWEEP_BATCH": "50",
    "SETTLE_WEBHOOK_LEASE_MARGIN_S": "1.5",
    "SETTLE_NOTIFIER_PREFETCH": "8",
}


def test_engine_knobs_have_their_documented_defaults() -> None:
    config = NotifierConfig.from_env({})

    assert (
        config.sweep_interval_s,
        config.sweep_grace_s,
        config.sweep_batch,
        config.lease_margin_s,
        config.prefetch,
    ) == (5.0, 30.0, 500, 5.0, 64)
    # And a config built in code has the same defaults as one read from an empty environment
    built = NotifierConfig(database_url="x", identity_database_url="x", secret_key="k")
    assert (built.sweep_grace_s, built.sweep_batch, built.lease_margin_s) == (30.0, 500, 5.0)


def test_engine_knobs_are_read_from_the_environment() -> None:
    config = NotifierConfig.from_env(ENGINE_ENV)

    assert (
        config.sweep_interval_s,
        config.sweep_grace_s,
        config.sweep_batch,
        config.lease_margin_s,
        config.prefetch,
    ) == (0.5, 0.0, 50, 1.5, 8)


def test_engine_settings_come_from_the_config_only() -> None:
    # Given a config with its own knobs, and an environment that says otherwise
    config = NotifierConfig.from_env(ENGINE_ENV)
    other_env = {
        "SETTLE_WEBHOOK_SWEEP_INTERVAL_S": "99",
        "SETTLE_WEBHOOK_SWEEP_GRACE_S": "99",
        "SETTLE_WEBHOOK_SWEEP_BATCH": "99",
        "SETTLE_WEBHOOK_LEASE_MARGIN_S": "99",
        "SETTLE_NOTIFIER_PREFETCH": "99",
        "SETTLE_AMQP_PREFIX": "t1",
    }

    settings = EngineSettings.from_env(config, other_env)

    # Then every knob is the config's, and only the bus names follow the environment
    assert settings.sweep_interval_s == 0.5
    assert settings.sweep_grace_s == 0.0
    assert settings.sweep_batch == 50
    assert settings.prefetch == 8
    assert settings.tuning.lease_margin_s == 1.5
    assert settings.names == BusNames.from_env(other_env)
    assert settings.names != BusNames.from_env({})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SETTLE_WEBHOOK_SWEEP_INTERVAL_S", "soon"),
        ("SETTLE_WEBHOOK_SWEEP_INTERVAL_S", "0"),
        ("SETTLE_WEBHOOK_SWEEP_INTERVAL_S", "-1"),
        ("SETTLE_WEBHOOK_SWEEP_INTERVAL_S", "nan"),
        ("SETTLE_WEBHOOK_SWEEP_GRACE_S", "-0.5"),
        ("SETTLE_WEBHOOK_SWEEP_GRACE_S", "inf"),
        ("SETTLE_WEBHOOK_SWEEP_BATCH", "0"),
        ("SETTLE_WEBHOOK_SWEEP_BATCH", "1.5"),
        ("SETTLE_WEBHOOK_LEASE_MARGIN_S", "-5"),
        ("SETTLE_WEBHOOK_LEASE_MARGIN_S", "5s"),
        ("SETTLE_NOTIFIER_PREFETCH", "0"),
        ("SETTLE_NOTIFIER_PREFETCH", "-3"),
        ("SETTLE_NOTIFIER_PREFETCH", "many"),
        ("SETTLE_WEBHOOK_FAILING_AFTER_ATTEMPTS", "0"),
        ("SETTLE_WEBHOOK_FAILING_AFTER_ATTEMPTS", "-1"),
        ("SETTLE_WEBHOOK_FAILING_AFTER_ATTEMPTS", "three"),
    ],
)
def test_a_bad_engine_knob_is_refused_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as refused:
        NotifierConfig.from_env({name: value})

    # The message names the variable and echoes the value, like the other settings do
    assert str(refused.value).startswith(f"{name} must be")
    assert repr(value) in str(refused.value)


def test_an_endpoint_is_failing_after_five_attempts_unless_told_otherwise() -> None:
    assert NotifierConfig.from_env({}).failing_after_attempts == 5
    env = {"SETTLE_WEBHOOK_FAILING_AFTER_ATTEMPTS": "12"}
    assert NotifierConfig.from_env(env).failing_after_attempts == 12
