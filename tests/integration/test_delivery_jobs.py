"""Delivery jobs on real RabbitMQ: a batch is published whole, also across a lost connection.

The consumer hands a batch of new deliveries to the workers with one write for all
their jobs (broker.DeliveryQueues.enqueue); these tests read the queue back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from services.notifier.broker import GROUP_MAX, GROUP_MIN, DeliveryQueues, build_broker
from shared.bus import BusNames
from tests.support.pipeline import delete_bus, unique_prefix
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.integration

#: How long the job queue stays empty before every job sent is taken to have arrived.
QUIET_S = 0.5


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


def _messages(queues: DeliveryQueues) -> list[dict[str, Any]]:
    """Every job message waiting on the first-attempt queue, taken off.

    Jobs go out without publisher confirms, and a quorum queue takes a message a moment
    after the publish (once its nodes agree): read until the queue stays empty a while.
    """
    channel = queues.broker.channel
    messages: list[dict[str, Any]] = []
    quiet_until = time.monotonic() + QUIET_S
    while time.monotonic() < quiet_until:
        method, _props, body = channel.basic_get(queues.queue, auto_ack=True)
        if method is None:
            time.sleep(0.02)
            continue
        messages.append(json.loads(body))
        quiet_until = time.monotonic() + QUIET_S
    return messages


def _jobs(queues: DeliveryQueues) -> list[tuple[str, dict[str, object]]]:
    """(delivery id, kwargs) of every job waiting on the first-attempt queue, taken off."""
    return [(message["args"][0], message["kwargs"]) for message in _messages(queues)]


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


def test_a_big_fan_out_of_one_event_travels_as_one_job_after_the_small_ones(
    queues: DeliveryQueues,
) -> None:
    """An event to 50 endpoints of one tenant was 50 jobs, and every other tenant's first
    attempt published after them waited behind all 50 (the fairness bench: 15-25 ms
    more at p99 with each such event)."""
    # Given a batch: one event to GROUP_MAX + 10 endpoints, another's 2, one unrouted
    big = [f"dlv_big_{n:04d}" for n in range(GROUP_MAX + 10)]
    small = ["dlv_small_1", "dlv_small_2"]
    routes = {d: (f"we_{n}", "ten_big") for n, d in enumerate(big)}
    routes |= {d: ("we_small", "ten_small") for d in small}
    # When they are handed to the workers, each event's deliveries a group
    queues.enqueue(
        [*big[:5], *small, "dlv_plain", *big[5:]], routes, groups=[big, small, ["dlv_plain"]]
    )
    # Then the small ones go first, one job each, and the big fan-out as two group jobs
    messages = _messages(queues)
    assert [m["actor_name"] for m in messages] == ["deliver"] * 3 + ["deliver_group"] * 2
    assert [m["args"][0] for m in messages[:3]] == [*small, "dlv_plain"]
    assert messages[0]["kwargs"] == {"route": ["we_small", "ten_small"]}
    groups = [m["args"] for m in messages[3:]]
    assert [tenant for tenant, _ in groups] == ["ten_big", "ten_big"]
    assert [item for _, items in groups for item in items] == [[d, routes[d][0]] for d in big]
    assert len(groups[0][1]) == GROUP_MAX


def test_many_events_of_a_tenant_and_small_fan_outs_stay_one_job_each(
    queues: DeliveryQueues,
) -> None:
    """Many events of one tenant stay one job each: spread over every worker thread and
    process, as before (grouped, they ran one process's share at a time)."""
    many = [f"dlv_many_{n}" for n in range(GROUP_MIN * 2)]
    queues.enqueue(many, {d: ("we_1", "ten_1") for d in many}, groups=[[d] for d in many])
    few = [f"dlv_{n}" for n in range(GROUP_MIN - 1)]
    queues.enqueue(few, {d: (f"we_{d}", "ten_1") for d in few}, groups=[few])
    assert [d for d, _ in _jobs(queues)] == [*many, *few]
