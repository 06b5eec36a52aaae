"""Delivery jobs on real RabbitMQ: a batch is published whole, also across a lost connection.

The consumer hands a batch of new deliveries to the workers with one write for all
their jobs (broker.DeliveryQueues.enqueue); these tests read the queue back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from services.notifier.broker import DeliveryQueues, build_broker
from shared.bus import BusNames
from tests.support.pipeline import delete_bus, unique_prefix
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.integration


@pytest.fixture
def queues() -> Iterator[DeliveryQueues]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    names = BusNames(unique_prefix())
    broker = build_broker(SimpleNamespace(amqp_url=AMQP_URL))
    try:
        yield DeliveryQueues(broker, names)
    finally:
        broker.close()
        delete_bus(names)


def _jobs(queues: DeliveryQueues) -> list[tuple[str, dict[str, object]]]:
    """(delivery id, kwargs) of every job waiting on the first-attempt queue, taken off."""
    channel = queues.broker.channel
    jobs: list[tuple[str, dict[str, object]]] = []
    while True:
        method, _props, body = channel.basic_get(queues.queue, auto_ack=True)
        if method is None:
            return jobs

        message = json.loads(body)
        jobs.append((message["args"][0], message["kwargs"]))


def test_a_batch_of_jobs_arrives_whole_and_in_order(queues: DeliveryQueues) -> None:
    # Given 300 new deliveries, some with their route
    ids = [f"dlv_{n:04d}" for n in range(300)]
    routes = {ids[0]: ("we_1", "ten_1"), ids[-1]: ("we_2", "ten_2")}
    # When they are handed to the workers
    queues.enqueue(ids, routes)
    # Then every job is on the queue, once, in order, routes riding along
    jobs = _jobs(queues)
    assert [delivery_id for delivery_id, _ in jobs] == ids
    assert jobs[0][1] == {"route": ["we_1", "ten_1"]}
    assert jobs[1][1] == {}
    assert jobs[-1][1] == {"route": ["we_2", "ten_2"]}


def test_a_batch_is_sent_again_on_a_new_connection_when_the_old_one_is_gone(
    queues: DeliveryQueues,
) -> None:
    # Given a broker whose connection RabbitMQ has dropped since its last job
    queues.enqueue(["dlv_first"])
    assert [d for d, _ in _jobs(queues)] == ["dlv_first"]
    queues.broker.connection.close()
    # When a batch is handed over
    queues.enqueue([f"dlv_{n}" for n in range(50)])
    # Then it arrives whole, on a new connection
    assert [d for d, _ in _jobs(queues)] == [f"dlv_{n}" for n in range(50)]
