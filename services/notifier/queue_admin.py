"""The notifier's queues as they stand in RabbitMQ, and their upgrade to quorum queues.

`survey` reads each queue of shared/topology.py: absent, present as declared there,
or present with other arguments (a classic queue from before: RabbitMQ cannot change
a queue's type in place, and refuses a declaration that differs, 406). `settle doctor`
reports it; `settle notifier upgrade-queues` (`upgrade`) replaces each such queue by a
quorum queue of the same name, with the notifier stopped and core's relay stopped
(docs/DEPLOY.md):

- the events queue must be empty (the consumer drained it while the relay was
  stopped; the events not yet published wait in core's outbox): its messages carry
  core's user as `user_id`, which no other user may publish again;
- dead-letter queues are moved through a quorum queue `<name>.upgrading` (published
  again with confirms, then acked; a message's `user_id` travels as the header
  `x-settle-user-id`, which RabbitMQ would refuse from the notifier's user);
- delivery job queues are emptied: a job is only a nudge, and the sweeper sends every
  due delivery again whatever became of its job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from shared import topology

log = logging.getLogger(__name__)

#: Suffix of the quorum queue a dead-letter queue's messages wait in while it is replaced.
UPGRADING = ".upgrading"
#: Where a moved message's `user_id` goes (only its publisher's own user may set it).
USER_ID_HEADER = "x-settle-user-id"


class UpgradeRefused(RuntimeError):
    """A queue cannot be replaced without losing messages; the message says what to do."""


@dataclass(frozen=True)
class QueueState:
    queue: topology.Queue
    #: Messages ready in it; None when it does not exist.
    messages: int | None
    #: Declared with topology's arguments (a quorum queue); False: a classic one from before.
    current: bool

    @property
    def name(self) -> str:
        return self.queue.name


def _fresh(connection: BlockingConnection, channel: BlockingChannel) -> BlockingChannel:
    """The channel, or a new one when the broker closed it (a 404 or 406 does)."""
    return channel if channel.is_open else connection.channel()


def survey(connection: BlockingConnection, prefix: str = "") -> list[QueueState]:
    """The state of each queue of the topology; declares nothing that is absent."""
    states = []
    channel = connection.channel()
    for queue in topology.queues(prefix):
        channel = _fresh(connection, channel)
        try:
            found = channel.queue_declare(queue.name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as err:
            if err.reply_code != 404:
                raise
            states.append(QueueState(queue, None, False))
            continue
        channel = _fresh(connection, channel)
        try:
            # It exists: declaring it with the same arguments is a no-op; other ones, 406.
            channel.queue_declare(queue.name, durable=True, arguments=queue.arguments)
            current = True
        except pika.exceptions.ChannelClosedByBroker as err:
            if err.reply_code != 406:
                raise
            current = False
        states.append(QueueState(queue, int(found.method.message_count), current))
    if channel.is_open:
        channel.close()
    return states


def declare(channel: BlockingChannel, queue: topology.Queue) -> None:
    channel.queue_declare(queue.name, durable=True, arguments=queue.arguments)
    for exchange, routing_key in queue.bindings:
        channel.queue_bind(queue.name, exchange, routing_key=routing_key)


def declare_all(channel: BlockingChannel, prefix: str = "") -> None:
    """Every exchange and queue of the topology, bound (what the processes declare)."""
    for exchange, kind in topology.exchanges(prefix):
        channel.exchange_declare(exchange, exchange_type=kind, durable=True)
    for queue in topology.queues(prefix):
        declare(channel, queue)


def _move(channel: BlockingChannel, source: str, target: str) -> int:
    """Every ready message of `source` into `target`, each acked once `target` confirmed it."""
    moved = 0
    while True:
        method, properties, body = channel.basic_get(source, auto_ack=False)
        if method is None:
            return moved
        if properties.user_id:
            headers = dict(properties.headers or {})
            headers[USER_ID_HEADER] = properties.user_id
            properties.headers = headers
            properties.user_id = None
        # Confirm mode: basic_publish returns once the broker has it (or raises).
        channel.basic_publish("", target, body, properties=properties, mandatory=True)
        channel.basic_ack(method.delivery_tag)
        moved += 1


def _is_job_queue(queue: topology.Queue, prefix: str) -> bool:
    jobs = {prefix + q for q in topology.JOB_QUEUES}
    return queue.name in jobs or queue.name in {topology.delay_queue(q) for q in jobs}


def upgrade(
    connection: BlockingConnection, prefix: str = "", say: Callable[[str], None] = log.info
) -> list[str]:
    """Replace every queue that is not as topology.py declares it; returns their names.

    Refuses (UpgradeRefused, before changing anything) while the events queue to be
    replaced holds messages.
    """
    states = survey(connection, prefix)
    stale = [s for s in states if s.messages is not None and not s.current]
    events_queue = prefix + topology.NOTIFIER_QUEUE
    for state in stale:
        if state.name == events_queue and state.messages:
            raise UpgradeRefused(
                f"{state.name} holds {state.messages} events: stop core's relay "
                "(settle core worker), let `settle notifier consume` drain it, stop the "
                "notifier, then run this again"
            )
    channel = connection.channel()
    channel.confirm_delivery()
    for exchange, kind in topology.exchanges(prefix):
        channel.exchange_declare(exchange, exchange_type=kind, durable=True)
    for state in stale:
        queue = state.queue
        if state.name == events_queue or _is_job_queue(queue, prefix):
            dropped = channel.queue_delete(queue.name).method.message_count
            declare(channel, queue)
            what = f", {dropped} jobs dropped (the sweeper sends them again)" if dropped else ""
            say(f"{queue.name}: now a quorum queue{what}")
            continue
        holding = topology.Queue(queue.name + UPGRADING, queue.arguments)
        declare(channel, holding)
        moved = _move(channel, queue.name, holding.name)
        channel.queue_delete(queue.name)
        declare(channel, queue)
        # A new channel: one that published to the classic queue keeps it as classic
        # and RabbitMQ 3.10 fails the channel publishing to its quorum successor.
        channel.close()
        channel = connection.channel()
        channel.confirm_delivery()
        _move(channel, holding.name, queue.name)
        channel.queue_delete(holding.name)
        say(f"{queue.name}: now a quorum queue, {moved} dead letters kept")
    for state in states:
        if state.messages is None:
            declare(channel, state.queue)
            say(f"{state.name}: declared (a quorum queue)")
    channel.close()
    return [state.name for state in stale]
