"""A disabled endpoint is visible and recoverable: skipped deliveries, a notice, metrics.

The notifier API on the real PostgreSQL (the engine stands aside: EnqueueRecorder
records what the API hands it); the engine's side of auto-disabling is in
tests/integration/test_delivery.py::test_an_endpoint_failing_long_enough_is_disabled.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from services.notifier import ops
from services.notifier.app import create_app
from services.notifier.metrics import api_metrics_registry
from services.notifier.models import PENDING, SKIPPED, Delivery, StoredEvent
from shared import events
from shared.db import Database
from shared.event_catalog import WEBHOOK_ENDPOINT_DISABLED
from tests.conftest import TenantKeys, make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    EnqueueRecorder,
    deliver_event,
    enqueued_fixture,
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
    own_database_notifier,
)

pytestmark = pytest.mark.integration


def _patch(client: FlaskClient, tenant: TenantKeys, endpoint_id: str, **body: Any) -> Any:
    response = client.patch(
        f"/v1/webhook-endpoints/{endpoint_id}", json=body, headers=tenant.headers
    )
    assert response.status_code == 200, response.get_json()
    return response.get_json()["webhookEndpoint"]


def _deliveries_to(db: Database, endpoint_id: str) -> list[Delivery]:
    with db.reader() as session:
        rows = list(
            session.scalars(
                sa.select(Delivery).where(Delivery.endpoint_id == endpoint_id).order_by(Delivery.id)
            )
        )
        session.expunge_all()
        return rows


def _disabled_notice(db: Database, tenant_id: str) -> dict[str, Any]:
    """The body of the tenant's one stored webhook.endpoint_disabled event."""
    with db.reader() as session:
        (event,) = session.scalars(
            sa.select(StoredEvent).where(
                StoredEvent.tenant_id == tenant_id,
                StoredEvent.event_type == WEBHOOK_ENDPOINT_DISABLED,
            )
        )
        body: dict[str, Any] = json.loads(event.body)
    return body


def _gauge(db: Database, name: str) -> float:
    for family in api_metrics_registry(db).collect():
        if family.name == name:
            return float(family.samples[0].value)
    raise AssertionError(f"no metric {name}")


def test_events_for_a_disabled_endpoint_are_kept_as_skipped_and_enabling_sends_them(
    notifier_client: FlaskClient,
    tenant: TenantKeys,
    pg_db: Database,
    enqueued: EnqueueRecorder,
) -> None:
    # Given an endpoint its tenant disabled
    endpoint, _ = make_endpoint(notifier_client, tenant)
    _patch(notifier_client, tenant, endpoint["id"], status="disabled")
    # When two events it subscribes to arrive while it is disabled
    for n in range(2):
        deliver_event(pg_db, tenant.tenant_id, data={"n": n})
    # Then each is kept as a skipped delivery (not sent, not lost)
    skipped = _deliveries_to(pg_db, endpoint["id"])
    assert [d.status for d in skipped] == [SKIPPED, SKIPPED]
    assert all(d.last_error == "endpoint_disabled" for d in skipped)
    listed = notifier_client.get(
        f"/v1/webhook-deliveries?endpointId={endpoint['id']}&status=skipped",
        headers=tenant.headers,
    )
    assert listed.status_code == 200 and len(listed.get_json()["webhookDeliveries"]) == 2
    # When the tenant enables the endpoint again
    _patch(notifier_client, tenant, endpoint["id"], status="enabled")
    # Then the skipped deliveries are due now and handed to the workers
    resumed = _deliveries_to(pg_db, endpoint["id"])
    assert [d.status for d in resumed] == [PENDING, PENDING]
    assert sorted(enqueued.ids) == sorted(d.id for d in resumed)


def test_disabling_tells_the_tenants_other_subscribed_endpoints(
    notifier_client: FlaskClient,
    tenant: TenantKeys,
    pg_db: Database,
    enqueued: EnqueueRecorder,
) -> None:
    # Given three endpoints: the ledger, a watcher subscribed to webhook.endpoint_disabled,
    # and one that is not subscribed to it
    ledger, _ = make_endpoint(notifier_client, tenant, name="Ledger")
    watcher, _ = make_endpoint(
        notifier_client, tenant, name="Ops", eventTypes=[WEBHOOK_ENDPOINT_DISABLED]
    )
    other, _ = make_endpoint(notifier_client, tenant, name="Other")
    skipped_before = _gauge(pg_db, "settle_webhook_endpoints_disabled")
    # When the ledger is disabled
    served = _patch(notifier_client, tenant, ledger["id"], status="disabled")
    # Then a webhook.endpoint_disabled event names it as the API serves it, with the reason
    body = _disabled_notice(pg_db, tenant.tenant_id)
    assert body["data"] == {"webhookEndpoint": served, "reason": "manual"}
    # And it is a live tenant's: livemode true
    assert body["livemode"] is True
    # And only the subscribed endpoint gets a delivery of it, handed to the workers
    (notice,) = _deliveries_to(pg_db, watcher["id"])
    assert notice.event_id == body["id"] and notice.status == PENDING
    assert enqueued.ids == [notice.id]
    assert _deliveries_to(pg_db, other["id"]) == []
    assert _deliveries_to(pg_db, ledger["id"]) == []
    # And the metrics show one more disabled endpoint
    assert _gauge(pg_db, "settle_webhook_endpoints_disabled") == skipped_before + 1


def test_disabling_twice_tells_once(
    notifier_client: FlaskClient,
    tenant: TenantKeys,
    pg_db: Database,
    enqueued: EnqueueRecorder,
) -> None:
    ledger, _ = make_endpoint(notifier_client, tenant)
    make_endpoint(notifier_client, tenant, eventTypes=[WEBHOOK_ENDPOINT_DISABLED])
    _patch(notifier_client, tenant, ledger["id"], status="disabled")
    _patch(notifier_client, tenant, ledger["id"], status="disabled")
    assert len(enqueued.ids) == 1
    # A skipped delivery counts in the metrics too
    before = _gauge(pg_db, "settle_webhook_deliveries_skipped")
    deliver_event(pg_db, tenant.tenant_id, events.DEPOSIT_CREDITED)
    assert _gauge(pg_db, "settle_webhook_deliveries_skipped") == before + 1


def test_a_sandbox_tenants_disabled_notice_is_not_livemode(
    notifier_client: FlaskClient, pg_db: Database, enqueued: EnqueueRecorder
) -> None:
    # Given a sandbox tenant with a ledger and a watcher of webhook.endpoint_disabled
    sandbox = make_tenant(pg_db, sandbox=True)
    ledger, _ = make_endpoint(notifier_client, sandbox)
    watcher, _ = make_endpoint(notifier_client, sandbox, eventTypes=[WEBHOOK_ENDPOINT_DISABLED])
    # When the tenant disables the ledger
    _patch(notifier_client, sandbox, ledger["id"], status="disabled")
    # Then the notice is a test, as every event of a sandbox tenant (interface: livemode)
    notice = _disabled_notice(pg_db, sandbox.tenant_id)
    assert notice["livemode"] is False
    (delivery_id,) = enqueued.ids
    # And a replay of it sends that same stored event (same id, same body)
    replayed = notifier_client.post(
        f"/v1/webhook-deliveries/{delivery_id}/replay", headers=sandbox.headers
    )
    assert replayed.status_code == 200, replayed.get_json()
    assert replayed.get_json()["webhookDelivery"]["eventId"] == notice["id"]
    assert _disabled_notice(pg_db, sandbox.tenant_id) == notice
    # And webhook.test stays a test (livemode false, as for every tenant)
    sent = notifier_client.post(
        f"/v1/webhook-endpoints/{watcher['id']}/test", headers=sandbox.headers
    )
    assert sent.status_code == 200, sent.get_json()
    with pg_db.reader() as session:
        test_event = session.get_one(StoredEvent, sent.get_json()["webhookDelivery"]["eventId"])
        assert json.loads(test_event.body)["livemode"] is False


def test_a_notifier_with_its_own_database_reads_the_sandbox_flag_in_identity(
    pg_url: str, pg_db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a notifier whose database is not identity's (production's layout: DESIGN.md),
    # and a sandbox tenant and a live one, each with a ledger and a watcher
    with own_database_notifier(pg_url, pg_db) as context:
        client = create_app(context=context).test_client()
        tenants = {"sandbox": make_tenant(pg_db, sandbox=True), "live": make_tenant(pg_db)}
        for tenant in tenants.values():
            ledger, _ = make_endpoint(client, tenant)
            make_endpoint(client, tenant, eventTypes=[WEBHOOK_ENDPOINT_DISABLED])
            # When ops disable the ledger (`settle endpoints disable`: no request, so the
            # flag is read from identity's table, in identity's database)
            args = argparse.Namespace(tenant=tenant.tenant_id, endpoint_id=ledger["id"])
            assert ops.endpoints_disable(context, args) == 0
        capsys.readouterr()
        # Then the sandbox tenant's notice says livemode false, the live one's true
        livemode = {
            kind: _disabled_notice(context.db, t.tenant_id)["livemode"]
            for kind, t in tenants.items()
        }
        assert livemode == {"sandbox": False, "live": True}
