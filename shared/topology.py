"""Settle's RabbitMQ topology: every exchange and queue, their types and arguments, once.

Every queue is a quorum queue (replicated over the cluster's nodes, Raft-committed
before a publisher confirm), with a delivery limit: a message handed out that many
times without being settled (a consumer that dies on it, again and again) is a
poison message and is dead-lettered instead of crashing consumers forever.

    settle.events            topic exchange, routing key = event type (core publishes)
    settle.notifier.events   the notifier's events, bound with `#`; poison and refused
                             messages -> settle.events.dlx (fanout) -> ...events.dead
    webhooks, webhooks.retry the delivery jobs (first attempts; scheduled retries, so a
                             retry backlog never holds up first attempts), each with
                             Dramatiq's `.DQ` (delayed) and `.XQ` (dead letters: jobs
                             that raised or hit the delivery limit, kept 7 days)

The services declare all of it with these arguments; deploy/rabbitmq/definitions.py
writes the same into the broker's definitions. A queue declared before (a classic
queue) cannot change type in place: `settle notifier upgrade-queues` moves it
(docs/DEPLOY.md).

Standard library only: deploy/rabbitmq/definitions.py imports it in a plain Python image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EVENTS_EXCHANGE = "settle.events"
DEAD_LETTER_EXCHANGE = "settle.events.dlx"
NOTIFIER_QUEUE = "settle.notifier.events"
NOTIFIER_DEAD_QUEUE = "settle.notifier.events.dead"
#: The delivery job queues: first attempts, scheduled retries.
JOB_QUEUE = "webhooks"
RETRY_JOB_QUEUE = "webhooks.retry"
JOB_QUEUES = (JOB_QUEUE, RETRY_JOB_QUEUE)

#: Hand-outs of one event message before it is dead-lettered as poison. High: the
#: consumer keeps a batch in hand through a database outage rather than return it, so
#: only a consumer that dies on a message (or a node loss mid-batch) counts.
EVENT_DELIVERY_LIMIT = 20
#: Hand-outs of one delivery job. Lower: a job is only a nudge (the sweeper sends a due
#: delivery again whatever became of its job), and a worker's stop returns its prefetch.
JOB_DELIVERY_LIMIT = 10
#: How long Dramatiq keeps a dead job (its DEAD_MESSAGE_TTL: 7 days).
DEAD_JOB_TTL_MS = 86_400_000 * 7

QUORUM = {"x-queue-type": "quorum"}


def delay_queue(queue: str) -> str:
    """Dramatiq's delayed-message queue of `queue`."""
    return queue + ".DQ"


def dead_job_queue(queue: str) -> str:
    """Dramatiq's dead-letter queue of `queue`."""
    return queue + ".XQ"


def _dead_lettered(exchange: str, limit: int, routing_key: str | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        **QUORUM,
        "x-delivery-limit": limit,
        "x-dead-letter-exchange": exchange,
        # At least once: a dead letter leaves the queue only once the dead-letter queue
        # has it (the default drops it if that queue is unavailable). Needs reject-publish.
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    if routing_key is not None:
        arguments["x-dead-letter-routing-key"] = routing_key
    return arguments


def events_queue_arguments(prefix: str = "") -> dict[str, Any]:
    return _dead_lettered(prefix + DEAD_LETTER_EXCHANGE, EVENT_DELIVERY_LIMIT)


def dead_queue_arguments() -> dict[str, Any]:
    return dict(QUORUM)


def job_queue_arguments(full_name: str) -> dict[str, Any]:
    """A job queue or its `.DQ` (`full_name` is the job queue's, prefix included)."""
    return _dead_lettered("", JOB_DELIVERY_LIMIT, routing_key=dead_job_queue(full_name))


def dead_job_queue_arguments() -> dict[str, Any]:
    # Dramatiq's static TTL: messages expire in order, head first.
    return {**QUORUM, "x-message-ttl": DEAD_JOB_TTL_MS}


@dataclass(frozen=True)
class Queue:
    """One queue: its full name, arguments, and (exchange, routing key) bindings."""

    name: str
    arguments: dict[str, Any]
    bindings: tuple[tuple[str, str], ...] = ()


def event_queues(prefix: str = "") -> list[Queue]:
    """The notifier's event queue and its dead-letter queue (first)."""
    return [
        Queue(
            prefix + NOTIFIER_DEAD_QUEUE,
            dead_queue_arguments(),
            ((prefix + DEAD_LETTER_EXCHANGE, ""),),
        ),
        Queue(
            prefix + NOTIFIER_QUEUE,
            events_queue_arguments(prefix),
            ((prefix + EVENTS_EXCHANGE, "#"),),
        ),
    ]


def queues(prefix: str = "") -> list[Queue]:
    """Every queue of Settle under `prefix` (SETTLE_AMQP_PREFIX), dead-letter queues first."""
    found = event_queues(prefix)
    for job_queue in JOB_QUEUES:
        name = prefix + job_queue
        found += [
            Queue(dead_job_queue(name), dead_job_queue_arguments()),
            Queue(name, job_queue_arguments(name)),
            Queue(delay_queue(name), job_queue_arguments(name)),
        ]
    return found


def exchanges(prefix: str = "") -> list[tuple[str, str]]:
    """(name, type) of Settle's exchanges."""
    return [(prefix + EVENTS_EXCHANGE, "topic"), (prefix + DEAD_LETTER_EXCHANGE, "fanout")]
