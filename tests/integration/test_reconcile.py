"""`settle reconcile` on real PostgreSQL: each discrepancy made on purpose, found alone.

Rows are written directly, as core and the notifier would leave them: outbox rows
through `outbox.emit`, stored events and deliveries through the notifier's own
functions. Every test has its own tenant and reconciles only that tenant over the
last minute, so tests sharing the database never see each other's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from services import reconcile as rc
from services.core import outbox
from services.core.deposits import states
from services.core.deposits.models import Deposit
from services.core.models import DepositAccount, OutboxEvent
from services.notifier import deliveries, fanout, webhook_endpoints
from services.notifier.consumer import store_events
from services.notifier.models import DISABLED, RETRYING, SUCCEEDED, Delivery, Endpoint
from services.notifier.secrets import SecretBox
from shared import components, events, migrate
from shared.db import Database
from shared.ids import new_id
from shared.timefmt import iso_ms, utcnow
from tests.conftest import make_tenant
from tests.support.services import create_database, drop_database

pytestmark = pytest.mark.integration

BOX = SecretBox("reconcile-test-secret-key")
#: Admitted by the production URL policy; nothing is ever sent to it here.
URL = "https://hooks.example.com/settle"
ALL_TYPES = list(events.EVENT_TYPES)
WALLET = "0x1111111111111111111111111111111111111111"
TOKEN = "0x5FbDB2315678afecb367f032d93F642f64180aa3"


# -- writing rows as the services would -----------------------------------------------


def emit(
    db: Database,
    tenant_id: str,
    event_type: str = events.ACCOUNT_CREATED,
    data: dict[str, Any] | None = None,
    *,
    event_id: str | None = None,
) -> str:
    """An outbox row, unpublished; returns its event id."""
    with db.transaction() as session:
        envelope = outbox.emit(session, event_type, tenant_id, data or {"n": 1}, event_id=event_id)
    return str(envelope["id"])


def publish(db: Database, event_id: str) -> bytes:
    """Mark the row published as the relay does; returns its body."""
    with db.transaction() as session:
        row = session.scalars(sa.select(OutboxEvent).where(OutboxEvent.event_id == event_id)).one()
        row.published_at = utcnow()
        return row.body.encode("utf-8")


def consume(db: Database, body: bytes, *, fan_out: bool = True) -> list[str]:
    """Store the event and fan it out as the notifier consumer does; returns delivery ids."""
    if not fan_out:
        with db.transaction() as session:
            assert deliveries.store_event(session, body) is not None
        return []
    (handled,) = store_events(db, [body])
    assert handled.malformed is None
    return handled.delivery_ids


def pass_through(db: Database, event_id: str) -> list[str]:
    """Published, stored, fanned out: the path of DESIGN.md "No event is lost"."""
    return consume(db, publish(db, event_id))


def add_endpoint(
    db: Database,
    tenant_id: str,
    types: Sequence[str] = ALL_TYPES,
    *,
    created_at: datetime | None = None,
) -> str:
    with db.transaction() as session:
        endpoint, _ = webhook_endpoints.create_endpoint(
            session,
            BOX,
            tenant_id,
            name="reconcile",
            url=URL,
            event_types=types,
            allow_private=False,
            max_endpoints=20,
            now=created_at or utcnow() - timedelta(seconds=5),
        )
        return endpoint.id


def set_deliveries(db: Database, ids: Sequence[str], status: str) -> None:
    with db.transaction() as session:
        session.execute(sa.update(Delivery).where(Delivery.id.in_(ids)).values(status=status))


def event_created_at(db: Database, event_id: str) -> datetime:
    with db.reader() as session:
        created: datetime = session.scalars(
            sa.select(OutboxEvent.created_at).where(OutboxEvent.event_id == event_id)
        ).one()
    return created


def make_deposit(db: Database, tenant_id: str, status: str) -> str:
    """A deposit row (and its account) in `status`, with no events yet."""
    now = utcnow()
    with db.transaction() as session:
        account = DepositAccount(
            id=new_id("acc"),
            tenant_id=tenant_id,
            external_user_id=f"user-{uuid.uuid4().hex[:10]}",
            status="active",
            dest_chain_id=8453,
            dest_address=WALLET,
            dest_token_address=TOKEN,
            metadata_={},
            created_at=now,
            updated_at=now,
        )
        session.add(account)
        session.flush()
        deposit = Deposit(
            id=new_id("dep"),
            tenant_id=tenant_id,
            account_pk=account.pk,
            account_id=account.id,
            external_user_id=account.external_user_id,
            status=status,
            chain_id=8453,
            deposit_address=WALLET,
            asset="USDC",
            token_address=TOKEN,
            decimals=6,
            amount_raw="125500000",
            source_tx_hash="0x" + secrets.token_hex(32),
            log_index=0,
            confirmations=0,
            required_confirmations=3,
            dest_chain_id=8453,
            dest_address=WALLET,
            dest_token_address=TOKEN,
            settle_attempts=0,
            failed_providers=[],
            created_at=now,
            updated_at=now,
        )
        session.add(deposit)
        return deposit.id


def deposit_events(db: Database, tenant_id: str, deposit_id: str, path: Sequence[str]) -> None:
    """The lifecycle events of `path`, in order, each through to the notifier."""
    for status in path:
        event_id = emit(
            db,
            tenant_id,
            states.EVENT_TYPES[status],
            {"deposit": {"id": deposit_id, "status": status}},
            event_id=states.event_id(deposit_id, status),
        )
        pass_through(db, event_id)


def run(db: Database, tenant_id: str, **kwargs: Any) -> rc.Report:
    """Reconcile the tenant's last minute as if a second later (settle 0 unless told).

    Rows are stamped in whole milliseconds: looking a second ahead keeps "older than
    settle_s" true for rows made just before, however fast the test ran.
    """
    now = utcnow() + timedelta(seconds=1)
    kwargs.setdefault("now", now)
    return rc.reconcile(db, db, now - timedelta(minutes=1), now, tenant_ids=[tenant_id], **kwargs)


def found(report: rc.Report) -> list[tuple[str, str]]:
    return [(d.kind, d.subject) for d in report.discrepancies()]


# -- the clean case -------------------------------------------------------------------


def test_a_window_where_everything_arrived_is_clean(pg_db: Database) -> None:
    # Given a subscribed endpoint and events that went all the way, delivered
    tenant = make_tenant(pg_db).tenant_id
    endpoint_id = add_endpoint(pg_db, tenant)
    made = []
    for _ in range(3):
        made += pass_through(pg_db, emit(pg_db, tenant))
    # and a deposit whose lifecycle went seen -> manual review -> credited
    deposit_id = make_deposit(pg_db, tenant, states.CREDITED)
    deposit_events(
        pg_db,
        tenant,
        deposit_id,
        [states.SOURCE_SEEN, states.MANUAL_REVIEW_REQUIRED, states.CREDITED],
    )
    with pg_db.transaction() as session:
        made += [
            d.id for d in session.scalars(sa.select(Delivery).where(Delivery.tenant_id == tenant))
        ]
    set_deliveries(pg_db, made, SUCCEEDED)
    # and a replay of one delivery, a test send and an endpoint made after it all
    with pg_db.transaction() as session:
        deliveries.replay(session, tenant, made[0])
        deliveries.send_test(session, tenant, endpoint_id)
    add_endpoint(pg_db, tenant, created_at=utcnow() + timedelta(seconds=1))

    # When the tenant's window is reconciled, requiring delivery
    report = run(pg_db, tenant, require_delivered=True)

    # Then nothing is wrong, and the figures count what was checked
    assert found(report) == []
    assert report.clean
    counts = report.counts
    assert (counts.events, counts.published, counts.stored, counts.lagging) == (6, 6, 6, 0)
    assert counts.stored_checked == 6  # the test send is the notifier's own
    assert counts.deliveries[SUCCEEDED] == 6
    assert counts.deliveries["pending"] == 1  # the replay, just made
    assert counts.endpoints_checked == 2
    assert counts.pairs_checked == 6
    assert counts.deposits_checked == 1
    assert counts.undelivered == {}


# -- one discrepancy at a time --------------------------------------------------------


def test_an_unpublished_event_is_in_flight_until_its_settle_time(pg_db: Database) -> None:
    # Given an event the relay never published
    tenant = make_tenant(pg_db).tenant_id
    event_id = emit(pg_db, tenant)

    # When reconciled with a settle time it is still within, it is only in flight
    patient = run(pg_db, tenant, settle_s=3600)
    assert patient.clean
    assert patient.counts.lagging == 1

    # When reconciled with no settle time, it is the one discrepancy
    report = run(pg_db, tenant)
    assert found(report) == [(rc.NOT_PUBLISHED, event_id)]


def test_a_published_event_the_notifier_never_stored(pg_db: Database) -> None:
    # Given an event published but never stored
    tenant = make_tenant(pg_db).tenant_id
    add_endpoint(pg_db, tenant)
    event_id = emit(pg_db, tenant)
    publish(pg_db, event_id)

    # When reconciled
    report = run(pg_db, tenant)

    # Then it is not_stored, and nothing else (no delivery is expected of a missing event)
    assert found(report) == [(rc.NOT_STORED, event_id)]
    assert report.counts.published == 1
    assert report.counts.stored == 0


def test_a_stored_body_that_is_not_byte_for_byte_the_outbox_body(pg_db: Database) -> None:
    # Given an event stored with the same content but other bytes (spaces after colons)
    tenant = make_tenant(pg_db).tenant_id
    event_id = emit(pg_db, tenant)
    body = publish(pg_db, event_id)
    consume(pg_db, json.dumps(json.loads(body)).encode("utf-8"))

    # When reconciled, Then the body differs, and only that
    assert found(run(pg_db, tenant)) == [(rc.BODY_MISMATCH, event_id)]


def test_a_stored_event_core_never_wrote(pg_db: Database) -> None:
    # Given an event in the notifier that is not in core's outbox
    tenant = make_tenant(pg_db).tenant_id
    envelope = events.envelope(events.ACCOUNT_CREATED, tenant, {"n": 1})
    consume(pg_db, events.encode(envelope))

    # When reconciled, Then it is unknown_stored
    report = run(pg_db, tenant)
    assert found(report) == [(rc.UNKNOWN_STORED, envelope["id"])]
    assert report.counts.events == 0


def test_a_subscribed_endpoint_without_a_delivery(pg_db: Database) -> None:
    # Given endpoints as they stood before an event: one subscribed (A), one subscribed
    # but changed since (B), one subscribed to other types (C), one disabled (D)
    tenant = make_tenant(pg_db).tenant_id
    a = add_endpoint(pg_db, tenant)
    b = add_endpoint(pg_db, tenant)
    add_endpoint(pg_db, tenant, [events.DEPOSIT_CREDITED])
    d = add_endpoint(pg_db, tenant)
    with pg_db.transaction() as session:
        webhook_endpoints.set_status(session.get_one(Endpoint, d), DISABLED)
    # and an event stored without any fan-out, and one endpoint (E) made after it
    event_id = emit(pg_db, tenant)
    consume(pg_db, publish(pg_db, event_id), fan_out=False)
    created = event_created_at(pg_db, event_id)
    with pg_db.transaction() as session:
        session.get_one(Endpoint, b).updated_at = created + timedelta(milliseconds=1)
    add_endpoint(pg_db, tenant, created_at=created + timedelta(milliseconds=1))

    # When reconciled
    report = run(pg_db, tenant)

    # Then only A lacks a delivery; B's state at the time is unknown, so not counted
    assert found(report) == [(rc.MISSING_DELIVERY, f"{event_id} -> {a}")]
    assert report.counts.pairs_checked == 1
    assert report.counts.pairs_unverifiable == 1


def test_two_deliveries_of_one_event_to_one_endpoint(pg_db: Database) -> None:
    # Given an event fanned out twice to the same endpoint, and a replay (which is fine)
    tenant = make_tenant(pg_db).tenant_id
    endpoint_id = add_endpoint(pg_db, tenant)
    event_id = emit(pg_db, tenant)
    (first,) = pass_through(pg_db, event_id)
    with pg_db.transaction() as session:
        stored = session.get_one(deliveries.StoredEvent, event_id)
        row = fanout.pending(tenant, event_id, stored.event_type, endpoint_id, utcnow())
        fanout.create_deliveries(session, [row])
        deliveries.replay(session, tenant, first)

    # When reconciled, Then the pair is a duplicate_delivery, and only that
    report = run(pg_db, tenant)
    assert found(report) == [(rc.DUPLICATE_DELIVERY, f"{event_id} -> {endpoint_id}")]
    assert report.counts.deliveries["pending"] == 3


def test_a_delivery_not_succeeded_is_a_discrepancy_only_when_required(pg_db: Database) -> None:
    # Given a delivery still retrying, and one to an endpoint since disabled
    tenant = make_tenant(pg_db).tenant_id
    live = add_endpoint(pg_db, tenant, [events.ACCOUNT_CREATED])
    later_disabled = add_endpoint(pg_db, tenant, [events.ACCOUNT_DESTINATION_UPDATED])
    event_id = emit(pg_db, tenant)
    retrying = pass_through(pg_db, event_id)
    set_deliveries(pg_db, retrying, RETRYING)
    pass_through(pg_db, emit(pg_db, tenant, events.ACCOUNT_DESTINATION_UPDATED))
    with pg_db.transaction() as session:
        webhook_endpoints.set_status(session.get_one(Endpoint, later_disabled), DISABLED)

    # When reconciled without requiring delivery, Then it is only counted
    relaxed = run(pg_db, tenant)
    assert relaxed.clean
    assert relaxed.counts.undelivered == {RETRYING: 1}
    # When required but still within the settle time, Then it is in flight
    assert run(pg_db, tenant, settle_s=3600, require_delivered=True).clean
    # When required, Then the live endpoint's retrying delivery is the one discrepancy
    report = run(pg_db, tenant, require_delivered=True)
    assert found(report) == [(rc.UNDELIVERED, f"{event_id} -> {live}")]
    assert f"latest {retrying[0]} is retrying" in report.undelivered[0].detail


def test_a_durable_status_emitted_again_under_a_fresh_id(pg_db: Database) -> None:
    # Given a credited deposit with its whole lifecycle, and a second credited event
    tenant = make_tenant(pg_db).tenant_id
    deposit_id = make_deposit(pg_db, tenant, states.CREDITED)
    deposit_events(
        pg_db, tenant, deposit_id, [states.SOURCE_SEEN, states.SOURCE_CONFIRMED, states.CREDITED]
    )
    again = emit(
        pg_db,
        tenant,
        events.DEPOSIT_CREDITED,
        {"deposit": {"id": deposit_id, "status": "credited"}},
    )
    pass_through(pg_db, again)

    # When reconciled, Then that event is the one duplicate_durable
    report = run(pg_db, tenant)
    assert found(report) == [(rc.DUPLICATE_DURABLE, again)]
    assert "exists too" in report.duplicate_durable[0].detail


@pytest.mark.parametrize(
    ("status", "path", "says"),
    [
        (
            states.CREDITED,
            [states.SOURCE_SEEN, states.SOURCE_CONFIRMED],
            "status is credited but the latest event says source_confirmed",
        ),
        (states.FAILED, [states.SOURCE_SEEN], "status is failed but the latest event says"),
        (
            states.SOURCE_CONFIRMED,
            [states.SOURCE_SEEN, states.SOURCE_CONFIRMED, states.FAILED],
            "status is source_confirmed but the latest event says failed",
        ),
        (
            states.CREDIT_SUBMITTED,
            [states.SOURCE_SEEN, states.SOURCE_CONFIRMED],
            "the latest event says source_confirmed",
        ),
        (
            states.CREDITED,
            [states.SOURCE_SEEN, states.CREDITED],
            "source_seen -> credited is not a lifecycle step",
        ),
        (states.SOURCE_SEEN, [], "no lifecycle event at all"),
    ],
    ids=[
        "credited-without-event",
        "failed-without-event",
        "event-for-status-never-reached",
        "best-effort-event-missing",
        "skipped-confirmation",
        "no-events",
    ],
)
def test_a_deposit_whose_status_disagrees_with_its_events(
    pg_db: Database, status: str, path: list[str], says: str
) -> None:
    # Given a deposit whose events do not lead to its status
    tenant = make_tenant(pg_db).tenant_id
    deposit_id = make_deposit(pg_db, tenant, status)
    deposit_events(pg_db, tenant, deposit_id, path)

    # When reconciled, Then the deposit is the one status_mismatch, saying why
    report = run(pg_db, tenant)
    assert found(report) == [(rc.STATUS_MISMATCH, deposit_id)]
    assert says in report.status_mismatch[0].detail


def test_a_durable_event_of_a_deposit_that_does_not_exist(pg_db: Database) -> None:
    # Given a durable deposit event naming no deposit
    tenant = make_tenant(pg_db).tenant_id
    ghost = new_id("dep")
    event_id = emit(
        pg_db,
        tenant,
        events.DEPOSIT_SOURCE_SEEN,
        {"deposit": {"id": ghost}},
        event_id=events.durable_event_id(ghost, states.SOURCE_SEEN),
    )
    pass_through(pg_db, event_id)

    # When reconciled, Then the missing deposit is reported
    report = run(pg_db, tenant)
    assert found(report) == [(rc.STATUS_MISMATCH, ghost)]
    assert "does not exist" in report.status_mismatch[0].detail


def test_an_empty_window_is_refused(pg_db: Database) -> None:
    now = utcnow()
    with pytest.raises(ValueError, match="since"):
        rc.reconcile(pg_db, pg_db, now, now)


# -- the command ----------------------------------------------------------------------


def _command(monkeypatch: pytest.MonkeyPatch, pg_url: str, *argv: str) -> int:
    monkeypatch.setenv("SETTLE_DATABASE_URL", pg_url)
    for name in ("SETTLE_NOTIFIER_DATABASE_URL", "SETTLE_IDENTITY_DATABASE_URL", "SETTLE_ENV"):
        monkeypatch.delenv(name, raising=False)
    parser = argparse.ArgumentParser(prog="settle")
    rc.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["reconcile", *argv])
    code: int = args.func(args)
    return code


def test_the_command_exits_0_when_clean_and_1_on_a_discrepancy(
    pg_db: Database,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a tenant whose one event went through
    tenant = make_tenant(pg_db).tenant_id
    pass_through(pg_db, emit(pg_db, tenant))
    since = iso_ms(utcnow() - timedelta(minutes=1))
    window = ["--tenant", tenant, "--since", since, "--settle-seconds", "0"]

    # When the command runs, Then it prints a clean report and exits 0
    assert _command(monkeypatch, pg_url, *window) == 0
    assert "OK: no discrepancy" in capsys.readouterr().out

    # Given an event that is then never published
    stuck = emit(pg_db, tenant)
    # When the command runs with --json, Then it exits 1 and names the event
    assert _command(monkeypatch, pg_url, *window, "--json") == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["clean"] is False
    assert [d["subject"] for d in printed["discrepancies"][rc.NOT_PUBLISHED]] == [stuck]
    assert printed["counts"]["events"] == 2

    # When the window is empty, Then it cannot check and exits 2
    assert _command(monkeypatch, pg_url, "--since", since, "--until", since) == 2
    assert "--since must be earlier" in capsys.readouterr().err


# -- two databases (a split deployment: core with identity, the notifier apart) -----------


@pytest.fixture(scope="module")
def split_databases() -> Iterator[tuple[Database, Database]]:
    """Core (with identity) in one database, the notifier in another."""
    core_name = f"settle_test_rc_core_{os.getpid()}"
    notifier_name = f"settle_test_rc_notifier_{os.getpid()}"
    core_url, notifier_url = create_database(core_name), create_database(notifier_name)
    for component in (components.IDENTITY, components.CORE):
        migrate.upgrade(component, core_url)
    migrate.upgrade(components.NOTIFIER, notifier_url)
    core, notifier = Database(core_url, pool_size=2), Database(notifier_url, pool_size=2)
    yield core, notifier
    core.dispose()
    notifier.dispose()
    drop_database(core_name)
    drop_database(notifier_name)


def test_reconcile_reads_two_databases(split_databases: tuple[Database, Database]) -> None:
    # Given core and the notifier in separate databases, an endpoint, one event that
    # went through (delivered), one the notifier lost and a deposit missing its event
    core, notifier = split_databases
    tenant = make_tenant(core).tenant_id
    add_endpoint(notifier, tenant)
    delivered = emit(core, tenant)
    set_deliveries(notifier, consume(notifier, publish(core, delivered)), SUCCEEDED)
    lost = emit(core, tenant)
    publish(core, lost)
    deposit_id = make_deposit(core, tenant, states.SOURCE_CONFIRMED)
    seen = emit(
        core,
        tenant,
        events.DEPOSIT_SOURCE_SEEN,
        {"deposit": {"id": deposit_id}},
        event_id=events.durable_event_id(deposit_id, states.SOURCE_SEEN),
    )
    set_deliveries(notifier, consume(notifier, publish(core, seen)), SUCCEEDED)

    # When reconciled across both
    now = utcnow() + timedelta(seconds=1)
    report = rc.reconcile(
        core, notifier, now - timedelta(minutes=1), now, require_delivered=True, now=now
    )

    # Then the lost event and the deposit are reported, and the delivered event is fine
    assert found(report) == sorted(
        [(rc.NOT_STORED, lost), (rc.STATUS_MISMATCH, deposit_id)],
        key=lambda f: rc.KINDS.index(f[0]),
    )
    assert report.counts.stored == 2
    assert report.counts.deliveries[SUCCEEDED] == 2
    assert report.counts.pairs_checked == 2  # both stored events, to the one endpoint
