"""The Dramatiq broker of the delivery jobs, built on request (nothing at import time).

`build_broker(config)` gives Dramatiq's RabbitMQ broker for `config.amqp_url`, or
its in-memory StubBroker when there is no AMQP URL (the embedded mode, unit tests).

Job messages are persistent but published without confirms: a job only nudges a
worker toward a delivery whose state is already committed, and the sweeper enqueues
any due delivery that has no job in flight, so a job lost with RabbitMQ delays a
delivery but never loses it. Waiting for a disk-synced confirm per job would cost a
round trip per delivery for no added safety.

Workers normally run through `settle notifier worker`, which starts Dramatiq's
`Worker` in-process. To run Dramatiq's own CLI instead, name the setup function:

    dramatiq services.notifier.broker:setup_from_env --threads 16

(`dramatiq` calls it in every worker process; it builds the broker from the
environment, declares the actors on it and makes it Dramatiq's global broker.)
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    Middleware,
    Pipelines,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

#: An actor running longer than this is interrupted (it never should: HTTP has timeouts).
ACTOR_TIME_LIMIT_MS = 5 * 60 * 1000


def middleware() -> list[Middleware]:
    """Dramatiq's defaults, with its retries off (the actors schedule their own)."""
    return [
        AgeLimit(),
        TimeLimit(time_limit=ACTOR_TIME_LIMIT_MS),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(max_retries=0),
    ]


def build_broker(config: Any) -> dramatiq.Broker:
    """RabbitMQ when `config.amqp_url` is set, else the in-memory stub."""
    if config.amqp_url:
        return RabbitmqBroker(url=config.amqp_url, confirm_delivery=False, middleware=middleware())
    return StubBroker(middleware=middleware())


def setup_from_env() -> dramatiq.Broker:
    """For the `dramatiq` CLI: engine from the environment, actors declared, broker global."""
    from services.notifier.config import NotifierConfig
    from services.notifier.context import NotifierContext
    from services.notifier.engine import EngineSettings, build_engine

    config = NotifierConfig.from_env()
    engine = build_engine(NotifierContext.build(config), EngineSettings.from_env(config))
    dramatiq.set_broker(engine.broker)
    return engine.broker
