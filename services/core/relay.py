"""The outbox relay: publishes committed outbox rows to the event bus, then marks them.

A row is marked `published_at` only after the bus confirmed it, in the same
transaction that locked it (`FOR UPDATE SKIP LOCKED` on PostgreSQL, so several
relays share the work without publishing a row twice at once). A crash between
the confirm and the commit publishes the row again: at least once, never lost.

The relay wakes the moment an outbox transaction commits: through `LISTEN
settle_outbox`, to which each writing process sends at most one `NOTIFY` per
`outbox_wakeup.MIN_GAP_S` (after the commit, from a thread of its own). Commits
within that gap send none, so after a wake-up or a published row the relay probes
for unpublished rows every `HOT_POLL_S` for `HOT_WINDOW_S` (longer than the gap): a
commit during a burst waits for the relay's next probe (2 ms, plus any round under
way), not for the gap. A commit the window misses (a round that found only rows
another relay holds ends it) is still NOTIFYed at its gap's end. At rest the relay
sleeps on its LISTEN socket; every `poll_s` it probes for unpublished rows (one index
read on that connection) and runs a round only when one waits: the fallback for a
NOTIFY that was lost.

A round reads the whole outbox at least every `FULL_ROUND_S` (and after a failure,
and while a backlog drains); in between, only the rows created in the last
`RECENT_S`, which PostgreSQL reads from the newest partitions alone (RoundScope).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from services.core.config import CoreConfig
from services.core.models import OutboxEvent
from services.core.outbox_wakeup import MIN_GAP_S, OutboxListener
from shared.backoff import Backoff
from shared.bus import BusNames, EventPublisher, OutgoingEvent, PublishError, RabbitPublisher
from shared.db import Database
from shared.metrics import CachedCollector
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

#: Rows published per transaction.
BATCH_SIZE = 500
#: Reconnect backoff while rows wait and the bus is down: first and longest wait.
BACKOFF_FIRST_S = 0.2
BACKOFF_MAX_S = 30.0
#: While events flow, the relay looks this often for rows whose commit sent no NOTIFY
#: (one came from the same process less than MIN_GAP_S before)...
HOT_POLL_S = 0.002
#: ...until this long after its last wake-up or published row. Longer than the gap, so
#: every commit is either NOTIFYed or falls in a window (found HOT_POLL_S later at
#: worst). An isolated event costs the relay HOT_WINDOW_S / HOT_POLL_S looks (30, an
#: index probe each: ~2 ms of CPU in all).
HOT_WINDOW_S = MIN_GAP_S + 0.01
#: How often the relay re-reads the outbox lag for its gauge while busy.
LAG_REFRESH_S = 5.0
#: Between whole-outbox rounds a round reads only the rows created this recently...
RECENT_S = 60.0
#: ...and the whole outbox at least this often (see RoundScope).
FULL_ROUND_S = 1.0

PublisherFactory = Callable[[], EventPublisher]


class RelayMetrics:
    """Counters of the relay process (exposed by the core worker's metrics port)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.published = Counter(
            "settle_outbox_published",
            "Outbox events published to the bus and confirmed",
            registry=registry,
        )
        self.publish_failures = Counter(
            "settle_outbox_publish_failures",
            "Failed publish rounds (the bus was down or refused); rows stayed in the outbox",
            registry=registry,
        )


class OutboxCollector(Collector):
    """Outbox lag read from the database at scrape time, right in any process."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count, lag = outbox_lag(self._db)
        pending = GaugeMetricFamily(
            "settle_outbox_unpublished", "Outbox events not yet confirmed by the bus"
        )
        pending.add_metric([], count)
        lag_gauge = GaugeMetricFamily(
            "settle_outbox_lag_seconds", "Age of the oldest unpublished outbox event (0: none)"
        )
        lag_gauge.add_metric([], lag)
        yield pending
        yield lag_gauge


def outbox_lag(db: Database, now: datetime | None = None) -> tuple[int, float]:
    """(unpublished rows, age in seconds of the oldest one)."""
    with db.reader() as session:
        count, oldest = session.execute(
            sa.select(sa.func.count(), sa.func.min(OutboxEvent.created_at)).where(
                OutboxEvent.published_at.is_(None)
            )
        ).one()
    if not count or oldest is None:
        return 0, 0.0
    return int(count), max(0.0, ((now or utcnow()) - oldest).total_seconds())


def api_metrics_registry(db: Database) -> CollectorRegistry:
    """The registry core's API serves on /metrics: database-derived gauges only."""
    from services.core.deposits.metrics import ChainCollector, DepositCollector

    registry = CollectorRegistry(auto_describe=True)
    for collector in (OutboxCollector(db), ChainCollector(db), DepositCollector(db)):
        registry.register(CachedCollector(collector))
    return registry


class RoundScope:
    """Which rows the relay's next round reads: the whole outbox, or the recent rows.

    The outbox is partitioned by (timeline, created_at), and a round that bounds
    neither plans the partial index of every partition on each round (51 in a year-old
    database: the relay's p50 doubled against a fresh one, docs/PERFORMANCE.md). A
    round of the recent rows reads, per timeline, those created in the last RECENT_S:
    the newest partitions only.

    It leaves nothing behind, and keeps id order wherever there is a backlog: the
    whole outbox is read by the first round, by every round after a failure (a broker
    or database outage's backlog), by every round while one of them fills its batch
    (the backlog drains oldest first), by the round after one of the recent rows that
    found none (what woke the relay may be an older row; the look window is kept open
    for it), and at least every FULL_ROUND_S. A row that is older than RECENT_S by its
    commit (a transaction that ran long, a writer whose clock is behind) is published
    by the next round that finds no recent row, or within FULL_ROUND_S while recent
    rows keep coming; it goes after newer ones, as a late commit always did (the relay
    sees a row only once committed). Hence also: a writer whose clock is more than
    RECENT_S behind the relay's has its rows wait like that.
    """

    def __init__(
        self,
        full_every_s: float = FULL_ROUND_S,
        recent_s: float = RECENT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._full_every_s = full_every_s
        self._recent = timedelta(seconds=recent_s)
        self._clock = clock
        self._last_full = -math.inf
        #: The next round reads everything: the first, after a failure, after a whole
        #: round that filled its batch, after a round of the recent rows that found none.
        self._whole_next = True

    def since(self) -> datetime | None:
        """The oldest created_at the next round reads; None: the whole outbox."""
        if self._whole_next or self._clock() - self._last_full >= self._full_every_s:
            return None
        return utcnow() - self._recent

    def ran(self, since: datetime | None, published: int, batch_size: int) -> None:
        """A round that read from `since` published `published` rows."""
        if since is None:
            self._last_full = self._clock()
            self._whole_next = published >= batch_size  # a backlog drains oldest first
        else:
            # Nothing recent: what woke the relay (a NOTIFY, a probe) may be older.
            self._whole_next = published == 0

    @property
    def whole_round_next(self) -> bool:
        """Whether the next round reads the whole outbox whatever the time."""
        return self._whole_next

    def failed(self) -> None:
        """A round failed: rows may have piled up; read them all, oldest first."""
        self._whole_next = True


def relay_once(
    db: Database,
    publisher: EventPublisher,
    *,
    batch_size: int = BATCH_SIZE,
    metrics: RelayMetrics | None = None,
    since: datetime | None = None,
) -> int:
    """Publish one batch of unpublished rows in id order; return how many were marked.

    `since`: only rows created then or later (RoundScope); None: the whole outbox. On
    a publish failure the rows confirmed so far are still marked, then the
    PublishError propagates; the others stay for the next round.
    """
    with db.transaction() as session:
        rows = _lock_unpublished(session, batch_size, since)
        confirmed, failure = _publish(publisher, rows)
        done = set(confirmed)
        _mark(session, [(r.id, r.timeline, r.created_at) for r in rows if r.id in done])
    return _done(confirmed, failure, metrics)


def _lock_unpublished(
    session: Session, batch_size: int, since: datetime | None
) -> list[sa.Row[Any]]:
    """Up to `batch_size` unpublished rows, lowest ids first, locked (SKIP LOCKED): of
    the whole outbox, or of those created since `since`, read per timeline (PostgreSQL
    prunes created_at only with the timeline fixed: see `_mark_statements`)."""
    rows = [
        row
        for statement in _round_statements(batch_size, since)
        for row in session.execute(statement.with_for_update(skip_locked=True))
    ]
    # Rows past the batch stay locked until the commit, unpublished: the next round's.
    return sorted(rows, key=lambda row: row.id)[:batch_size]


def _round_statements(batch_size: int, since: datetime | None) -> list[sa.Select[Any]]:
    """The reads of a round: the whole outbox, or one per timeline from `since`."""
    if since is None:
        return [_unpublished(batch_size)]
    return [
        _unpublished(batch_size).where(
            OutboxEvent.timeline == timeline, OutboxEvent.created_at >= since
        )
        for timeline in (False, True)
    ]


def _unpublished(batch_size: int) -> sa.Select[Any]:
    return (
        sa.select(
            OutboxEvent.id,
            OutboxEvent.event_id,
            OutboxEvent.event_type,
            OutboxEvent.body,
            OutboxEvent.request_id,
            OutboxEvent.created_at,
            OutboxEvent.timeline,
        )
        .where(OutboxEvent.published_at.is_(None))
        .order_by(OutboxEvent.id)
        .limit(batch_size)
    )


def _publish(
    publisher: EventPublisher, rows: Sequence[sa.Row[Any]]
) -> tuple[list[int], PublishError | None]:
    """Row ids the bus confirmed (a prefix of `rows`), and the failure if not all were."""
    try:
        publisher.publish_batch(
            [
                OutgoingEvent(r.event_id, r.event_type, r.body.encode("utf-8"), r.request_id)
                for r in rows
            ]
        )
    except PublishError as err:
        return [r.id for r in rows[: err.confirmed]], err
    return [r.id for r in rows], None


def _mark_statements(rows: Sequence[tuple[int, bool, datetime]], now: datetime) -> list[sa.Update]:
    """The UPDATEs marking `rows` ((id, timeline, created_at)) published at `now`.

    The outbox is partitioned by (timeline, created_at) and the id names no partition.
    PostgreSQL prunes a range key's second column only when its first is fixed (a bound
    on created_at alone prunes nothing): so one statement per timeline in the batch,
    bounded by its rows' own times, plans only the partitions they are in, instead of
    opening every partition's key index (30 days' and a year's worth).
    """
    statements = []
    for timeline in (False, True):
        ids = [i for i, t, _ in rows if t == timeline]
        if not ids:
            continue
        created = [c for _, t, c in rows if t == timeline]
        statements.append(
            sa.update(OutboxEvent)
            .where(
                OutboxEvent.id.in_(ids),
                OutboxEvent.timeline == timeline,
                OutboxEvent.created_at >= min(created),
                OutboxEvent.created_at <= max(created),
            )
            .values(published_at=now)
            .execution_options(synchronize_session=False)
        )
    return statements


def _mark(session: Session, rows: Sequence[tuple[int, bool, datetime]]) -> None:
    """Mark `rows` ((id, timeline, created_at)) published."""
    for statement in _mark_statements(rows, utcnow()):
        session.execute(statement)


def _done(confirmed: list[int], failure: PublishError | None, metrics: RelayMetrics | None) -> int:
    if metrics is not None and confirmed:
        metrics.published.inc(len(confirmed))
    if failure is not None:
        raise failure
    return len(confirmed)


@contextmanager
def _closing(publisher: EventPublisher) -> Iterator[EventPublisher]:
    try:
        yield publisher
    finally:
        publisher.close()


def run_relay(
    db: Database,
    publisher_factory: PublisherFactory,
    stop: threading.Event,
    *,
    poll_s: float = 1.0,
    batch_size: int = BATCH_SIZE,
    metrics: RelayMetrics | None = None,
) -> None:
    """Relay until `stop`: drain, then sleep until a commit (LISTEN), a poll tick or `stop`
    (after a wake-up or a published row, only a look's while: `HOT_WINDOW_S`)."""
    listener = OutboxListener(db)
    backoff = Backoff(BACKOFF_FIRST_S, BACKOFF_MAX_S)
    scope = RoundScope()
    hot_until = 0.0
    probed = False  # this round was started by a probe that saw an unpublished row
    with _closing(publisher_factory()) as publisher:
        log.info("outbox relay started")
        try:
            while not stop.is_set():
                since = scope.since()
                try:
                    published = relay_once(
                        db, publisher, batch_size=batch_size, metrics=metrics, since=since
                    )
                except PublishError as err:
                    scope.failed()
                    if metrics is not None:
                        metrics.publish_failures.inc()
                    delay = backoff.next()
                    log.warning("outbox relay: %s; retrying in %.1fs", err, delay)
                    stop.wait(delay)
                    continue
                except sa.exc.DBAPIError as err:
                    scope.failed()
                    delay = backoff.next()
                    log.warning("outbox relay: database error %s; retrying in %.1fs", err, delay)
                    stop.wait(delay)
                    continue
                backoff.reset()
                scope.ran(since, published, batch_size)
                if published >= batch_size:
                    continue  # more may wait: drain before sleeping
                if published:
                    hot_until = time.monotonic() + HOT_WINDOW_S
                elif scope.whole_round_next:
                    # Look again soon, with a whole round: the row that woke the relay
                    # may be older than the recent read (a late commit).
                    hot_until = max(hot_until, time.monotonic() + HOT_WINDOW_S)
                elif probed:
                    # The rows the probe saw are another relay's, locked while it
                    # publishes them (SKIP LOCKED): no more looks until a NOTIFY.
                    hot_until = 0.0
                woke = _IDLE
                while woke == _IDLE:
                    woke = _wait(listener, stop, poll_s, hot_until)
                    _keepalive(publisher)
                probed = woke == _PROBED
                if woke == _NOTIFIED:
                    hot_until = time.monotonic() + HOT_WINDOW_S
        finally:
            listener.close()
            log.info("outbox relay stopped")


def _keepalive(publisher: EventPublisher) -> None:
    try:
        publisher.keepalive()
    except Exception:  # a broken connection is reopened by the next publish
        log.warning("outbox relay: keepalive failed; reconnecting", exc_info=True)
        publisher.close()


#: Why `_wait` returned: a NOTIFY, a hot probe that saw a row, a poll tick (or stop)
#: that may have rows, a poll tick whose probe saw none (nothing to relay).
_NOTIFIED, _PROBED, _TICK, _IDLE = "notified", "probed", "tick", "idle"


def _wait(listener: OutboxListener, stop: threading.Event, poll_s: float, hot_until: float) -> str:
    """Until there may be rows to relay: a NOTIFY (`_NOTIFIED`), a probe that saw an
    unpublished row (`_PROBED`), or `stop` (`_TICK`).

    Until `hot_until`, a probe every HOT_POLL_S on the listener's own connection (one
    index read; a relay round's transaction only when a row waits). Then asleep on the
    LISTEN socket, with the same probe every `poll_s` (the fallback for a lost NOTIFY:
    an idle relay costs one index read per tick, not a round's transaction).
    """
    while not stop.is_set():
        hot_for = hot_until - time.monotonic()
        if hot_for <= 0:
            if listener.sleep(stop, poll_s):
                return _NOTIFIED
            if stop.is_set() or listener.rows_wait():
                return _TICK
            return _IDLE
        if listener.wait(min(HOT_POLL_S, hot_for)):
            return _NOTIFIED
        if listener.rows_wait():
            return _PROBED
    return _TICK


def relay_publisher_factory(config: CoreConfig) -> PublisherFactory:
    """Publishers to the RabbitMQ of `config.amqp_url` (CoreConfig), named by SETTLE_AMQP_PREFIX."""
    amqp_url = config.amqp_url
    if not amqp_url:
        raise ValueError("the relay needs an AMQP URL (SETTLE_AMQP_URL)")
    names = BusNames.from_env()

    def factory() -> EventPublisher:
        return RabbitPublisher(amqp_url, names)

    return factory


def start_relay_thread(
    db: Database,
    publisher_factory: PublisherFactory,
    stop: threading.Event,
    *,
    poll_s: float = 1.0,
    metrics: RelayMetrics | None = None,
) -> threading.Thread:
    """`run_relay` in a daemon thread (the embedded mode and tests)."""
    thread = threading.Thread(
        target=run_relay,
        args=(db, publisher_factory, stop),
        kwargs={"poll_s": poll_s, "metrics": metrics},
        name="outbox-relay",
        daemon=True,
    )
    thread.start()
    return thread
