"""Every event about a deposit account carries `sequence`: 1, 2, 3... per account, in
commit order, with no gaps (a rolled-back writer and a refused durable duplicate give
their number back; a second writer waits for the first's commit)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient
from sqlalchemy.exc import IntegrityError

from services.core import outbox
from services.core.models import OutboxEvent
from shared import event_catalog, events
from shared.db import Database
from tests.conftest import TenantKeys
from tests.integration.conftest import (
    WALLET_2,
    WALLET_3,
    create_account,
    destination,
    outbox_events,
)


def _deposit_data(account_id: str, n: int) -> dict[str, Any]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:10]}_{n}", "accountId": account_id}}


def _numbers(db: Database, account_id: str) -> list[int]:
    """The `sequence` of the account's events, in the order the outbox holds them."""
    with db.reader() as session:
        bodies = session.scalars(sa.select(OutboxEvent.body).order_by(OutboxEvent.id))
        found = [json.loads(b) for b in bodies]
    return [e["sequence"] for e in found if events.account_of(e["data"]) == account_id]


def test_an_accounts_events_count_up_from_its_creation_and_others_carry_none(
    client: FlaskClient, policy_tenant: TenantKeys, pg_db: Database
) -> None:
    first = create_account(client, policy_tenant)
    second = create_account(client, policy_tenant)
    for wallet in (WALLET_2, WALLET_3):
        response = client.patch(
            f"/v1/deposit-accounts/{first['externalUserId']}/destination",
            json={"destination": destination(address=wallet)},
            headers=policy_tenant.headers,
        )
        assert response.status_code == 200, response.get_json()
    assert _numbers(pg_db, first["id"]) == [1, 2, 3]
    assert _numbers(pg_db, second["id"]) == [1]
    # The envelope's place for it: after tenantId, before data (and in the catalog).
    created = outbox_events(pg_db, policy_tenant.tenant_id, events.ACCOUNT_CREATED)[0]
    assert list(created) == ["id", "type", "createdAt", "tenantId", "livemode", "sequence", "data"]
    with pg_db.transaction() as session:
        data = event_catalog.get(events.INVENTORY_LOW_BALANCE).example["data"]
        outbox.emit(session, events.INVENTORY_LOW_BALANCE, policy_tenant.tenant_id, data)
    low = outbox_events(pg_db, policy_tenant.tenant_id, events.INVENTORY_LOW_BALANCE)
    assert "sequence" not in low[0]


def _waiting_for_a_lock(db: Database, pid: int) -> bool:
    with db.reader() as session:
        kind = session.scalar(
            sa.text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
            {"pid": pid},
        )
    return bool(kind == "Lock")


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_a_second_writer_waits_for_the_first_and_numbers_in_commit_order(
    pg_db: Database, first_ends: str
) -> None:
    account = f"acc_{uuid.uuid4().hex[:20]}"
    tenant = str(uuid.uuid4())
    with pg_db.transaction() as session:
        outbox.emit(session, events.DEPOSIT_CREDIT_SUBMITTED, tenant, _deposit_data(account, 0))
    got: dict[str, Any] = {}

    def second() -> None:
        with pg_db.transaction() as session:
            got["pid"] = session.scalar(sa.text("SELECT pg_backend_pid()"))
            got["ready"] = True
            got["envelope"] = outbox.emit(
                session, events.DEPOSIT_CREDIT_SUBMITTED, tenant, _deposit_data(account, 2)
            )

    session = pg_db.sessions()
    try:
        taken = outbox.emit(
            session, events.DEPOSIT_CREDIT_SUBMITTED, tenant, _deposit_data(account, 1)
        )
        assert taken["sequence"] == 2
        thread = threading.Thread(target=second)
        thread.start()
        for _ in range(500):  # bounded: 5 s
            if got.get("ready") and _waiting_for_a_lock(pg_db, got["pid"]):
                break
            time.sleep(0.01)
        else:
            pytest.fail("the second writer did not wait for the first's account lock")
        assert "envelope" not in got
        if first_ends == "commit":
            session.commit()
        else:
            session.rollback()
    finally:
        session.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    # After a commit the second comes next; after a rollback it takes the number back.
    assert got["envelope"]["sequence"] == (3 if first_ends == "commit" else 2)
    assert _numbers(pg_db, account) == ([1, 2, 3] if first_ends == "commit" else [1, 2])


def test_a_refused_durable_duplicate_leaves_no_gap(pg_db: Database) -> None:
    account = f"acc_{uuid.uuid4().hex[:20]}"
    tenant = str(uuid.uuid4())
    data = _deposit_data(account, 0)
    durable = events.durable_event_id(data["deposit"]["id"], "credited")
    with pg_db.transaction() as session:
        outbox.emit(session, events.DEPOSIT_CREDITED, tenant, data, event_id=durable)
    with pg_db.transaction() as session:
        # As transitions.emit writes a durable event: in a savepoint.
        with pytest.raises(IntegrityError), session.begin_nested():
            outbox.emit(session, events.DEPOSIT_CREDITED, tenant, data, event_id=durable)
        outbox.emit(session, events.DEPOSIT_CREDIT_SUBMITTED, tenant, _deposit_data(account, 1))
    assert _numbers(pg_db, account) == [1, 2]


def test_a_bulk_write_numbers_each_account_in_order_and_skips_what_was_written(
    pg_db: Database,
) -> None:
    tenant = str(uuid.uuid4())
    one, two = (f"acc_{uuid.uuid4().hex[:20]}" for _ in range(2))

    def seen(account: str, n: int) -> dict[str, Any]:
        data = _deposit_data(account, n)
        event_id = events.durable_event_id(data["deposit"]["id"], "source_seen")
        return events.envelope(events.DEPOSIT_SOURCE_SEEN, tenant, data, event_id=event_id)

    before = seen(one, 0)
    with pg_db.transaction() as session:
        assert outbox.emit_many(session, [before]) == 1
    batch = [seen(two, 1), seen(one, 2), before, seen(one, 3), seen(two, 4)]
    with pg_db.transaction() as session:
        assert outbox.emit_many(session, batch) == 4
    assert _numbers(pg_db, one) == [1, 2, 3]
    assert _numbers(pg_db, two) == [1, 2]
    # The numbers follow the order given.
    with pg_db.reader() as session:
        stored = {
            e.event_id: json.loads(e.body)["sequence"]
            for e in session.scalars(sa.select(OutboxEvent).where(OutboxEvent.tenant_id == tenant))
        }
    assert [stored[e["id"]] for e in batch] == [1, 2, 1, 3, 2]
