"""Settle's queues on the real RabbitMQ: quorum queues, poison messages dead-lettered after
the delivery limit (counted in metrics and named by `settle doctor`), and an older
deployment's classic queues replaced by `settle notifier upgrade-queues` without losing
an event or a dead letter."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pika
import pika.exceptions
import pytest

from services import doctor
from services.notifier import queue_admin
from services.notifier.broker import DeliveryQueues, build_broker
from services.notifier.consumer import declare_topology
from services.notifier.metrics import DeadLetterCollector
from shared import events, topology
from shared.bus import BusNames
from tests.support import keys
from tests.support.pipeline import delete_bus, notifier_config, unique_prefix, wait_until
from tests.support.services import AMQP_URL, require_rabbitmq

pytestmark = pytest.mark.integration


@pytest.fixture
def names() -> Iterator[BusNames]:
    require_rabbitmq()
    names = BusNames(unique_prefix())
    yield names
    delete_bus(names)


@pytest.fixture
def channel() -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.confirm_delivery()  # a quorum queue has a message once it is confirmed
    yield channel
    if connection.is_open:
        connection.close()


def _hand_out_unacked(queue: str) -> bool:
    """One consumer that takes a message and dies before its ack (the connection drops)."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        method, _props, _body = connection.channel().basic_get(queue, auto_ack=False)
        return method is not None
    finally:
        connection.close()


def _count(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def _dead_letter_gauge(names: BusNames) -> dict[str, float]:
    (family,) = DeadLetterCollector(AMQP_URL, names).collect()
    return {sample.labels["queue"]: sample.value for sample in family.samples}


def test_every_queue_is_a_quorum_queue_as_the_processes_declare_it(names: BusNames) -> None:
    # Given the consumer's topology and the job queues as a worker and a sender declare them
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    declare_topology(connection.channel(), names)
    broker = build_broker(notifier_config("postgresql+psycopg://unused/x"))
    queues = DeliveryQueues(broker, names)
    queues.enqueue(["d_first"])
    queues.schedule("d_retry", 60.0)
    for queue in (queues.queue, queues.retry_queue):  # a worker declares .XQ when consuming
        broker.declare_queue(queue, ensure=True)
    broker.close()
    # Then each one is there, with the topology's arguments: a quorum queue (a classic
    # queue of the same name refuses that declaration, 406), and nothing else is
    states = queue_admin.survey(connection, names.prefix)
    connection.close()
    assert [(s.name, s.current) for s in states if s.messages is None] == []
    assert [s.name for s in states if not s.current] == []
    # First attempts and retries stay apart: a retry backlog never holds up a first attempt
    by_name = {s.name: s.messages for s in states}
    assert by_name[names.queue("webhooks")] == 1
    assert by_name[names.queue("webhooks.retry.DQ")] == 1
    assert by_name[names.queue("webhooks.retry")] == 0


def test_a_poison_event_is_dead_lettered_after_the_delivery_limit_and_counted(
    names: BusNames, channel: pika.adapters.blocking_connection.BlockingChannel, tmp_path: Path
) -> None:
    declare_topology(channel, names)
    channel.basic_publish(names.exchange, "deposit.credited", b'{"poison": true}')
    # When consumers die on it, one after another
    handed = 0
    while _hand_out_unacked(names.notifier_queue) and handed < 100:
        handed += 1
    # Then after the delivery limit it leaves the queue for the dead-letter queue
    assert handed == topology.EVENT_DELIVERY_LIMIT + 1
    assert _count(channel, names.notifier_queue) == 0
    method, props, body = channel.basic_get(names.notifier_dead_queue, auto_ack=False)
    assert body == b'{"poison": true}'
    assert props.headers["x-first-death-reason"] == "delivery_limit"
    channel.basic_nack(method.delivery_tag, requeue=True)
    # And it is counted where operators look: the metric and settle doctor
    assert _dead_letter_gauge(names)["settle.notifier.events.dead"] == 1
    queue_admin.declare_all(channel, names.prefix)
    settings = doctor.Settings(
        core=_core(tmp_path),
        notifier=notifier_config("postgresql+psycopg://unused/x", core_amqp_user="settle-core"),
        env={"SETTLE_AMQP_PREFIX": names.prefix},
    )
    broker = doctor.check_broker(settings)
    assert broker.status == doctor.OK, broker
    assert f"dead letters waiting: {names.notifier_dead_queue} 1" in broker.detail


def test_a_poison_job_is_dead_lettered_to_its_xq(
    names: BusNames, channel: pika.adapters.blocking_connection.BlockingChannel
) -> None:
    broker = build_broker(notifier_config("postgresql+psycopg://unused/x"))
    queues = DeliveryQueues(broker, names)
    broker.declare_queue(queues.queue, ensure=True)
    queues.enqueue(["d_poison"])
    broker.close()
    handed = 0
    while _hand_out_unacked(queues.queue) and handed < 100:
        handed += 1
    assert handed == topology.JOB_DELIVERY_LIMIT + 1
    method, _props, body = channel.basic_get(queues.queue + ".XQ", auto_ack=True)
    assert method is not None
    assert dramatiq.Message.decode(body).args == ("d_poison",)
    channel.basic_publish("", queues.queue + ".XQ", body)
    assert _dead_letter_gauge(names)["webhooks.XQ"] == 1


def _declare_classic(channel: pika.adapters.blocking_connection.BlockingChannel, p: str) -> None:
    """The topology as Settle declared it before quorum queues (and Dramatiq's defaults)."""
    channel.exchange_declare(p + "settle.events", exchange_type="topic", durable=True)
    channel.exchange_declare(p + "settle.events.dlx", exchange_type="fanout", durable=True)
    channel.queue_declare(p + "settle.notifier.events.dead", durable=True)
    channel.queue_bind(p + "settle.notifier.events.dead", p + "settle.events.dlx")
    channel.queue_declare(
        p + "settle.notifier.events",
        durable=True,
        arguments={"x-dead-letter-exchange": p + "settle.events.dlx"},
    )
    channel.queue_bind(p + "settle.notifier.events", p + "settle.events", routing_key="#")
    for job in ("webhooks", "webhooks.retry"):
        name = p + job
        dead = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name + ".XQ"}
        channel.queue_declare(name, durable=True, arguments=dead)
        channel.queue_declare(name + ".DQ", durable=True, arguments=dead)
        channel.queue_declare(
            name + ".XQ", durable=True, arguments={"x-message-ttl": topology.DEAD_JOB_TTL_MS}
        )


def test_upgrade_replaces_classic_queues_keeping_events_and_dead_letters(
    names: BusNames, channel: pika.adapters.blocking_connection.BlockingChannel, tmp_path: Path
) -> None:
    # Given an older deployment: classic queues, an event not consumed yet, two dead
    # letters (one with the AMQP user_id of its publisher), jobs waiting
    p = names.prefix
    _declare_classic(channel, p)
    channel.basic_publish(p + "settle.events", "deposit.credited", b"event-1")
    dead = p + "settle.notifier.events.dead"
    channel.basic_publish("", dead, b"dead-1", pika.BasicProperties(user_id="guest"))
    channel.basic_publish("", dead, b"dead-2", pika.BasicProperties(message_id="m2"))
    for job in (b"job-1", b"job-2"):
        channel.basic_publish("", p + "webhooks", job)
    connection = channel.connection
    # Then the processes' declaration is refused, and doctor names the queues and the cure
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        declare_topology(connection.channel(), names)
    assert refused.value.reply_code == 406
    settings = doctor.Settings(
        core=_core(tmp_path),
        notifier=notifier_config("postgresql+psycopg://unused/x", core_amqp_user="settle-core"),
        env={"SETTLE_AMQP_PREFIX": p},
    )
    broker = doctor.check_broker(settings)
    assert broker.status == doctor.FAIL and "settle notifier upgrade-queues" in broker.detail
    assert names.notifier_queue in broker.detail
    # When the upgrade runs while the events queue holds an event: refused, nothing changed
    with pytest.raises(queue_admin.UpgradeRefused, match="holds 1 events"):
        queue_admin.upgrade(connection, p)
    assert all(not s.current for s in queue_admin.survey(connection, p) if s.messages)
    channel = connection.channel()
    assert _count(channel, names.notifier_queue) == 1
    # And once the consumer drained it, the upgrade replaces every queue
    _method, _props, body = channel.basic_get(names.notifier_queue, auto_ack=True)
    assert body == b"event-1"
    said: list[str] = []
    replaced = queue_admin.upgrade(connection, p, say=said.append)
    assert len(replaced) == 8, said
    states = queue_admin.survey(connection, p)
    assert [s.name for s in states if not s.current or s.messages is None] == []
    # The dead letters are kept (their user_id in a header), the jobs dropped (the sweeper
    # sends their deliveries again), and no holding queue is left behind
    channel = connection.channel()
    kept = [channel.basic_get(dead, auto_ack=True) for _ in range(2)]
    assert [body for _m, _p, body in kept] == [b"dead-1", b"dead-2"]
    assert kept[0][1].headers[queue_admin.USER_ID_HEADER] == "guest"
    assert kept[0][1].user_id is None
    assert kept[1][1].message_id == "m2"
    assert _count(channel, p + "webhooks") == 0
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        connection.channel().queue_declare(dead + queue_admin.UPGRADING, passive=True)
    # And the processes declare their topology again; an event reaches the new queue
    declare_topology(connection.channel(), names)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(p + "settle.events", "deposit.credited", b"event-2")
    assert channel.basic_get(names.notifier_queue, auto_ack=True)[2] == b"event-2"
    assert doctor.check_broker(settings).status == doctor.OK
    # A second run finds nothing to do
    assert queue_admin.upgrade(connection, p) == []


def _core(tmp_path: Path) -> object:
    from dataclasses import replace

    from services.core.config import CoreConfig

    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": "postgresql+psycopg://unused/x",
        "SETTLE_DATA_DIR": str(tmp_path),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
    }
    return replace(CoreConfig.from_env(env), amqp_url=AMQP_URL)


def test_a_database_outage_does_not_count_toward_the_delivery_limit(names: BusNames) -> None:
    """The consumer keeps a batch in hand while the database is down, trying again with
    backoff, instead of returning it each time: a long failover would otherwise hand a
    good event out EVENT_DELIVERY_LIMIT times and dead-letter it as poison."""
    import threading

    from services.notifier.delivery_engine import EngineSettings, build_engine
    from tests.support.processes import free_port

    closed = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    engine = build_engine(notifier_config(closed), EngineSettings(names=names, prefetch=8))
    consumer = engine.consumer()
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), kwargs={"ready": ready})
    thread.start()
    try:
        assert ready.wait(15)
        publish = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        channel = publish.channel()
        channel.confirm_delivery()
        body = json.dumps(
            events.envelope(events.DEPOSIT_CREDITED, "ten_1", {"deposit": {"id": "dep_1"}})
        ).encode()
        # As core's relay sends it: its user (trusted) stamped as user_id
        props = pika.BasicProperties(user_id="guest", delivery_mode=2)
        channel.basic_publish(names.exchange, events.DEPOSIT_CREDITED, body, props)
        # While the database stays down through several tries (0.2 + 0.4 + 0.8 + 1.6 s)
        time.sleep(3.5)
    finally:
        stop.set()
        thread.join(20)
        engine.broker.close()
    # Then the message went back when the consumer stopped (its requeue, and the consumer's
    # prefetch at the close), not once per try
    method, props, _body = channel.basic_get(names.notifier_queue, auto_ack=True)
    publish.close()
    assert method is not None
    assert (props.headers or {}).get("x-delivery-count", 0) <= 2


def test_the_consumer_names_the_cure_when_an_older_deployments_queues_refuse_it(
    names: BusNames,
    channel: pika.adapters.blocking_connection.BlockingChannel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import threading

    from services.notifier.delivery_engine import EngineSettings, build_engine

    _declare_classic(channel, names.prefix)
    engine = build_engine(
        notifier_config("postgresql+psycopg://unused/x"), EngineSettings(names=names)
    )
    stop = threading.Event()
    thread = threading.Thread(target=engine.consumer().run, args=(stop,))
    with caplog.at_level("ERROR", logger="services.notifier.consumer"):
        thread.start()
        try:
            assert wait_until(
                lambda: "settle notifier upgrade-queues" in caplog.text, 15, "the hint"
            )
        finally:
            stop.set()
            thread.join(20)
            engine.broker.close()
