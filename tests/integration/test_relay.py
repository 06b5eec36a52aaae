"""The outbox relay against the real PostgreSQL and RabbitMQ, and to the in-process bus."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pika
import psycopg
import pytest
import sqlalchemy as sa

from services.core import outbox
from services.core import relay as relay_module
from services.core.models import OutboxEvent
from services.core.outbox_wakeup import NOTIFY_CHANNEL
from services.core.relay import (
    outbox_lag,
    relay_once,
    start_relay_thread,
)
from shared import events
from shared.bus import (
    BusNames,
    EventPublisher,
    InProcessBus,
    OutgoingEvent,
    PublishError,
    RabbitPublisher,
    declare_events_exchange,
)
from shared.db import Database
from shared.timefmt import utcnow
from tests.support.pipeline import delete_bus, isolated_database, unique_prefix, wait_until
from tests.support.receiver import closed_port_url
from tests.support.services import AMQP_URL, require_service

pytestmark = pytest.mark.integration


class BusTap:
    """An exclusive queue bound to every event type of an exchange: what the relay sent."""

    def __init__(self, names: BusNames) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        self.channel = self.connection.channel()
        declare_events_exchange(self.channel, names)
        self.queue = self.channel.queue_declare("", exclusive=True).method.queue
        self.channel.queue_bind(self.queue, names.exchange, routing_key="#")
        self.messages: list[tuple[Any, Any, bytes]] = []

    def drain(self) -> list[tuple[Any, Any, bytes]]:
        while True:
            method, props, body = self.channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                return self.messages
            self.messages.append((method, props, body))

    def ids(self) -> list[str]:
        return [props.message_id for _, props, _ in self.drain()]

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


@pytest.fixture(scope="module")
def db() -> Iterator[Database]:
    """An outbox of this module's own (a relay takes every unpublished row it sees)."""
    with isolated_database("relay") as url:
        database = Database(url, pool_size=8)
        yield database
        database.dispose()


@pytest.fixture
def names() -> Iterator[BusNames]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    bus = BusNames(unique_prefix())
    yield bus
    delete_bus(bus)


@pytest.fixture
def tap(names: BusNames) -> Iterator[BusTap]:
    tap = BusTap(names)
    yield tap
    tap.close()


def _emit(db: Database, n: int = 1, tenant_id: str | None = None) -> list[dict[str, Any]]:
    tenant_id = tenant_id or str(uuid.uuid4())
    out = []
    for i in range(n):
        with db.transaction() as session:
            out.append(outbox.emit(session, events.DEPOSIT_CREDITED, tenant_id, {"n": i}))
    return out


def _published_at(db: Database, event_ids: list[str]) -> dict[str, Any]:
    with db.reader() as session:
        rows = session.execute(
            sa.select(OutboxEvent.event_id, OutboxEvent.published_at).where(
                OutboxEvent.event_id.in_(event_ids)
            )
        ).all()
    return {row.event_id: row.published_at for row in rows}


def _relay_all(db: Database, publisher: EventPublisher) -> None:
    """Drain the outbox (other tests may have left rows before ours)."""
    while relay_once(db, publisher) > 0:
        pass


def test_relay_publishes_in_id_order_persistent_and_marks_rows(
    db: Database, names: BusNames, tap: BusTap
) -> None:
    # Given five events committed one after another
    emitted = _emit(db, 5)
    ids = [e["id"] for e in emitted]
    # When the relay runs
    publisher = RabbitPublisher(AMQP_URL, names)
    try:
        _relay_all(db, publisher)
    finally:
        publisher.close()
    # Then each went to settle.events once, in commit order, as persistent JSON
    mine = [m for m in tap.drain() if m[1].message_id in ids]
    assert [m[1].message_id for m in mine] == ids
    for (method, props, body), envelope in zip(mine, emitted, strict=True):
        assert method.exchange == names.exchange
        assert method.routing_key == events.DEPOSIT_CREDITED
        assert props.delivery_mode == 2 and props.content_type == "application/json"
        assert body == events.encode(envelope)
    # And every row is marked published
    assert all(_published_at(db, ids).values())


def test_rows_stay_in_the_outbox_while_the_broker_is_unreachable(db: Database) -> None:
    # Given a publisher pointed at a port where no broker listens
    (envelope,) = _emit(db)
    dead = RabbitPublisher(closed_port_url().replace("http://", "amqp://guest:guest@"))
    # When the relay runs, it fails
    with pytest.raises(PublishError):
        relay_once(db, dead)
    # Then the row is not marked: nothing the broker did not confirm counts as sent
    assert _published_at(db, [envelope["id"]]) == {envelope["id"]: None}


def test_nothing_is_marked_while_no_queue_is_bound(db: Database, names: BusNames) -> None:
    # Given an exchange no queue is bound to (the notifier never ran): the broker would drop
    (envelope,) = _emit(db)
    publisher = RabbitPublisher(AMQP_URL, names)
    try:
        # When the relay runs, the mandatory message comes back
        with pytest.raises(PublishError, match="no queue is bound"):
            relay_once(db, publisher)
    finally:
        publisher.close()
    # Then the row waits in the outbox
    assert _published_at(db, [envelope["id"]]) == {envelope["id"]: None}


def test_a_commit_wakes_the_relay_at_once(db: Database, names: BusNames, tap: BusTap) -> None:
    # Given a relay that would poll only every 30 s, drained and asleep
    stop = threading.Event()
    thread = start_relay_thread(db, lambda: RabbitPublisher(AMQP_URL, names), stop, poll_s=30)
    try:
        time.sleep(0.5)
        tap.drain()
        # When core commits an event
        started = time.monotonic()
        (envelope,) = _emit(db)
        # Then it is on the bus well before any poll (LISTEN/NOTIFY)
        wait_until(lambda: envelope["id"] in tap.ids(), 3, "the event on the bus")
        assert time.monotonic() - started < 1.0
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


class _Switchable:
    """Publishers to a dead port until `up` is set, then to the real broker."""

    def __init__(self, names: BusNames) -> None:
        self.names = names
        self.up = threading.Event()
        self.dead_url = closed_port_url().replace("http://", "amqp://guest:guest@")

    def __call__(self) -> EventPublisher:
        return _SwitchingPublisher(self)


class _SwitchingPublisher:
    def __init__(self, switch: _Switchable) -> None:
        self.switch = switch
        self.dead = RabbitPublisher(switch.dead_url, switch.names)
        self.live = RabbitPublisher(AMQP_URL, switch.names)

    def _current(self) -> RabbitPublisher:
        return self.live if self.switch.up.is_set() else self.dead

    def publish_batch(self, batch: Sequence[OutgoingEvent]) -> None:
        self._current().publish_batch(batch)

    def keepalive(self) -> None:
        self._current().keepalive()

    def close(self) -> None:
        self.dead.close()
        self.live.close()


def test_events_committed_while_rabbitmq_is_down_are_all_published_when_it_is_back(
    db: Database, names: BusNames, tap: BusTap
) -> None:
    # Given a running relay whose broker is unreachable
    switch = _Switchable(names)
    stop = threading.Event()
    thread = start_relay_thread(db, switch, stop, poll_s=0.2)
    try:
        # When core keeps committing events meanwhile
        emitted = [e["id"] for e in _emit(db, 20)]
        time.sleep(0.8)
        assert not any(_published_at(db, emitted).values())
        # And the broker comes back
        switch.up.set()
        # Then every event is published (the backoff retries within seconds) and marked
        wait_until(lambda: set(emitted) <= set(tap.ids()), 10, "all events on the bus")
        wait_until(lambda: all(_published_at(db, emitted).values()), 5, "rows marked")
    finally:
        stop.set()
        thread.join(10)
    received = [i for i in tap.ids() if i in emitted]
    assert sorted(received) == sorted(emitted)


def test_two_relays_share_the_outbox_without_double_publishing(
    db: Database, names: BusNames, tap: BusTap
) -> None:
    # Given two relays on the same outbox (two core workers)
    stop = threading.Event()
    threads = [
        start_relay_thread(db, lambda: RabbitPublisher(AMQP_URL, names), stop, poll_s=0.2)
        for _ in range(2)
    ]
    try:
        # When 120 events are committed from four writers at once
        emitted: list[str] = []
        lock = threading.Lock()

        def writer() -> None:
            ids = [e["id"] for e in _emit(db, 30)]
            with lock:
                emitted.extend(ids)

        writers = [threading.Thread(target=writer) for _ in range(4)]
        for w in writers:
            w.start()
        for w in writers:
            w.join(30)
        # Then each event is published exactly once (SKIP LOCKED splits the rows)
        wait_until(lambda: set(emitted) <= set(tap.ids()), 10, "all events on the bus")
        time.sleep(0.3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    received = [i for i in tap.ids() if i in set(emitted)]
    assert len(emitted) == 120 and sorted(received) == sorted(emitted)


def test_outbox_lag_reports_the_oldest_unpublished_row(db: Database) -> None:
    # Given an unpublished event (nothing relays in this test)
    _emit(db)
    count, lag = outbox_lag(db)
    assert count >= 1 and lag >= 0.0


def test_the_in_process_bus_is_woken_by_a_commit_and_gets_the_exact_body(db: Database) -> None:
    # Given a relay to an in-process bus (as `settle dev` runs it), polling only every 30 s
    for _ in range(100):  # earlier tests' rows go first
        if relay_once(db, InProcessBus(lambda body: None)) == 0:
            break
    received: list[dict[str, Any]] = []
    stop = threading.Event()
    thread = start_relay_thread(
        db, lambda: InProcessBus(lambda body: received.append(json.loads(body))), stop, poll_s=30
    )
    try:
        time.sleep(0.3)
        # When an event commits
        started = time.monotonic()
        (envelope,) = _emit(db)
        # Then the handler has its exact body at once (LISTEN/NOTIFY, not the 30 s poll)
        wait_until(lambda: envelope in received, 5, "the in-process handler to run")
        assert time.monotonic() - started < 3.0
        wait_until(lambda: all(_published_at(db, [envelope["id"]]).values()), 3, "row marked")
    finally:
        stop.set()
        thread.join(10)


def test_a_failing_in_process_handler_keeps_the_row(db: Database) -> None:
    # Given an in-process bus whose handler fails (the notifier's database is down)
    def broken(body: bytes) -> None:
        raise RuntimeError("notifier database down")

    for _ in range(100):  # earlier tests' rows go first
        if relay_once(db, InProcessBus(lambda body: None)) == 0:
            break
    (envelope,) = _emit(db)
    # When the relay runs, then the failure propagates and the row stays
    with pytest.raises(PublishError):
        relay_once(db, InProcessBus(broken))
    assert _published_at(db, [envelope["id"]]) == {envelope["id"]: None}
    # And a working handler later takes it
    got: list[bytes] = []
    assert relay_once(db, InProcessBus(got.append)) == 1
    assert json.loads(got[0])["id"] == envelope["id"]


def test_rows_confirmed_before_a_failure_are_marked_and_the_rest_wait(db: Database) -> None:
    # Given an in-process bus whose handler fails on the third event of a batch
    emitted = [e["id"] for e in _emit(db, 5)]
    seen: list[str] = []

    def flaky(body: bytes) -> None:
        event_id = json.loads(body)["id"]
        if event_id == emitted[2]:
            raise RuntimeError("down")
        seen.append(event_id)

    # When the relay drains the outbox (other tests' rows may come first)
    with pytest.raises(PublishError):
        while relay_once(db, InProcessBus(flaky)) > 0:
            pass
    # Then the two events taken before the failure are marked, the failed one and the rest not
    marks = _published_at(db, emitted)
    assert [marks[i] is not None for i in emitted] == [True, True, False, False, False]
    assert emitted[:2] == [i for i in seen if i in emitted]


def test_a_commit_in_the_notify_gap_is_relayed_without_a_notify_or_a_poll(db: Database) -> None:
    """A writer sends at most one NOTIFY per MIN_GAP_S; commits in the gap after one send
    none. The relay, woken by the first, looks again for a while and finds them."""
    _relay_all(db, InProcessBus(lambda body: None))  # earlier tests' rows go first
    quiet_envelope, quiet_row = outbox.event_row(events.DEPOSIT_CREDITED, "ten_gap", {"n": 2})
    received: list[dict[str, Any]] = []

    def handle(body: bytes) -> None:
        envelope = json.loads(body)
        received.append(envelope)
        if len(received) == 1:
            # While the first is being published: an event whose commit sends no NOTIFY
            # (as one committed right after another NOTIFY of its process would)
            with db.engine.begin() as conn:
                conn.execute(sa.insert(OutboxEvent).values(quiet_row))

    # Given a relay polling only every 30 s
    stop = threading.Event()
    thread = start_relay_thread(db, lambda: InProcessBus(handle), stop, poll_s=30)
    try:
        time.sleep(0.3)
        # When an event commits (NOTIFY), and a second one while the relay publishes it
        (first,) = _emit(db)
        # Then both reach the bus, the second without any NOTIFY, well before the poll
        wait_until(lambda: len(received) == 2, 5, "the quiet event on the bus")
        assert [e["id"] for e in received] == [first["id"], quiet_envelope["id"]]
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_rows_another_relay_holds_end_the_look_window_instead_of_spinning(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window's probe sees rows a round skips (SKIP LOCKED: another relay is
    publishing them); a round that then publishes nothing ends the window."""
    _relay_all(db, InProcessBus(lambda body: None))
    _, row = outbox.event_row(events.DEPOSIT_CREDITED, "ten_locked", {"n": 1})
    with db.engine.begin() as conn:
        conn.execute(sa.insert(OutboxEvent).values(row))
    rounds = [0]
    real_round = relay_module.relay_once

    def counted(*args: Any, **kwargs: Any) -> int:
        rounds[0] += 1
        return real_round(*args, **kwargs)

    monkeypatch.setattr(relay_module, "relay_once", counted)
    # Given another relay holding the unpublished row, and a relay polling every 30 s
    holder = db.engine.connect()
    held = holder.begin()
    holder.execute(sa.text("SELECT id FROM outbox WHERE published_at IS NULL FOR UPDATE"))
    stop = threading.Event()
    thread = start_relay_thread(db, lambda: InProcessBus(lambda body: None), stop, poll_s=30)
    try:
        time.sleep(0.3)
        before = rounds[0]
        # When writers wake it ten times in half a second
        with psycopg.connect(db.libpq_url, autocommit=True) as writer:
            for _ in range(10):
                writer.execute(f"NOTIFY {outbox.NOTIFY_CHANNEL}")
                time.sleep(0.05)
        during = rounds[0] - before
    finally:
        stop.set()
        thread.join(10)
        held.rollback()
        holder.close()
    assert not thread.is_alive()
    # Then it runs about a round per wake-up (one more after each probe), not one per 2 ms
    assert during <= 25, f"{during} relay rounds for 10 NOTIFYs in 0.5 s"


def test_an_idle_relay_probes_instead_of_running_rounds_and_still_finds_a_silent_row(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At rest the relay sleeps on its LISTEN socket; each poll tick is an index probe on
    that connection, and a relay round's transaction only runs when a row waits."""
    _relay_all(db, InProcessBus(lambda body: None))
    rounds = [0]
    real_round = relay_module.relay_once

    def counted(*args: Any, **kwargs: Any) -> int:
        rounds[0] += 1
        return real_round(*args, **kwargs)

    monkeypatch.setattr(relay_module, "relay_once", counted)
    received: list[str] = []
    # Given a relay that polls every 0.1 s, with nothing to relay
    stop = threading.Event()
    thread = start_relay_thread(
        db,
        lambda: InProcessBus(lambda body: received.append(json.loads(body)["id"])),
        stop,
        poll_s=0.1,
    )
    try:
        time.sleep(0.5)
        before = rounds[0]
        # When it stays idle for a second (ten ticks)
        time.sleep(1.0)
        idle_rounds = rounds[0] - before
        # And a row is committed that sends no NOTIFY (its writer's wake-up was lost)
        silent, row = outbox.event_row(events.DEPOSIT_CREDITED, "ten_silent", {"n": 1})
        with db.engine.begin() as conn:
            conn.execute(sa.insert(OutboxEvent).values(row))
        # Then the tick's probe finds it and a round publishes it
        wait_until(lambda: silent["id"] in received, 5, "the silent row on the bus")
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    # And the idle second ran no relay round at all
    assert idle_rounds == 0, f"{idle_rounds} relay rounds in a second with nothing to relay"


def _outbox_partitions_planned(db: Database, statement: Any) -> list[str]:
    """The outbox partitions PostgreSQL plans `statement` to touch (EXPLAIN, no write)."""
    compiled = statement.compile(
        dialect=db.engine.dialect, compile_kwargs={"render_postcompile": True}
    )
    with db.transaction() as session:
        (plan,) = (
            session.connection()
            .exec_driver_sql("EXPLAIN (FORMAT JSON) " + compiled.string, compiled.params)
            .one()
        )
    plan = json.loads(plan) if isinstance(plan, str) else plan
    names: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        name = node.get("Relation Name", "")
        if name.startswith("outbox_") and not name.startswith("outbox_durable"):
            names.append(name)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return names


def test_the_mark_plans_only_the_partitions_of_its_rows(db: Database) -> None:
    # The outbox is partitioned by (timeline, created_at): PostgreSQL prunes a range
    # key's second column only when its first is fixed, so a bound on created_at alone
    # still opens every partition (46 in a year-old database).
    now = utcnow()
    unbounded = sa.update(OutboxEvent).where(OutboxEvent.id.in_([1, 2])).values(published_at=now)
    assert len(_outbox_partitions_planned(db, unbounded)) > 2
    # Given a batch with rows of both kinds created now
    rows = [(1, False, now), (2, True, now - timedelta(microseconds=1))]
    # Then each statement of the mark plans one partition
    statements = relay_module._mark_statements(rows, now)
    assert statements
    for statement in statements:
        assert len(_outbox_partitions_planned(db, statement)) <= 1


def test_one_round_marks_the_rows_of_both_timelines(db: Database) -> None:
    for _ in range(100):  # earlier tests' rows go first
        if relay_once(db, InProcessBus(lambda body: None)) == 0:
            break
    # Given a deposit's status event (its timeline) and another event, in one batch
    tenant_id = str(uuid.uuid4())
    with db.transaction() as session:
        status = outbox.emit(session, events.DEPOSIT_CREDITED, tenant_id, {"n": 1})
        other = outbox.emit(session, events.ACCOUNT_CREATED, tenant_id, {"n": 2})
    ids = [status["id"], other["id"]]
    with db.reader() as session:
        kinds = session.scalars(
            sa.select(OutboxEvent.timeline).where(OutboxEvent.event_id.in_(ids))
        ).all()
    assert sorted(kinds) == [False, True]
    # When one round publishes them, then both are marked: none is published again
    assert relay_once(db, InProcessBus(lambda body: None)) == 2
    assert all(_published_at(db, ids).values())
    assert relay_once(db, InProcessBus(lambda body: None)) == 0


def _insert_created(
    db: Database, created_at: datetime, event_type: str = events.DEPOSIT_CREDITED
) -> str:
    """An outbox row whose created_at is `created_at` (a transaction that ran long, or a
    writer whose clock is behind), committed now without a NOTIFY; its event id."""
    envelope, row = outbox.event_row(
        event_type, f"ten_{uuid.uuid4().hex[:8]}", {"n": 1}, created_at=created_at
    )
    with db.engine.begin() as conn:
        conn.execute(sa.insert(OutboxEvent).values(row))
    return str(envelope["id"])


@contextmanager
def _running_relay(db: Database, poll_s: float) -> Iterator[dict[str, float]]:
    """A relay thread publishing to an in-process bus; yields event id -> when it came."""
    received: dict[str, float] = {}

    def arrived(body: bytes) -> None:
        received.setdefault(json.loads(body)["id"], time.monotonic())

    stop = threading.Event()
    thread = start_relay_thread(db, lambda: InProcessBus(arrived), stop, poll_s=poll_s)
    try:
        yield received
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_a_round_of_the_recent_rows_leaves_an_old_row_to_the_whole_round(db: Database) -> None:
    _relay_all(db, InProcessBus(lambda body: None))
    received: list[str] = []
    bus = InProcessBus(lambda body: received.append(json.loads(body)["id"]))
    # Given a row created two hours ago, committed only now, and a row created now
    old = _insert_created(db, utcnow() - timedelta(hours=2))
    new = _emit(db, 1)[0]["id"]
    # When a round reads the rows of the last minute
    assert relay_once(db, bus, since=utcnow() - timedelta(seconds=60)) == 1
    # Then it publishes the new row only
    assert received == [new]
    # And a round of the whole outbox publishes the old one
    assert relay_once(db, bus) == 1
    assert received == [new, old]
    assert all(_published_at(db, [old, new]).values())


def test_a_round_of_the_recent_rows_reads_both_timelines_in_id_order(db: Database) -> None:
    _relay_all(db, InProcessBus(lambda body: None))
    received: list[str] = []
    bus = InProcessBus(lambda body: received.append(json.loads(body)["id"]))
    tenant_id = str(uuid.uuid4())
    emitted = []
    for event_type in (events.ACCOUNT_CREATED, events.DEPOSIT_CREDITED, events.ACCOUNT_CREATED):
        with db.transaction() as session:
            emitted.append(outbox.emit(session, event_type, tenant_id, {"n": 1})["id"])
    assert relay_once(db, bus, batch_size=2, since=utcnow() - timedelta(seconds=60)) == 2
    assert relay_once(db, bus, batch_size=2, since=utcnow() - timedelta(seconds=60)) == 1
    assert received == emitted


def test_a_running_relay_publishes_a_row_committed_long_after_it_was_written(
    db: Database,
) -> None:
    """Rounds between whole-outbox rounds read only the last RECENT_S: an older row is
    published by the next whole round, even while newer rows keep the relay busy."""
    _relay_all(db, InProcessBus(lambda body: None))
    # no poll tick during the test: whole rounds come from RoundScope
    with _running_relay(db, poll_s=30.0) as received:
        first = _emit(db, 1)[0]["id"]
        wait_until(lambda: first in received, 5, "the relay running")
        # Given a relay kept busy by new rows, and a row created an hour ago committed now
        old = _insert_created(db, utcnow() - timedelta(hours=1))
        deadline = time.monotonic() + relay_module.FULL_ROUND_S * 5
        while old not in received and time.monotonic() < deadline:
            _emit(db, 1)
            time.sleep(0.05)
        # Then it was published (by a whole round) within a few FULL_ROUND_S
        assert old in received


def test_a_round_of_the_recent_rows_plans_only_the_newest_partitions(db: Database) -> None:
    (whole,) = relay_module._round_statements(10, None)
    assert len(_outbox_partitions_planned(db, whole)) > 2
    recent = relay_module._round_statements(10, utcnow() - timedelta(seconds=60))
    assert len(recent) == 2
    for statement in recent:
        planned = _outbox_partitions_planned(db, statement)
        assert planned, "no partition planned"
        kinds = {name.split("_")[1] for name in planned if name != "outbox_default"}
        assert len(kinds) == 1, planned  # one timeline's partitions only


def test_a_row_older_than_the_recent_read_with_nothing_after_it_goes_at_the_next_tick(
    db: Database,
) -> None:
    """No later commit comes to run more rounds: the poll tick's round (a second after
    the relay went to sleep, so a whole-outbox one) publishes the old row."""
    _relay_all(db, InProcessBus(lambda body: None))
    with _running_relay(db, poll_s=1.0) as received:  # as in production
        first = _emit(db, 1)[0]["id"]
        wait_until(lambda: first in received, 5, "the relay running")
        # Given a row created an hour ago, committed now with its writer's NOTIFY, within
        # a second of the relay's last whole round, and nothing after it
        old = _insert_created(db, utcnow() - timedelta(hours=1))
        with db.engine.begin() as conn:
            conn.execute(sa.text(f"NOTIFY {NOTIFY_CHANNEL}"))
        # Then it is published within a tick and a whole round's period
        wait_until(lambda: old in received, 1.0 + relay_module.FULL_ROUND_S + 1.0, "the old row")


def test_an_old_row_behind_a_burst_that_stops_goes_with_the_next_look_not_a_tick(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row older than the recent read, committed just after a whole round while new
    rows keep the relay busy for most of a second and then stop: the probe-started
    round of the recent rows finds nothing, and the next look reads everything, instead
    of ending the look window and leaving the row to the poll tick (a reviewer's case:
    1.87 s)."""
    _relay_all(db, InProcessBus(lambda body: None))
    whole_rounds: list[float] = []
    real_ran = relay_module.RoundScope.ran

    def ran(self: Any, since: Any, published: int, batch_size: int) -> None:
        if since is None:
            whole_rounds.append(time.monotonic())
        real_ran(self, since, published, batch_size)

    monkeypatch.setattr(relay_module.RoundScope, "ran", ran)
    with _running_relay(db, poll_s=1.0) as received:
        _emit(db, 1)
        time.sleep(1.2)  # asleep; the next round is a whole one (a second since the last)
        seen = len(whole_rounds)
        _emit(db, 1)
        wait_until(lambda: len(whole_rounds) > seen, 5, "a whole round")
        last_whole = whole_rounds[-1]
        # Given an old row committed right after it, and new rows for most of a second
        old = _insert_created(db, utcnow() - timedelta(hours=1))
        committed = time.monotonic()
        while time.monotonic() < last_whole + 0.9:
            _emit(db, 1)
            time.sleep(0.05)
        wait_until(lambda: old in received, 5, "the old row")
    # Then it went out with the burst's last rounds, not a poll tick after them
    assert received[old] - committed < 1.0 + 0.25, received[old] - committed
