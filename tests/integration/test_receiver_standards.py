"""What receivers ask for, end to end: wildcard subscriptions and Standard Webhooks.

Real PostgreSQL, real RabbitMQ (names unique to this module), real HTTP receivers on
127.0.0.1: outbox -> relay -> RabbitMQ -> consumer's fan-out -> worker -> receiver.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from services.notifier.models import SUCCEEDED
from shared import events
from tests.conftest import make_tenant
from tests.support.pipeline import Pipeline, isolated_database, running_pipeline, wait_until
from tests.support.receiver import Receiver
from tests.support.services import require_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with isolated_database("receivers") as url, running_pipeline(url) as running:
        yield running


@pytest.fixture
def rx() -> Iterator[Receiver]:
    with Receiver() as receiver:
        yield receiver


def _data() -> dict[str, object]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:10]}", "amount": "1.00"}}


def test_star_receives_every_type_and_deposit_star_only_deposit_events(
    pipeline: Pipeline, rx: Receiver
) -> None:
    # Given one endpoint subscribed to "*" and one to "deposit.*"
    tenant_id = make_tenant(pipeline.db).tenant_id
    pipeline.endpoint(tenant_id, rx.url("/all"), ["*"])
    pipeline.endpoint(tenant_id, rx.url("/deposits"), ["deposit.*"])
    # When one event of every type in the catalog is emitted
    sent = [pipeline.emit(tenant_id, t, _data()) for t in events.EVENT_TYPES]
    deposit_types = [t for t in events.EVENT_TYPES if t.startswith("deposit.")]
    for envelope in sent:
        count = 2 if envelope["type"] in deposit_types else 1
        pipeline.wait_status(envelope["id"], SUCCEEDED, count=count, timeout=30)
    # Then "*" received every type, and "deposit.*" exactly the deposit ones
    wait_until(lambda: len(rx.hits("/all")) >= len(events.EVENT_TYPES), 10, "all hits")
    everything = sorted(json.loads(h.body)["type"] for h in rx.hits("/all"))
    assert everything == sorted(events.EVENT_TYPES)
    deposits = sorted(json.loads(h.body)["type"] for h in rx.hits("/deposits"))
    assert deposits == sorted(deposit_types)
    assert "deposit.account.created" in deposits and "webhook.test" not in deposits
