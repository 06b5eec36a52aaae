"""SETTLE_AMQP_URL with several nodes: when the node a process uses dies, its relay,
consumer and workers go on through another node, and nothing is lost on the way.

A node here is a TCP forwarder to the real RabbitMQ that can be killed (tests/support/
tcp_node.py): killing it cuts every connection through it and refuses new ones, as a
stopped node does. The three-node cluster itself is in the soak chaos test."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from services import doctor
from shared import events
from shared.bus import RabbitPublisher
from tests.conftest import make_tenant
from tests.support.pipeline import isolated_database, notifier_config, running_pipeline, wait_until
from tests.support.receiver import Receiver
from tests.support.services import require_rabbitmq
from tests.support.tcp_node import TcpNode

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    require_rabbitmq()
    with isolated_database("broker_nodes") as url:
        yield url


def _cluster_url(node: TcpNode) -> str:
    # The doomed node first, so every process starts on it
    return f"amqp://guest:guest@127.0.0.1:{node.port}/%2F,127.0.0.1:5672"


def test_relay_consumer_and_workers_move_to_a_live_node_when_theirs_dies(
    engine_url: str,
) -> None:
    with TcpNode(5672) as node, Receiver() as rx:
        url = _cluster_url(node)
        with running_pipeline(
            engine_url, amqp_url=url, publisher_factory=lambda n: RabbitPublisher(url, n)
        ) as pipeline:
            tenant_id = make_tenant(pipeline.db).tenant_id
            pipeline.endpoint(tenant_id, rx.url("/hook"), [events.DEPOSIT_CREDITED])
            before = [
                pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())["id"]
                for _ in range(5)
            ]
            for event_id in before:
                pipeline.wait_status(event_id, "succeeded")
            # Every process went through the first node
            assert node.connections >= 3
            # When that node dies
            node.kill()
            after = [
                pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, _deposit())["id"]
                for _ in range(5)
            ]
            # Then every event is still delivered, through the other node
            for event_id in after:
                pipeline.wait_status(event_id, "succeeded", timeout=30)
            received = wait_until(
                lambda: ids if set(ids := _received_ids(rx)) >= {*before, *after} else None,
                10,
                "every event at the receiver",
            )
            # Repeats, if any, are the same event id (at least once), none is lost
            assert set(received) == {*before, *after}


def test_doctor_names_a_node_that_does_not_answer(tmp_path: object) -> None:
    require_rabbitmq()
    node = TcpNode(5672)
    url = _cluster_url(node)
    node.kill()
    settings = doctor.Settings(
        core=_core(url, tmp_path),
        notifier=notifier_config("postgresql+psycopg://unused/x", amqp_url=url),
        env={},
    )
    broker = doctor.check_broker(settings)
    assert broker.status == doctor.FAIL
    assert f"127.0.0.1:{node.port} refuses guest" in broker.detail
    assert "5672 refuses" not in broker.detail.replace(f"{node.port} refuses", "")


def _received_ids(rx: Receiver) -> list[str]:
    return [json.loads(hit.body)["id"] for hit in rx.hits("/hook")]


def _deposit() -> dict[str, object]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:10]}", "amount": "1.00"}}


def _core(url: str, tmp_path: object) -> object:
    from dataclasses import replace

    from services.core.config import CoreConfig
    from tests.support import keys

    env = {
        "SETTLE_ENV": "dev",
        "SETTLE_DATABASE_URL": "postgresql+psycopg://unused/x",
        "SETTLE_DATA_DIR": str(tmp_path),
        "SETTLE_DEPOSIT_XPUB": keys.test_xpub(),
    }
    return replace(CoreConfig.from_env(env), amqp_url=url)
