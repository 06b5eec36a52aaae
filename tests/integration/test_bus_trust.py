"""Only core speaks on the bus, on the real RabbitMQ.

The services connect as the users of deploy/rabbitmq/definitions.py (what compose
loads), imported with rabbitmqctl under names unique to this run; a forger user gets
every permission on the vhost, as anyone holding some broker credential could. All
three are deleted afterwards. Core's relay stamps its user as the AMQP user_id
(RabbitMQ checks it); the notifier consumer dead-letters any event whose user_id is
not core's user.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pika
import pika.exceptions
import pytest
import sqlalchemy as sa

from services.notifier.models import SUCCEEDED, StoredEvent
from services.notifier.trust import UNTRUSTED
from shared import events
from shared.bus import BusNames, RabbitPublisher
from tests.conftest import make_tenant
from tests.support.pipeline import (
    Pipeline,
    delete_bus,
    isolated_database,
    running_pipeline,
    unique_prefix,
    wait_until,
)
from tests.support.receiver import Receiver
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEFINITIONS = ROOT / "deploy" / "rabbitmq" / "definitions.py"


def _definitions_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settle_rabbitmq_definitions", DEFINITIONS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rabbitmqctl(*args: str) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "--quiet", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _url(user: str, password: str) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:5672/%2F"


@dataclass(frozen=True)
class BusUsers:
    names: BusNames
    core: tuple[str, str]
    notifier: tuple[str, str]
    forger: tuple[str, str]

    @property
    def core_url(self) -> str:
        return _url(*self.core)

    @property
    def notifier_url(self) -> str:
        return _url(*self.notifier)

    @property
    def forger_url(self) -> str:
        return _url(*self.forger)


@pytest.fixture(scope="module")
def users() -> Iterator[BusUsers]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    if shutil.which("rabbitmqctl") is None:
        if os.environ.get("CI"):
            pytest.fail("rabbitmqctl is missing; CI must have it", pytrace=False)
        pytest.skip("rabbitmqctl is not installed")
    tag = uuid.uuid4().hex[:10]
    names = BusNames(unique_prefix())
    made = BusUsers(
        names,
        core=(f"test-core-{tag}", secrets.token_urlsafe(18)),
        notifier=(f"test-notifier-{tag}", secrets.token_urlsafe(18)),
        forger=(f"test-forger-{tag}", secrets.token_urlsafe(18)),
    )
    env = {
        "SETTLE_AMQP_CORE_USER": made.core[0],
        "SETTLE_AMQP_CORE_PASSWORD": made.core[1],
        "SETTLE_AMQP_NOTIFIER_USER": made.notifier[0],
        "SETTLE_AMQP_NOTIFIER_PASSWORD": made.notifier[1],
        "SETTLE_AMQP_PREFIX": names.prefix,
    }
    document = json.dumps(_definitions_module().definitions(env))
    try:
        _import(document)
        _rabbitmqctl("add_user", *made.forger)
        _rabbitmqctl("set_permissions", "-p", "/", made.forger[0], ".*", ".*", ".*")
        for url in (made.core_url, made.notifier_url, made.forger_url):
            wait_until(lambda url=url: _can_connect(url), 30, "the imported users")
        yield made
    finally:
        for user, _password in (made.core, made.notifier, made.forger):
            subprocess.run(["rabbitmqctl", "--quiet", "delete_user", user], capture_output=True)
        delete_bus(names)


def _import(document: str) -> None:
    """rabbitmqctl import_definitions; it runs as the broker's user, so the file is
    made readable to it in /tmp (pytest's temp dirs are private), then removed."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir="/tmp") as file:
        file.write(document)
        file.flush()
        os.chmod(file.name, 0o644)
        _rabbitmqctl("import_definitions", file.name)


def _can_connect(url: str) -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(url)).close()
    except pika.exceptions.AMQPError:
        return False
    return True


@pytest.fixture(scope="module")
def pipeline(users: BusUsers) -> Iterator[Pipeline]:
    """Relay as core's user, consumer and workers as the notifier's, as in compose."""
    with (
        isolated_database("bus_trust") as url,
        running_pipeline(
            url,
            names=users.names,
            amqp_url=users.notifier_url,
            core_amqp_user=users.core[0],
            publisher_factory=lambda names: RabbitPublisher(users.core_url, names),
        ) as running,
    ):
        yield running


@pytest.fixture
def rx() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


def _credited(tenant_id: str) -> dict[str, Any]:
    deposit = {"id": f"dep_{uuid.uuid4().hex[:12]}", "status": "credited", "amount": "1000000"}
    return events.envelope(
        events.DEPOSIT_CREDITED,
        tenant_id,
        {"deposit": deposit},
        event_id=events.durable_event_id(deposit["id"], "credited"),
    )


def _publish_as(url: str, exchange: str, envelope: dict[str, Any], user_id: str | None) -> None:
    """Publish with publisher confirms; raises what the broker answers."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        properties = pika.BasicProperties(
            delivery_mode=2,
            content_type="application/json",
            message_id=envelope["id"],
            user_id=user_id,
        )
        channel.basic_publish(
            exchange, envelope["type"], events.encode(envelope), properties, mandatory=True
        )
    finally:
        if connection.is_open:
            connection.close()


def _dead_letters(names: BusNames) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        queue = connection.channel().queue_declare(names.notifier_dead_queue, passive=True)
        return int(queue.method.message_count)
    finally:
        connection.close()


def _stored(pipeline: Pipeline, event_id: str) -> bool:
    with pipeline.db.reader() as session:
        return (
            session.scalar(sa.select(StoredEvent.id).where(StoredEvent.id == event_id)) is not None
        )


def _untrusted_count(pipeline: Pipeline) -> float:
    value = pipeline.engine.metrics.registry.get_sample_value(
        "settle_notifier_events_total", {"result": UNTRUSTED}
    )
    return value or 0.0


def test_core_events_flow_with_per_service_users(pipeline: Pipeline, rx: Receiver) -> None:
    # Given an endpoint, with the relay connected as core's user and the notifier's
    # consumer and workers as the notifier's user (least privilege both)
    tenant_id = make_tenant(pipeline.db).tenant_id
    pipeline.endpoint(tenant_id, rx.url("/core"), [events.DEPOSIT_CREDITED])
    # When core emits an event, Then it is stored and delivered
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, {"deposit": {"id": "dep_1"}})
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    assert [json.loads(h.body)["id"] for h in rx.hits("/core")] == [envelope["id"]]


def test_a_forged_event_is_refused_and_core_events_still_flow(
    pipeline: Pipeline, users: BusUsers, rx: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a tenant's endpoint subscribed to deposit.credited
    tenant_id = make_tenant(pipeline.db).tenant_id
    pipeline.endpoint(tenant_id, rx.url("/hook"), [events.DEPOSIT_CREDITED])
    dead_before, untrusted_before = _dead_letters(users.names), _untrusted_count(pipeline)

    # When another broker user publishes a well-formed deposit.credited to settle.events,
    # once without a user_id and once with its own (RabbitMQ refuses any other)
    unsigned, own = _credited(tenant_id), _credited(tenant_id)
    _publish_as(users.forger_url, users.names.exchange, unsigned, user_id=None)
    _publish_as(users.forger_url, users.names.exchange, own, user_id=users.forger[0])

    # Then both are dead-lettered with a log line and counted, never stored nor delivered
    wait_until(
        lambda: _dead_letters(users.names) >= dead_before + 2, 15, "the forged events dead-lettered"
    )
    assert _untrusted_count(pipeline) == untrusted_before + 2
    refused = [r.getMessage() for r in caplog.records if "not published by core" in r.getMessage()]
    assert any(unsigned["id"] in m for m in refused) and any(own["id"] in m for m in refused)
    # And core's next event still flows (the consumer went on)
    envelope = pipeline.emit(tenant_id, events.DEPOSIT_CREDITED, {"deposit": {"id": "dep_real"}})
    pipeline.wait_status(envelope["id"], SUCCEEDED)
    assert not _stored(pipeline, unsigned["id"]) and not _stored(pipeline, own["id"])
    assert pipeline.deliveries(unsigned["id"]) == [] and pipeline.deliveries(own["id"]) == []
    assert [json.loads(h.body)["id"] for h in rx.hits("/hook")] == [envelope["id"]]


def test_rabbitmq_refuses_a_message_claiming_to_be_core(
    pipeline: Pipeline, users: BusUsers
) -> None:
    # Given a forger who stamps core's user name as the user_id
    forged = _credited(make_tenant(pipeline.db).tenant_id)
    # When it publishes, Then the broker closes its channel (406) and nothing is stored
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        _publish_as(users.forger_url, users.names.exchange, forged, user_id=users.core[0])
    assert closed.value.reply_code == 406
    assert not _stored(pipeline, forged["id"])


def test_each_service_user_can_do_only_its_part(users: BusUsers, pipeline: Pipeline) -> None:
    names = users.names
    forged = _credited(str(uuid.uuid4()))
    # The notifier's user cannot publish to settle.events (403 ACCESS_REFUSED)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        _publish_as(users.notifier_url, names.exchange, forged, user_id=users.notifier[0])
    assert refused.value.reply_code == 403
    # Core's user cannot read the notifier's queue, nor publish around the exchange
    connection = pika.BlockingConnection(pika.URLParameters(users.core_url))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().basic_get(names.notifier_queue)
        assert refused.value.reply_code == 403
    finally:
        connection.close()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        _publish_as(users.core_url, "", {**forged, "type": names.notifier_queue}, users.core[0])
    assert refused.value.reply_code == 403
    # And guest is not among the users compose's definitions make
    made = _definitions_module().definitions(
        {"SETTLE_AMQP_CORE_PASSWORD": "a", "SETTLE_AMQP_NOTIFIER_PASSWORD": "b"}
    )
    assert [u["name"] for u in made["users"]] == ["settle-core", "settle-notifier"]
    assert all(u["tags"] == [] for u in made["users"])
