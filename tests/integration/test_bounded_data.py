"""Bounded data (issue 24): partitioned tables, dropped whole past their retention.

Each test has its own database (pruning drops tables other tests would read), kept
at one-day partitions made for the past days as a notifier running for a week has
them.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from services import cli
from services.core import outbox
from services.core.retention import OutboxRetention
from services.core.retention import partitioned_tables as outbox_tables
from services.notifier import fanout
from services.notifier.consumer import store_events
from services.notifier.retention import WebhookRetention, partitioned_tables
from shared import components, events, migrate, partitions
from shared.db import Database
from shared.ids import ulid
from tests.support.services import create_database, drop_database

pytestmark = pytest.mark.integration

DAY = timedelta(days=1)
ONE_DAY = WebhookRetention(attempts=DAY, deliveries=DAY, events=DAY)
SETTINGS = partitions.PartitionSettings(days=1, ahead=2)
TENANT = "ten_bounded"
ENDPOINT = "we_bounded"


@pytest.fixture
def db() -> Iterator[Database]:
    name = f"settle_test_bounded_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    migrate.upgrade(components.IDENTITY, url)
    migrate.upgrade(components.NOTIFIER, url)
    database = Database(url, pool_size=2)
    try:
        with database.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO webhook_endpoints (id, tenant_id, name, url, event_types, "
                    "status, secret_encrypted, created_at, updated_at) VALUES (:id, :t, 'n', "
                    "'https://example.com/h', :types, 'enabled', 'x', now(), now())"
                ),
                {"id": ENDPOINT, "t": TENANT, "types": json.dumps([events.DEPOSIT_CREDITED])},
            )
        yield database
    finally:
        database.dispose()
        drop_database(name)


def past_partitions(db: Database, days: int, now: datetime) -> None:
    """The partitions a notifier running for `days` days has made (one a day)."""
    for spec in partitioned_tables(ONE_DAY):
        first = now - days * DAY
        with db.engine.begin() as conn:
            there = partitions.existing(conn, spec)
            for partition in partitions.span(spec, first, now, SETTINGS):
                if not any(p.name == partition.name for p in there):
                    partitions.create(conn, spec, partition)


def event_at(db: Database, at: datetime) -> tuple[str, list[str]]:
    """An event received at `at`, fanned out to the endpoint (a delivery made at `at`)."""
    envelope = events.envelope(events.DEPOSIT_CREDITED, TENANT, {"n": 1}, created_at=at)
    (handled,) = store_events(db, [events.encode(envelope)], now=at)
    return envelope["id"], handled.delivery_ids


def delivery_at(db: Database, event_id: str, at: datetime) -> str:
    """A delivery of `event_id` made at `at` (its id says so), with one attempt."""
    row = fanout.pending(TENANT, event_id, events.DEPOSIT_CREDITED, ENDPOINT, at)
    row["id"] = f"whd_{ulid(int(at.timestamp() * 1000))}"
    with db.driver_transaction() as conn:
        fanout.insert_deliveries(db, conn, [row])
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO webhook_attempts (delivery_id, number, attempted_at) "
                "VALUES (:d, 1, :at)"
            ),
            {"d": row["id"], "at": at},
        )
    return str(row["id"])


def ids(db: Database, table: str, column: str = "id") -> set[Any]:
    with db.engine.connect() as conn:
        return set(conn.scalars(sa.text(f"SELECT {column} FROM {table}")))  # noqa: S608


def partition_names(db: Database) -> set[str]:
    names: set[str] = set()
    with db.engine.connect() as conn:
        for spec in partitioned_tables(ONE_DAY):
            names.update(p.name for p in partitions.existing(conn, spec))
    return names


def settle_prune(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], db: Database, *argv: str
) -> dict[str, Any]:
    """`settle prune ...` as ops run it, with one-day retentions."""
    monkeypatch.setenv("SETTLE_DATABASE_URL", db.url)
    monkeypatch.setenv("SETTLE_NOTIFIER_DATABASE_URL", db.url)
    for table in ("ATTEMPTS", "DELIVERIES", "EVENTS"):
        monkeypatch.setenv(f"SETTLE_RETENTION_WEBHOOK_{table}_DAYS", "1")
    capsys.readouterr()
    assert cli.main(["prune", *argv]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_old_partitions_are_dropped_newer_rows_kept_and_the_dry_run_says_so(
    db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a notifier that has run for five days with one-day partitions
    now = datetime.now(UTC)
    past_partitions(db, 5, now)
    old_times = [now - 4 * DAY, now - 3 * DAY]
    old = [event_at(db, at)[0] for at in old_times]
    old_deliveries = [delivery_at(db, e, at) for e, at in zip(old, old_times, strict=True)]
    recent_event = event_at(db, now)[0]
    recent_delivery = delivery_at(db, recent_event, now)
    before = partition_names(db)
    # (fan-out made deliveries of the old events too: now, by their ids)
    deliveries_before = ids(db, "webhook_deliveries")

    # When ops ask what a prune with one-day retentions would drop
    dry = settle_prune(monkeypatch, capsys, db, "--dry-run")

    # Then it names every partition that ended at least a day ago, and drops nothing
    cutoff = (now - DAY).date()
    expected = {
        p for p in before if datetime.strptime(p.rsplit("_", 1)[1], "%Y%m%d").date() <= cutoff
    }
    assert dry["dryRun"] is True
    assert {p["partition"] for p in dry["partitions"]} == expected
    assert len(expected) == 3 * 4  # three tables, days -5 .. -2 (day -1 still holds rows)
    assert partition_names(db) == before
    assert set(old) <= ids(db, "notifier_events")
    seen = {r["table"]: r["rows"] for r in dry["rows"]}
    assert seen == {"notifier_event_ids": 2}

    # When ops prune
    done = settle_prune(monkeypatch, capsys, db)

    # Then exactly those partitions are gone, with their rows; the newer rows are kept
    assert done["dryRun"] is False
    assert [p["partition"] for p in done["partitions"]] == [
        p["partition"] for p in dry["partitions"]
    ]
    assert partition_names(db) == before - expected
    assert ids(db, "notifier_events") == {recent_event}
    assert ids(db, "notifier_event_ids") == {recent_event}
    kept = deliveries_before - set(old_deliveries)
    assert recent_delivery in kept
    assert ids(db, "webhook_deliveries") == kept
    assert ids(db, "webhook_attempts", "delivery_id") == {recent_delivery}

    # And a second prune has nothing left to drop
    again = settle_prune(monkeypatch, capsys, db, "--dry-run")
    assert again["partitions"] == [] and again["rows"] == []


def test_a_redelivered_event_from_an_older_partition_is_a_no_op(db: Database) -> None:
    # Given an event received three days ago (stored in that day's partition)
    now = datetime.now(UTC)
    past_partitions(db, 5, now)
    envelope = events.envelope(events.DEPOSIT_CREDITED, TENANT, {"n": 1}, created_at=now)
    body = events.encode(envelope)
    (first,) = store_events(db, [body], now=now - 3 * DAY)
    assert len(first.delivery_ids) == 1

    # When core's relay sends it again today (today's partition is another table)
    (again,) = store_events(db, [body], now=now)

    # Then nothing new is stored and no delivery made
    # (its first delivery, still due, is handed back to be sent: no new one)
    assert again.delivery_ids == first.delivery_ids
    with db.engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT tableoid::regclass::text FROM notifier_events WHERE id = :id"),
            {"id": envelope["id"]},
        ).all()
        deliveries = conn.scalar(
            sa.text("SELECT count(*) FROM webhook_deliveries WHERE event_id = :id"),
            {"id": envelope["id"]},
        )
    day = (now - 3 * DAY).date()
    assert stored == [(f"notifier_events_{day:%Y%m%d}_{day + DAY:%Y%m%d}",)]
    assert deliveries == 1


def test_the_maintenance_step_makes_partitions_ahead_and_moves_strays_in(db: Database) -> None:
    # Given a row written while no partition covered its day (the worker was down)
    now = datetime.now(UTC)
    later = now + 10 * DAY
    (stray, _) = event_at(db, later)
    with db.engine.connect() as conn:
        where = conn.scalar(
            sa.text("SELECT tableoid::regclass::text FROM notifier_events WHERE id = :id"),
            {"id": stray},
        )
    assert where == "notifier_events_default"

    # When the maintenance step runs on that day
    maintainer = partitions.Maintainer(
        db.engine, partitioned_tables(WebhookRetention()), SETTINGS, clock=lambda: later
    )
    maintainer.run_once()

    # Then that day and the next two have partitions, and the row moved into its own
    names = partition_names(db)
    for n in range(3):
        day = (later + n * DAY).date()
        assert f"notifier_events_{day:%Y%m%d}_{day + DAY:%Y%m%d}" in names
        assert f"webhook_deliveries_{day:%Y%m%d}_{day + DAY:%Y%m%d}" in names
    with db.engine.connect() as conn:
        where = conn.scalar(
            sa.text("SELECT tableoid::regclass::text FROM notifier_events WHERE id = :id"),
            {"id": stray},
        )
    assert where == f"notifier_events_{later.date():%Y%m%d}_{later.date() + DAY:%Y%m%d}"
    # And the partitions older than the default retentions, none here, are kept
    assert {p for p in names if p.endswith(f"{(now + DAY).date():%Y%m%d}")}


def test_migrating_a_database_at_notifier_0007_keeps_every_row() -> None:
    # Given a notifier database at the previous head, with rows of the last weeks
    name = f"settle_test_migrate_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    engine = sa.create_engine(url)
    now = datetime.now(UTC)
    try:
        migrate.upgrade(components.IDENTITY, url)
        migrate.upgrade(components.NOTIFIER, url, "notifier_0007")
        times = [now - timedelta(days=d) for d in (40, 20, 1, 0)]
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO webhook_endpoints (id, tenant_id, name, url, event_types, "
                    "status, secret_encrypted, created_at, updated_at) VALUES ('we_m', 't', "
                    "'n', 'https://example.com/h', '[]', 'enabled', 'x', now(), now())"
                )
            )
            for n, at in enumerate(times):
                delivery = f"whd_{ulid(int(at.timestamp() * 1000))}"
                conn.execute(
                    sa.text(
                        "INSERT INTO notifier_events (id, tenant_id, event_type, body, "
                        "created_at, received_at) VALUES (:e, 't', 'deposit.credited', '{}', "
                        ":at, :at)"
                    ),
                    {"e": f"evt_m{n}", "at": at},
                )
                conn.execute(
                    sa.text(
                        "INSERT INTO webhook_deliveries (id, tenant_id, endpoint_id, event_id, "
                        "event_type, status, attempt_count, created_at, updated_at) VALUES "
                        "(:d, 't', 'we_m', :e, 'deposit.credited', 'succeeded', 1, :at, :at)"
                    ),
                    {"d": delivery, "e": f"evt_m{n}", "at": at},
                )
                conn.execute(
                    sa.text(
                        "INSERT INTO webhook_attempts (delivery_id, number, attempted_at) "
                        "VALUES (:d, 1, :at)"
                    ),
                    {"d": delivery, "at": at},
                )
            before = {
                table: conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1")).all()  # noqa: S608
                for table in ("notifier_events", "webhook_deliveries", "webhook_attempts")
            }

        # When it is upgraded (to the partitioning; later revisions add columns)
        migrate.upgrade(components.NOTIFIER, url, "notifier_0008")

        # Then every row is there, each in its day's partition, and the ids are kept
        with engine.begin() as conn:
            for table, rows in before.items():
                after = conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1")).all()  # noqa: S608
                assert after == rows, table
            defaults = conn.scalar(
                sa.text(
                    "SELECT (SELECT count(*) FROM notifier_events_default) + "
                    "(SELECT count(*) FROM webhook_deliveries_default) + "
                    "(SELECT count(*) FROM webhook_attempts_default)"
                )
            )
            assert defaults == 0
            seen = set(conn.scalars(sa.text("SELECT id FROM notifier_event_ids")))
            assert seen == {f"evt_m{n}" for n in range(4)}
            # and new attempts go on numbering after the old ones
            next_id = conn.scalar(
                sa.text(
                    "INSERT INTO webhook_attempts (delivery_id, number, attempted_at) "
                    "SELECT delivery_id, 2, now() FROM webhook_attempts LIMIT 1 RETURNING id"
                )
            )
            assert next_id > max(r.id for r in before["webhook_attempts"])
        migrate.upgrade(components.NOTIFIER, url)
        db = Database(url, pool_size=1)
        try:
            # And an event stored before the upgrade, sent again, is still a no-op
            body = events.encode(
                events.envelope(
                    events.DEPOSIT_CREDITED, "t", {"n": 1}, event_id="evt_m1", created_at=now
                )
            )
            (handled,) = store_events(db, [body], now=now)
            assert handled.delivery_ids == []
            with db.engine.connect() as conn:
                count = conn.scalar(
                    sa.text("SELECT count(*) FROM notifier_events WHERE id = 'evt_m1'")
                )
            assert count == 1
        finally:
            db.dispose()
    finally:
        engine.dispose()
        drop_database(name)


def test_a_partition_is_made_while_rows_of_its_day_keep_arriving(db: Database) -> None:
    # Given the worker was down: today's rows go to the DEFAULT partition, and one more
    # is being written (not yet committed) when the maintenance step makes today's
    later = datetime.now(UTC) + 10 * DAY
    (stray, _) = event_at(db, later)
    writer = db.engine.connect()
    writer.begin()
    writer.execute(
        sa.text(
            "INSERT INTO notifier_events (id, tenant_id, event_type, body, created_at, "
            "received_at) VALUES ('evt_inflight', :t, 'deposit.credited', '{}', :at, :at)"
        ),
        {"t": TENANT, "at": later},
    )
    made: list[partitions.Partition] = []
    failed: list[BaseException] = []

    def ensure() -> None:
        try:
            made.extend(partitions.ensure(db.engine, partitioned_tables(ONE_DAY), SETTINGS, later))
        except BaseException as exc:  # the thread's failure is the test's
            failed.append(exc)

    thread = threading.Thread(target=ensure)
    thread.start()
    time.sleep(0.5)  # within the lock timeout: the step waits for the writer
    writer.commit()
    writer.close()
    thread.join(30)

    # Then the day's partition is made, with both rows in it (none left behind)
    assert not failed
    today = f"notifier_events_{later.date():%Y%m%d}_{later.date() + DAY:%Y%m%d}"
    assert today in {p.name for p in made}
    with db.engine.connect() as conn:
        where = dict(
            conn.execute(sa.text("SELECT id, tableoid::regclass::text FROM notifier_events")).all()
        )
    assert where == {stray: today, "evt_inflight": today}


def test_a_partition_that_cannot_be_made_now_does_not_stop_the_rest_of_the_round(
    db: Database,
) -> None:
    # Given a writer holding the events' DEFAULT partition longer than the lock timeout
    now = datetime.now(UTC)
    past_partitions(db, 5, now)
    (old_event, _) = event_at(db, now - 3 * DAY)
    old_delivery = delivery_at(db, old_event, now - 3 * DAY)
    later = now + 10 * DAY
    writer = db.engine.connect()
    writer.begin()
    writer.execute(
        sa.text(
            "INSERT INTO notifier_events (id, tenant_id, event_type, body, created_at, "
            "received_at) VALUES ('evt_held', :t, 'deposit.credited', '{}', :at, :at)"
        ),
        {"t": TENANT, "at": later},
    )
    try:
        # When the maintenance step runs (further ahead than made so far: each table has
        # partitions to make, and each one old partition to drop)
        further = partitions.PartitionSettings(days=1, ahead=6)
        maintainer = partitions.Maintainer(
            db.engine, partitioned_tables(ONE_DAY), further, clock=lambda: now
        )
        report = maintainer.run_once()
    finally:
        writer.rollback()
        writer.close()

    # Then the events wait for the next round, and the other tables' round goes on
    day = (now + 6 * DAY).date()
    names = partition_names(db)
    assert f"notifier_events_{day:%Y%m%d}_{day + DAY:%Y%m%d}" not in names
    assert f"webhook_deliveries_{day:%Y%m%d}_{day + DAY:%Y%m%d}" in names
    assert f"webhook_attempts_{day:%Y%m%d}_{day + DAY:%Y%m%d}" in names
    assert {p["table"] for p in report.partitions} == {"webhook_deliveries", "webhook_attempts"}
    assert old_delivery not in ids(db, "webhook_deliveries")
    assert old_delivery not in ids(db, "webhook_attempts", "delivery_id")
    # and the event's id is kept with its event (its partition is still there)
    assert old_event in ids(db, "notifier_events")
    assert old_event in ids(db, "notifier_event_ids")


def test_two_workers_making_the_same_partitions_at_once_both_finish_their_round(
    db: Database,
) -> None:
    # Given two notifier workers whose maintenance rounds start together (a deploy)
    later = datetime.now(UTC) + 20 * DAY
    for n in range(3):
        event_at(db, later + n * timedelta(minutes=1))  # rows for the day in DEFAULT
    failed: list[BaseException] = []

    def round_() -> None:
        maintainer = partitions.Maintainer(
            db.engine, partitioned_tables(WebhookRetention()), SETTINGS, clock=lambda: later
        )
        try:
            maintainer.run_once()
        except BaseException as exc:  # the thread's failure is the test's
            failed.append(exc)

    threads = [threading.Thread(target=round_) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    # Then neither round fails, and the day's partitions are made once, rows moved in
    assert not failed
    day = later.date()
    assert f"notifier_events_{day:%Y%m%d}_{day + DAY:%Y%m%d}" in partition_names(db)
    with db.engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM notifier_events_default")) == 0


# -- core's outbox ------------------------------------------------------------------


@pytest.fixture
def core_db() -> Iterator[Database]:
    name = f"settle_test_outbox_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    migrate.upgrade(components.IDENTITY, url)
    migrate.upgrade(components.CORE, url)
    database = Database(url, pool_size=2)
    try:
        yield database
    finally:
        database.dispose()
        drop_database(name)


OUTBOX_ONE_DAY = OutboxRetention(events=DAY, deposit_events=DAY * 365)


def outbox_partitions(db: Database, days: int, now: datetime) -> None:
    """The outbox partitions of a core running for `days` days."""
    for spec in outbox_tables(OUTBOX_ONE_DAY):
        with db.engine.begin() as conn:
            there = {p.name for p in partitions.existing(conn, spec)}
            for partition in partitions.span(spec, now - days * DAY, now, SETTINGS):
                if partition.name not in there:
                    partitions.create(conn, spec, partition)


def emit_at(db: Database, at: datetime, event_type: str, **kwargs: Any) -> str:
    data = {"deposit": {"id": "dep_x"}} if event_type == events.DEPOSIT_CREDITED else {"n": 1}
    with db.transaction() as session:
        envelope = outbox.emit(session, event_type, TENANT, data, created_at=at, **kwargs)
    return str(envelope["id"])


def publish(db: Database, event_ids: list[str]) -> None:
    with db.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE outbox SET published_at = now() WHERE event_id = ANY(:ids)"),
            {"ids": event_ids},
        )


def test_the_outbox_drops_published_events_past_retention_and_keeps_the_timeline(
    core_db: Database, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a core that has run for five days: events of each day, all published but one
    # four days old, and a deposit's status event three days old
    now = datetime.now(UTC)
    outbox_partitions(core_db, 5, now)
    old = [emit_at(core_db, now - d * DAY, events.API_KEY_REVOKED) for d in (4, 3, 2)]
    stuck = emit_at(core_db, now - 4 * DAY, events.API_KEY_REVOKED)
    durable = events.durable_event_id("dep_x", "credited")
    credited = emit_at(core_db, now - 3 * DAY, events.DEPOSIT_CREDITED, event_id=durable)
    recent = emit_at(core_db, now, events.API_KEY_REVOKED)
    publish(core_db, [*old, credited, recent])

    # When ops prune with a one-day retention of the outbox's other events
    monkeypatch.setenv("SETTLE_DATABASE_URL", core_db.url)
    monkeypatch.setenv("SETTLE_RETENTION_OUTBOX_DAYS", "1")
    dry = settle_prune(monkeypatch, capsys, core_db, "--dry-run")
    done = settle_prune(monkeypatch, capsys, core_db)

    # Then the published days' partitions go, the one with an unpublished row is held,
    # and the deposit's timeline is kept; the dry run named exactly what went
    day4 = (now - 4 * DAY).date()
    held = f"outbox_events_{day4:%Y%m%d}_{day4 + DAY:%Y%m%d}"
    assert [p["partition"] for p in done["partitions"]] == [
        p["partition"] for p in dry["partitions"]
    ]
    assert held in {p["partition"] for p in done["held"]}
    assert all(p["partition"].startswith("outbox_events_") for p in done["partitions"])
    assert len(done["partitions"]) == 3  # days -5, -3, -2 (-4 held, -1 still in retention)
    # (the held day keeps its published row too, until its last row is published)
    assert ids(core_db, "outbox", "event_id") == {old[0], stuck, credited, recent}
    assert ids(core_db, "outbox_durable_ids", "event_id") == {durable}


def test_a_durable_deposit_event_is_written_at_most_once_across_partitions(
    core_db: Database,
) -> None:
    # Given a deposit's durable event written three days ago (that day's partition)
    now = datetime.now(UTC)
    outbox_partitions(core_db, 5, now)
    durable = events.durable_event_id("dep_y", "credited")
    emit_at(core_db, now - 3 * DAY, events.DEPOSIT_CREDITED, event_id=durable)

    # When it is emitted again today, one by one and in bulk
    with pytest.raises(sa.exc.IntegrityError):
        emit_at(core_db, now, events.DEPOSIT_CREDITED, event_id=durable)
    envelope = events.envelope(
        events.DEPOSIT_CREDITED, TENANT, {"deposit": {"id": "dep_y"}}, event_id=durable
    )
    twice = events.envelope(
        events.DEPOSIT_CREDITED,
        TENANT,
        {"deposit": {"id": "dep_z"}},
        event_id=events.durable_event_id("dep_z", "credited"),
    )
    with core_db.transaction() as session:
        written = outbox.emit_many(session, [envelope, twice, dict(twice)])

    # Then only the new one is written, once
    assert written == 1
    with core_db.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT event_id, count(*) FROM outbox GROUP BY event_id")
        ).all()
    assert dict(rows) == {durable: 1, twice["id"]: 1}


def test_migrating_core_0014_keeps_every_outbox_row_and_each_durable_id() -> None:
    # Given core at the previous head with outbox rows of the last weeks
    name = f"settle_test_migrate_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    engine = sa.create_engine(url)
    now = datetime.now(UTC)
    durable = events.durable_event_id("dep_m", "credited")
    try:
        migrate.upgrade(components.IDENTITY, url)
        migrate.upgrade(components.CORE, url, "core_0014")
        insert = sa.text(
            "INSERT INTO outbox (event_id, event_type, tenant_id, body, created_at, "
            "published_at) VALUES (:e, :t, 'ten', :b, :at, :pub)"
        )
        with engine.begin() as conn:
            for n, days in enumerate((400, 40, 2, 0)):
                at = now - timedelta(days=days)
                conn.execute(
                    insert,
                    {
                        "e": f"evt_o{n}",
                        "t": "tenant.api_key_revoked",
                        "b": "{}",
                        "at": at,
                        "pub": at,
                    },
                )
            body = json.dumps({"data": {"deposit": {"id": "dep_m"}}})
            conn.execute(
                insert,
                {
                    "e": durable,
                    "t": "deposit.credited",
                    "b": body,
                    "at": now - 200 * DAY,
                    "pub": None,
                },
            )
            before = conn.execute(sa.text("SELECT * FROM outbox ORDER BY id")).all()

        # When it is upgraded (to the partitioning)
        migrate.upgrade(components.CORE, url, "core_0015")

        # Then every row is there, in the partition of its class and day
        with engine.begin() as conn:
            after = conn.execute(
                sa.text(
                    "SELECT id, event_id, event_type, tenant_id, body, created_at, "
                    "published_at, request_id FROM outbox ORDER BY id"
                )
            ).all()
            assert after == before
            where = dict(
                conn.execute(sa.text("SELECT event_id, tableoid::regclass::text FROM outbox")).all()
            )
            assert where[durable].startswith("outbox_timeline_")
            assert where["evt_o0"].startswith("outbox_events_")
            assert not any(table == "outbox_default" for table in where.values())
            assert set(conn.scalars(sa.text("SELECT event_id FROM outbox_durable_ids"))) == {
                durable
            }
            new_id = conn.scalar(
                sa.text(
                    "INSERT INTO outbox (event_id, event_type, tenant_id, body, created_at) "
                    "VALUES ('evt_new', 'tenant.api_key_revoked', 'ten', '{}', now()) "
                    "RETURNING id"
                )
            )
            assert new_id > max(r.id for r in before)
        # And the durable event, emitted again, is refused
        migrate.upgrade(components.CORE, url)
        db = Database(url, pool_size=1)
        try:
            with pytest.raises(sa.exc.IntegrityError):
                emit_at(db, now, events.DEPOSIT_CREDITED, event_id=durable)
        finally:
            db.dispose()
    finally:
        engine.dispose()
        drop_database(name)


def test_a_drop_that_cannot_get_its_lock_waits_for_the_next_round(db: Database) -> None:
    # Given an old day's event, and a reader holding the events table (a long report)
    now = datetime.now(UTC)
    past_partitions(db, 5, now)
    old, _ = event_at(db, now - 4 * DAY)
    specs = partitioned_tables(ONE_DAY)
    with db.engine.connect() as reader:
        reader.execute(sa.text("BEGIN"))
        reader.execute(sa.text("SELECT count(*) FROM notifier_events"))

        # When the maintenance step prunes meanwhile
        report = partitions.prune(db.engine, specs[:1], now)
        reader.execute(sa.text("ROLLBACK"))

    # Then nothing of the events went (not the partition, not the event's id), and the
    # report says so; the next round drops them
    assert report.partitions == [] and report.rows == []
    assert old in ids(db, "notifier_events")
    assert old in ids(db, "notifier_event_ids")
    report = partitions.prune(db.engine, specs[:1], now)
    assert report.partitions and old not in ids(db, "notifier_event_ids")
