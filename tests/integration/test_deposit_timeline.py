"""GET /v1/deposits/<id>/timeline: each status a deposit went through, with its time.

The timeline is read from what was recorded, the deposit's own events in the outbox
(the same rows receivers get), never reconstructed from the deposit's current fields:
a late manual credit shows its own day, a status the deposit passed through
(manual_review_required, credit_submitted: their event ids are not derivable from the
deposit id) is there with its event id, and nothing of another deposit or tenant is.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from services.core.context import CoreContext
from services.core.deposits.settings import PipelineSettings
from services.core.models import OutboxEvent
from shared.db import Database
from tests.conftest import TenantKeys, make_tenant
from tests.support.deposits import WALLET, FakeClock, deposit_parts, make_account

pytestmark = pytest.mark.integration

USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
START = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
SETTINGS = PipelineSettings(sandbox_block_s=0.01, batch_size=1000, poll_s=0.0)


def assert_error(response: Any, status: int, code: str) -> None:
    body = response.get_json()
    assert response.status_code == status, body
    assert body["code"] == code and body["error"].startswith(f"{code}: ")


def recorded_events(db: Database, deposit_id: str) -> list[dict[str, Any]]:
    """The envelopes of the deposit's status events, as receivers get them."""
    with db.reader() as session:
        bodies = session.scalars(
            sa.select(OutboxEvent.body)
            .where(OutboxEvent.event_type.like("deposit.%"))
            .where(OutboxEvent.event_type.not_like("deposit.account.%"))
            .order_by(OutboxEvent.id)
        )
        envelopes = [json.loads(body) for body in bodies]
    return [e for e in envelopes if e["data"]["deposit"]["id"] == deposit_id]


@pytest.fixture
def tenant_s(pg_db: Database) -> TenantKeys:
    return make_tenant(pg_db, sandbox=True)


def timeline(client: FlaskClient, headers: dict[str, str], deposit_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/deposits/{deposit_id}/timeline", headers=headers)
    assert response.status_code == 200, response.get_json()
    steps: list[dict[str, Any]] = response.get_json()["timeline"]
    return steps


def test_a_manual_credit_days_later_shows_each_status_at_its_recorded_time(
    client: FlaskClient, pg_db: Database, core_context: CoreContext, tenant_s: TenantKeys
) -> None:
    # Given a deposit seen at 09:30, confirmed 2 minutes later, sent to manual review,
    # and credited by hand three days later (a clock the test moves)
    clock = FakeClock(START)
    parts = deposit_parts(pg_db, core_context.registry, settings=SETTINGS, clock=clock)
    account = make_account(
        pg_db,
        tenant_s.tenant_id,
        core_context.registry,
        dest_chain_id=8453,
        dest_token_address=USDC_BASE,
    )
    deposit = parts.sandbox.create(
        tenant_s.tenant_id,
        chain_id=8453,
        deposit_address=account.address(8453),
        asset="USDC",
        amount=Decimal("300"),
        outcome="manual_review",
    )
    clock.advance(minutes=2)
    assert parts.detection.confirm(deposit.id, 99) is not None
    clock.advance(seconds=7)
    assert parts.settling.settle(deposit.id) == "manual_review_required"
    clock.advance(days=3)
    parts.ops.credit(deposit.id, "0x" + "ab" * 32, by="alice", reason="checked by hand")

    # When the timeline is read
    steps = timeline(client, tenant_s.headers, deposit.id)

    # Then it is each status with the time and id of the event that recorded it
    assert [s["status"] for s in steps] == [
        "source_seen",
        "source_confirmed",
        "manual_review_required",
        "credited",
    ], steps
    assert [s["at"] for s in steps] == [
        "2026-05-04T09:30:00.000Z",
        "2026-05-04T09:32:00.000Z",
        "2026-05-04T09:32:07.000Z",
        "2026-05-07T09:32:07.000Z",
    ]
    events = recorded_events(pg_db, deposit.id)
    assert [(s["eventId"], s["eventType"], s["at"]) for s in steps] == [
        (e["id"], e["type"], e["createdAt"]) for e in events
    ]
    # The review's event id is a fresh one (not evt_dep_<id>_...): only a read finds it
    assert not steps[2]["eventId"].startswith(f"evt_dep_{deposit.id}")
    assert steps[3]["eventId"] == f"evt_dep_{deposit.id}_credited"
    # And the deposit's own last change is the timeline's last time
    read = client.get(f"/v1/deposits/{deposit.id}", headers=tenant_s.headers).get_json()
    assert read["deposit"]["updatedAt"] == steps[-1]["at"]


def test_only_this_deposits_events_even_when_others_mention_its_id(
    client: FlaskClient, pg_db: Database, core_context: CoreContext, tenant_s: TenantKeys
) -> None:
    # Given two deposits of one account, and an account created afterwards whose
    # metadata and external user id carry the first deposit's id (its event's body holds
    # the id as text, as a deposit event's does)
    parts = deposit_parts(pg_db, core_context.registry, settings=SETTINGS)
    account = make_account(
        pg_db,
        tenant_s.tenant_id,
        core_context.registry,
        dest_chain_id=8453,
        dest_token_address=USDC_BASE,
    )
    first, second = (
        parts.sandbox.create(
            tenant_s.tenant_id,
            chain_id=8453,
            deposit_address=account.address(8453),
            asset="USDC",
            amount=Decimal(amount),
        )
        for amount in ("10", "20")
    )
    made = client.post(
        "/v1/deposit-accounts",
        json={
            "externalUserId": f"about {first.id}",
            "metadata": {"id": first.id, "depositId": first.id},
            "destination": {"chainId": 8453, "address": WALLET, "tokenAddress": USDC_BASE},
        },
        headers=tenant_s.headers,
    )
    assert made.status_code == 200, made.get_json()
    # When each timeline is read
    one, two = (timeline(client, tenant_s.headers, d.id) for d in (first, second))
    # Then each is its own deposit's seen event, and nothing else
    assert [(s["status"], s["eventId"]) for s in one] == [
        ("source_seen", f"evt_dep_{first.id}_source_seen")
    ]
    assert [(s["status"], s["eventId"]) for s in two] == [
        ("source_seen", f"evt_dep_{second.id}_source_seen")
    ]


def test_another_tenants_or_no_deposit_is_404_and_scopes_hold(
    client: FlaskClient,
    pg_db: Database,
    core_context: CoreContext,
    tenant_s: TenantKeys,
    other_tenant: TenantKeys,
) -> None:
    parts = deposit_parts(pg_db, core_context.registry, settings=SETTINGS)
    account = make_account(
        pg_db,
        tenant_s.tenant_id,
        core_context.registry,
        dest_chain_id=8453,
        dest_token_address=USDC_BASE,
    )
    deposit = parts.sandbox.create(
        tenant_s.tenant_id,
        chain_id=8453,
        deposit_address=account.address(8453),
        asset="USDC",
        amount=Decimal("10"),
    )
    # Another tenant's deposit answers exactly as one that does not exist
    # (a NUL in the path is a 400 on every route: test_control_characters.py)
    for deposit_id in (deposit.id, "dep_01NOSUCHDEPOSIT0000000000", "a" * 300, "%27"):
        response = client.get(f"/v1/deposits/{deposit_id}/timeline", headers=other_tenant.headers)
        assert_error(response, 404, "not_found")
    # And the route takes deposits:read, like the deposit itself
    path = f"/v1/deposits/{deposit.id}/timeline"
    assert_error(client.get(path), 401, "unauthorized")
    wrong = tenant_s.key_with("deposit_accounts:read", "webhooks:read")
    assert_error(client.get(path, headers=wrong), 403, "insufficient_scope")
    assert client.get(path, headers=tenant_s.key_with("deposits:read")).status_code == 200


def test_the_read_is_an_index_lookup_not_a_scan_of_the_tenants_events(
    pg_db: Database,
) -> None:
    # Given the timeline's statement, When PostgreSQL plans it (sequential scans off, so
    # the tiny test table does not make a scan look cheaper)
    from services.core.deposits.queries import timeline_statement

    statement = timeline_statement("t" * 36, "dep_01NOSUCHDEPOSIT0000000000")
    with pg_db.transaction() as session:
        session.execute(sa.text("SET LOCAL enable_seqscan = off"))
        compiled = statement.compile(
            dialect=session.get_bind().dialect, compile_kwargs={"literal_binds": True}
        )
        plan = "\n".join(session.scalars(sa.text(f"EXPLAIN {compiled}")))
    # Then it reads the deposit's events through the index on their deposit id (each
    # partition's copy of ix_outbox_deposit_id), in the timeline's partitions only
    assert "Seq Scan" not in plan, plan
    assert "Index Cond: (((body)::jsonb #>> '{data,deposit,id}'::text[])" in plan, plan
    assert "outbox_events_" not in plan, plan
