"""The Dramatiq broker of the delivery jobs, built on request (nothing at import time).

`build_broker(config)` gives Dramatiq's RabbitMQ broker for `config.amqp_url`, or
its in-memory StubBroker when there is no AMQP URL (the embedded mode, unit tests).

Job messages are persistent but published without confirms: a job only nudges a
worker toward a delivery whose state is already committed, and the sweeper enqueues
any due delivery that has no job in flight, so a job lost with RabbitMQ delays a
delivery but never loses it. Waiting for a disk-synced confirm per job would cost a
round trip per delivery for no added safety.

`DeliveryQueues` sends the delivery jobs: every process that makes deliveries (the
API, the consumer, the sweeper, the workers for retries) sends through it, and only
the workers declare the actors that run them (actors.py).
"""

from __future__ import annotations

from collections.abc import Mapping
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

from shared.bus import BusNames

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


class DeliveryQueues:
    """The two delivery job queues of a broker, and the messages sent to them.

    Messages name their actor (`deliver`, `deliver_retry`) without needing the actor
    declared in this process: the API and the consumer send jobs that only workers run.
    """

    #: Actor names and queue names (before the SETTLE_AMQP_PREFIX).
    actor_name = "deliver"
    retry_actor_name = "deliver_retry"
    QUEUE = "webhooks"
    RETRY_QUEUE = "webhooks.retry"

    def __init__(self, broker: dramatiq.Broker, names: BusNames) -> None:
        self.broker = broker
        #: First attempts and sweeper re-sends (due now).
        self.queue = names.queue(self.QUEUE)
        #: Scheduled retries (delayed messages), so a retry backlog never holds up new events.
        self.retry_queue = names.queue(self.RETRY_QUEUE)
        for queue in (self.queue, self.retry_queue):
            broker.declare_queue(queue)

    def enqueue(
        self, delivery_ids: list[str], routes: Mapping[str, tuple[str, str]] | None = None
    ) -> None:
        """First attempts (and sweeper re-sends): due now. `routes` (id -> (endpoint id,
        tenant id)) ride along where known, so a worker can hold a delivery of a busy
        tenant without a claim."""
        routes = routes or {}
        for delivery_id in delivery_ids:
            route = routes.get(delivery_id)
            self.broker.enqueue(
                dramatiq.Message(
                    queue_name=self.queue,
                    actor_name=self.actor_name,
                    args=(delivery_id,),
                    kwargs={"route": list(route)} if route else {},
                    options={},
                )
            )

    def schedule(
        self,
        delivery_id: str,
        delay_s: float,
        *,
        bounces: int = 0,
        route: tuple[str, str] | None = None,
    ) -> None:
        """A later attempt on the retry queue, delayed by `delay_s`.

        `route` (endpoint id, tenant id) lets the worker send a put-back delivery on
        again while its endpoint or tenant is still busy, without a claim.
        """
        kwargs: dict[str, Any] = {"bounces": bounces} if bounces else {}
        if route is not None:
            kwargs["route"] = list(route)
        message = dramatiq.Message(
            queue_name=self.retry_queue,
            actor_name=self.retry_actor_name,
            args=(delivery_id,),
            kwargs=kwargs,
            options={},
        )
        self.broker.enqueue(message, delay=max(0, int(delay_s * 1000)))
