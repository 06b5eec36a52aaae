"""services/notifier/trust.py: which bus messages the notifier takes as core's."""

from __future__ import annotations

import pika
import pytest

from services.core.config import CoreConfig
from services.notifier.config import NotifierConfig
from services.notifier.trust import untrusted_reason
from shared.bus import RabbitPublisher
from shared.settings import SettingsError


def test_only_core_users_messages_are_trusted() -> None:
    core = pika.BasicProperties(user_id="settle-core")
    assert untrusted_reason(core, "settle-core") is None
    assert "no AMQP user_id" in (untrusted_reason(pika.BasicProperties(), "settle-core") or "")
    assert "'mallory'" in (
        untrusted_reason(pika.BasicProperties(user_id="mallory"), "settle-core") or ""
    )
    assert untrusted_reason(None, "settle-core") is not None
    # A different case is another user to RabbitMQ
    assert untrusted_reason(pika.BasicProperties(user_id="Settle-Core"), "settle-core")


def test_the_relay_stamps_the_user_of_its_url() -> None:
    # Given the relay's publisher for core's URL (no connection is made here)
    publisher = RabbitPublisher("amqp://settle-core:pw@rabbitmq:5672/%2F")
    # Then every message it sends carries that user as user_id
    assert publisher.user_id == "settle-core"
    assert RabbitPublisher("amqp://127.0.0.1:5672/%2F").user_id == "guest"  # pika's default


def test_core_amqp_user_setting() -> None:
    assert NotifierConfig.from_env({}).core_amqp_user == "guest"  # dev and tests
    env = {"SETTLE_CORE_AMQP_USER": "settle-core"}
    assert NotifierConfig.from_env(env).core_amqp_user == "settle-core"
    assert CoreConfig.from_env({}).amqp_url is None


def test_production_names_core_user_and_never_trusts_guest() -> None:
    env = {
        "SETTLE_ENV": "production",
        "SETTLE_DATABASE_URL": "postgresql+psycopg://settle@127.0.0.1:5432/settle",
        "SETTLE_SECRET_KEY": "k" + "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGH",
        "SETTLE_AMQP_URL": "amqp://settle-notifier:pw@rabbitmq:5672/%2F",
    }
    for unset_or_guest in ({}, {"SETTLE_CORE_AMQP_USER": "guest"}):
        with pytest.raises(SettingsError, match="SETTLE_CORE_AMQP_USER"):
            NotifierConfig.from_env({**env, **unset_or_guest})
    named = NotifierConfig.from_env({**env, "SETTLE_CORE_AMQP_USER": "settle-core"})
    assert named.core_amqp_user == "settle-core"
