"""The Dramatiq broker of the delivery jobs, built on request (nothing at import time).

`build_broker(config)` gives Dramatiq's RabbitMQ broker for `config.amqp_url`, or
its in-memory StubBroker when there is no AMQP URL (the embedded mode, unit tests).

Job messages are persistent but published without confirms: a job only nudges a
worker toward a delivery whose state is already committed, and the sweeper enqueues
any due delivery that has no job in flight, so a job lost with RabbitMQ delays a
delivery but never loses it. Waiting for a disk-synced confirm per job would cost a
round trip per delivery for no added safety. Their channels are in confirm mode all
the same, with the confirms never waited for: a channel whose quorum queue refuses it
for good after a node loss drops jobs without a word (shared/bus.py's docstring), so a
nack seen on a thread's channel makes that thread's next job open a new one.

`DeliveryQueues` sends the delivery jobs: every process that makes deliveries (the
API, the consumer, the sweeper, the workers for retries) sends through it, and only
the workers declare the actors that run them (actors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import dramatiq
import pika
import pika.exceptions
import pika.frame
import pika.spec
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import xq_name
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware, Retries, TimeLimit

from shared import topology
from shared.bus import BusNames, amqp_nodes

log = logging.getLogger(__name__)

#: An actor running longer than this is interrupted (it never should: HTTP has timeouts).
ACTOR_TIME_LIMIT_MS = 5 * 60 * 1000


def middleware() -> list[Middleware]:
    """The time limit (a backstop: attempts have their own deadline) and Dramatiq's
    retries, off (the actors schedule their own; a job that raises is dead-lettered).

    Dramatiq's other defaults do nothing for these jobs (no max age, callbacks,
    pipelines or shutdown notices), yet each runs on every job, twice or more.
    """
    return [TimeLimit(time_limit=ACTOR_TIME_LIMIT_MS), Retries(max_retries=0)]


class _AckingConsumer(_RabbitmqConsumer):  # type: ignore[misc]
    """Dramatiq's RabbitMQ consumer, its acks written with the connection's next write.

    Dramatiq acks each job through pika's blocking channel, which then turns the
    connection's I/O loop until that one frame is written: a loop of its own per job,
    a sixth of a worker's CPU. The frame goes into the same buffer here without that
    loop, and the consumer's I/O loop, which never stops turning, writes it out.
    """

    def ack(self, message: dramatiq.Message) -> None:
        try:
            self.known_tags.remove(message._tag)
            self.connection.add_callback_threadsafe(
                partial(self.channel._impl.basic_ack, message._tag)
            )
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as err:
            raise ConnectionClosed(err) from None
        except KeyError:
            self.logger.warning("Failed to ack message: not in known tags.")


class _Broker(RabbitmqBroker):  # type: ignore[misc]
    """Dramatiq's RabbitMQ broker with the consumer above, and jobs sent in batches."""

    @property
    def consumer_class(self) -> type[_RabbitmqConsumer]:
        return _AckingConsumer

    @property
    def channel(self) -> Any:
        """This thread's channel (Dramatiq's), in confirm mode whose confirms nobody waits
        for; a new one (on a new connection) once the broker has nacked a job on it."""
        state = self.state
        if getattr(state, "refused", False):
            state.refused = False
            log.warning("RabbitMQ refused a job (nack) on this thread's channel; opening another")
            del self.connection  # and its channel: the next lines open new ones
        channel = getattr(state, "channel", None)
        if channel is None:
            channel = RabbitmqBroker.channel.fget(self)
            _flag_nacks(channel, state)
        return channel

    @channel.deleter
    def channel(self) -> None:
        RabbitmqBroker.channel.fdel(self)

    # Quorum queues with a delivery limit (shared/topology.py) instead of Dramatiq's
    # classic ones; the same dead-letter routing to `.XQ`.
    def _build_queue_arguments(self, queue_name: str) -> dict[str, Any]:
        return topology.job_queue_arguments(queue_name)

    def _declare_xq_queue(self, queue_name: str) -> Any:
        return self.channel.queue_declare(
            queue=xq_name(queue_name),
            durable=True,
            arguments=topology.dead_job_queue_arguments(),
        )

    def enqueue_all(self, messages: list[dramatiq.Message]) -> None:
        """Publish `messages` (due now), with one wait for the socket for them all.

        Dramatiq's `enqueue` turns the connection's I/O loop until each message is
        written (half the event consumer's CPU at a few hundred jobs a second). All
        but the last go into the channel's buffer; publishing the last through the
        blocking channel writes them all. On a lost connection the whole batch is
        sent again on a new one, as `enqueue` does for one: a job twice is harmless
        (the claim decides), a job lost is found by the sweeper. None of this
        broker's middleware acts on enqueueing, so none is signalled.
        """
        for queue_name in {message.queue_name for message in messages}:
            self.declare_queue(queue_name, ensure=True)
        for attempt in range(1, MAX_ENQUEUE_ATTEMPTS + 1):
            try:
                channel = self.channel
                for index, message in enumerate(messages):
                    publish = (
                        channel.basic_publish
                        if index == len(messages) - 1
                        else channel._impl.basic_publish
                    )
                    publish(
                        exchange="",
                        routing_key=message.queue_name,
                        body=message.encode(),
                        properties=_PERSISTENT,
                    )
                return
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as err:
                del self.connection  # the next attempt opens a new one
                if attempt == MAX_ENQUEUE_ATTEMPTS:
                    raise ConnectionClosed(err) from None


def _flag_nacks(channel: Any, state: Any) -> None:
    """Confirm mode on `channel` (a BlockingChannel) at the protocol level only: its
    publishes do not wait, and a nack, read with the connection's next I/O, sets
    `state.refused` (the thread's state, which owns the channel)."""

    def on_confirm(frame: pika.frame.Method) -> None:
        if isinstance(frame.method, pika.spec.Basic.Nack):
            state.refused = True

    selected: list[bool] = []
    channel._impl.confirm_delivery(
        ack_nack_callback=on_confirm, callback=lambda _frame: selected.append(True)
    )
    channel._flush_output(lambda: bool(selected))


#: Jobs survive a broker restart (as Dramatiq sends them).
_PERSISTENT = pika.BasicProperties(delivery_mode=2)
#: A tenant's deliveries in one enqueue that travel as one job (see DeliveryQueues.enqueue)
#: from this many on, and at most this many per job.
GROUP_MIN = 16
GROUP_MAX = 256
#: Tries to publish a batch of jobs, each on a new connection (as Dramatiq's enqueue).
MAX_ENQUEUE_ATTEMPTS = 3


def build_broker(config: Any) -> dramatiq.Broker:
    """RabbitMQ when `config.amqp_url` is set, else the in-memory stub."""
    if config.amqp_url:
        # Every node of the cluster: pika connects to the first that answers.
        return _Broker(
            url=amqp_nodes(config.amqp_url), confirm_delivery=False, middleware=middleware()
        )
    return StubBroker(middleware=middleware())


class DeliveryQueues:
    """The two delivery job queues of a broker, and the messages sent to them.

    Messages name their actor (`deliver`, `deliver_retry`) without needing the actor
    declared in this process: the API and the consumer send jobs that only workers run.
    """

    #: Actor names and queue names (before the SETTLE_AMQP_PREFIX).
    actor_name = "deliver"
    retry_actor_name = "deliver_retry"
    group_actor_name = "deliver_group"
    QUEUE = topology.JOB_QUEUE
    RETRY_QUEUE = topology.RETRY_JOB_QUEUE

    def __init__(self, broker: dramatiq.Broker, names: BusNames) -> None:
        self.broker = broker
        #: First attempts and sweeper re-sends (due now).
        self.queue = names.queue(self.QUEUE)
        #: Scheduled retries (delayed messages), so a retry backlog never holds up new events.
        self.retry_queue = names.queue(self.RETRY_QUEUE)
        for queue in (self.queue, self.retry_queue):
            broker.declare_queue(queue)

    def enqueue(
        self,
        delivery_ids: list[str],
        routes: Mapping[str, tuple[str, str]] | None = None,
        *,
        groups: Iterable[Sequence[str]] = (),
    ) -> None:
        """First attempts (and sweeper re-sends): due now. `routes` (id -> (endpoint id,
        tenant id)) ride along where known, so a worker can hold a delivery of a busy
        tenant without a claim.

        Each of `groups` (the deliveries of one event, a sweep of one tenant's) whose
        routed deliveries of one tenant number GROUP_MIN or more travels as one job per
        GROUP_MAX (`deliver_group`): an event to 50 endpoints is one message instead of
        fifty ahead of every other tenant's first attempts, and a worker whose tenant
        is full parks them all at once. Many events of a tenant stay one job each: they
        are spread over every worker thread and process, as before.
        """
        routes = routes or {}
        given = set(delivery_ids)
        grouped: set[str] = set()
        group_jobs: list[dramatiq.Message] = []
        for group in groups:
            by_tenant: dict[str, list[list[str]]] = {}
            for delivery_id in group:
                route = routes.get(delivery_id)
                if route is not None and delivery_id in given and delivery_id not in grouped:
                    by_tenant.setdefault(route[1], []).append([delivery_id, route[0]])
            for tenant_id, items in by_tenant.items():
                if len(items) < GROUP_MIN:
                    continue
                grouped.update(delivery_id for delivery_id, _ in items)
                group_jobs += [
                    dramatiq.Message(
                        queue_name=self.queue,
                        actor_name=self.group_actor_name,
                        args=(tenant_id, items[start : start + GROUP_MAX]),
                        kwargs={},
                        options={},
                    )
                    for start in range(0, len(items), GROUP_MAX)
                ]
        # Jobs of their own in the order given; groups after them, so that a batch's
        # small fan-outs are not queued behind its big ones.
        messages = [
            self._first_attempt(delivery_id, routes.get(delivery_id))
            for delivery_id in delivery_ids
            if delivery_id not in grouped
        ]
        messages += group_jobs
        if not messages:
            return
        if isinstance(self.broker, _Broker):
            self.broker.enqueue_all(messages)
            return
        for message in messages:
            self.broker.enqueue(message)

    def _first_attempt(self, delivery_id: str, route: tuple[str, str] | None) -> dramatiq.Message:
        return dramatiq.Message(
            queue_name=self.queue,
            actor_name=self.actor_name,
            args=(delivery_id,),
            kwargs={"route": list(route)} if route else {},
            options={},
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
