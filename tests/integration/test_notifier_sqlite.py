"""The notifier API on SQLite, as `settle dev` runs it: the same flows as on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from services.notifier import deliveries
from services.notifier.app import create_app
from services.notifier.context import NotifierContext
from services.notifier.models import FAILED
from shared import components, events, migrate
from shared.db import Database
from shared.timefmt import iso_ms, utcnow
from tests.conftest import make_tenant
from tests.integration.notifier_fixtures import (
    EnqueueRecorder,
    deliver_event,
    make_endpoint,
    notifier_config,
    update_delivery,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sqlite_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('notifier-sqlite')) / 'settle.db'}"
    for component in (components.IDENTITY, components.NOTIFIER):
        migrate.upgrade(component, url)
    db = Database(url)
    yield db
    db.dispose()


def test_the_api_flows_work_on_sqlite(sqlite_db: Database) -> None:
    # Given the notifier on one SQLite file (dev: http loopback admitted)
    context = NotifierContext.build(
        notifier_config(sqlite_db.url, allow_private=True), db=sqlite_db, identity_db=sqlite_db
    )
    recorder = EnqueueRecorder()
    context.enqueue = recorder
    client = create_app(context=context).test_client()
    tenant = make_tenant(sqlite_db)
    endpoint, _ = make_endpoint(client, tenant, url="http://127.0.0.1:9/hook")

    # When an event is stored twice, Then it is stored once and fans out once
    envelope = events.envelope(events.DEPOSIT_CREDITED, tenant.tenant_id, {"n": 1})
    with sqlite_db.transaction() as session:
        assert deliveries.store_event(session, events.encode(envelope)) is not None
    with sqlite_db.transaction() as session:
        assert deliveries.store_event(session, events.encode(envelope)) is None
    _, (delivery,) = deliver_event(sqlite_db, tenant.tenant_id)

    # And test, replay, recover, rotate and the filtered log all answer
    test = client.post(f"/v1/webhook-endpoints/{endpoint['id']}/test", headers=tenant.headers)
    assert test.status_code == 200
    update_delivery(sqlite_db, delivery.id, status=FAILED, next_attempt_at=None)
    replay = client.post(f"/v1/webhook-deliveries/{delivery.id}/replay", headers=tenant.headers)
    assert replay.get_json()["webhookDelivery"]["replayOf"] == delivery.id
    update_delivery(
        sqlite_db, replay.get_json()["webhookDelivery"]["id"], status=FAILED, next_attempt_at=None
    )
    since = iso_ms(utcnow() - timedelta(hours=1))
    recovered = client.post(
        f"/v1/webhook-endpoints/{endpoint['id']}/recover",
        json={"since": since},
        headers=tenant.headers,
    )
    assert [d["eventId"] for d in recovered.get_json()["webhookDeliveries"]] == [delivery.event_id]
    rotated = client.post(
        f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret",
        json={"previousSecretExpiresInSeconds": 60},
        headers=tenant.headers,
    )
    assert rotated.get_json()["webhookEndpoint"]["previousSecretExpiresAt"] is not None
    failed = client.get("/v1/webhook-deliveries?status=failed", headers=tenant.headers)
    assert len(failed.get_json()["webhookDeliveries"]) == 2
    assert len(recorder.ids) == 3
    assert (
        client.delete(f"/v1/webhook-endpoints/{endpoint['id']}", headers=tenant.headers).status_code
        == 204
    )
