"""Trust on the bus: only core's events become deliveries.

Core's relay connects to RabbitMQ as its own user and stamps that name on every
message as the AMQP `user_id` property; RabbitMQ refuses a message whose `user_id`
is not the publishing connection's user (unless that user has the `impersonator`
tag: never give it one). So a message whose `user_id` is core's user was published
by core. Anything else (no `user_id`, or another user's) was published by someone
else with access to the broker, and is dead-lettered unread: it is never stored and
never delivered, whatever its body says.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

if TYPE_CHECKING:
    from services.notifier.metrics import NotifierMetrics

log = logging.getLogger(__name__)

#: Label of `settle_notifier_events` for messages refused here.
UNTRUSTED = "untrusted"


def untrusted_reason(properties: BasicProperties | None, core_user: str) -> str | None:
    """Why a message was not published by `core_user`, or None when it was."""
    user_id = getattr(properties, "user_id", None)
    if user_id is None:
        return "it has no AMQP user_id"
    if user_id != core_user:
        return f"its AMQP user_id is {user_id!r}, not core's {core_user!r}"
    return None


def admit(
    channel: BlockingChannel,
    method: Basic.Deliver,
    properties: BasicProperties | None,
    core_user: str,
    metrics: NotifierMetrics | None = None,
) -> bool:
    """True for core's messages; any other is rejected to the dead-letter queue here."""
    reason = untrusted_reason(properties, core_user)
    if reason is None:
        return True
    log.error(
        "dead-lettered an event not published by core: %s (message_id=%r, type=%r)",
        reason,
        getattr(properties, "message_id", None),
        method.routing_key,
    )
    if metrics is not None:
        metrics.events.labels(UNTRUSTED).inc()
    channel.basic_reject(method.delivery_tag, requeue=False)
    return False
