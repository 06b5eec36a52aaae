"""A publisher that RabbitMQ refuses (nack) opens a new channel for what it sends next.

After a cluster node is lost, RabbitMQ 3.10 may refuse every publish of a channel to a
quorum queue for as long as that node stays down (shared/bus.py's docstring): only a new
channel gets through. The chaos test (tests/soak/test_chaos_cluster.py) meets that on a
real cluster; here a queue that refuses every message (`x-max-length` 0, `reject-publish`)
makes the real broker nack, and each publisher must leave the channel behind.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pika
import pytest

from services.notifier.broker import DeliveryQueues, build_broker
from shared.bus import BusNames, OutgoingEvent, PublishError, RabbitPublisher
from tests.support.pipeline import delete_bus, notifier_config, unique_prefix, wait_until
from tests.support.services import AMQP_URL, require_rabbitmq

pytestmark = pytest.mark.integration

#: A classic queue that takes nothing: RabbitMQ nacks every message routed to it.
REFUSING = {"x-max-length": 0, "x-overflow": "reject-publish"}


@pytest.fixture
def names() -> Iterator[BusNames]:
    require_rabbitmq()
    names = BusNames(unique_prefix())
    yield names
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    for queue in ("refusing", "taking"):
        connection.channel().queue_delete(names.queue(queue))
    connection.close()
    delete_bus(names)


@pytest.fixture
def channel() -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    yield connection.channel()
    connection.close()


def _count(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def test_the_relays_publisher_leaves_a_channel_that_was_nacked(
    names: BusNames, channel: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    channel.exchange_declare(names.exchange, exchange_type="topic", durable=True)
    for queue, arguments in (("refusing", REFUSING), ("taking", {})):
        channel.queue_declare(names.queue(queue), arguments=arguments)
        channel.queue_bind(names.queue(queue), names.exchange, routing_key=f"{queue}.#")
    publisher = RabbitPublisher(AMQP_URL, names)
    try:
        publisher.publish_batch([OutgoingEvent("evt_1", "taking.x", b"{}")])
        first = publisher._connection
        # When the broker nacks a batch
        with pytest.raises(PublishError, match="nack"):
            publisher.publish_batch([OutgoingEvent("evt_2", "refusing.x", b"{}")])
        # Then its channel is gone, and the next batch goes on a new one
        assert publisher._connection is None
        publisher.publish_batch([OutgoingEvent("evt_3", "taking.x", b"{}")])
        assert publisher._connection is not None and publisher._connection is not first
        # And a batch that was taken keeps its channel (no new channel per batch)
        kept = publisher._connection
        publisher.publish_batch([OutgoingEvent("evt_4", "taking.x", b"{}")])
        assert publisher._connection is kept
    finally:
        publisher.close()


def test_a_job_channel_that_was_nacked_is_replaced_before_the_next_job(
    names: BusNames, channel: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    channel.queue_declare(names.queue("refusing"), arguments=REFUSING)
    broker = build_broker(notifier_config("postgresql+psycopg://unused/x"))
    queues = DeliveryQueues(broker, names)
    try:
        queues.enqueue(["d_1", "d_2"])
        used = broker.channel
        broker.connection.process_data_events(0.2)  # the confirms of those jobs come in
        assert broker.channel is used, "a channel whose jobs were taken is kept"
        # When the broker refuses a job sent on this thread's channel (sent without
        # waiting, as every job is)
        used.basic_publish("", names.queue("refusing"), b"job")
        # Then, once the nack has come in, the thread's next job goes on a new channel
        deadline = time.monotonic() + 5
        while broker.channel is used and time.monotonic() < deadline:
            broker.connection.process_data_events(0.05)
        assert broker.channel is not used
        queues.enqueue(["d_3"])
        wait_until(lambda: _count(channel, queues.queue) == 3, 5, "the three jobs queued")
    finally:
        broker.close()
