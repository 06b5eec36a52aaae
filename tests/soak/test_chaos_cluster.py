"""Chaos: a three-node RabbitMQ cluster loses a node, PostgreSQL fails over to its
standby, the node comes back, all under a steady stream of deposit events to several
tenants' endpoints. Nothing is lost.

The parts, all on 127.0.0.1 (tests/support/rabbit_cluster.py, pg_cluster.py): three
`rabbitmq-server` nodes clustered, a PostgreSQL primary with a synchronous streaming
standby; Settle's relay, consumer, Dramatiq workers and sweeper (threads of this
process, as tests/support/pipeline.py runs them) with SETTLE_AMQP_URL naming every
node and the database URL both servers (target_session_attrs=read-write). Every
process starts on node 0, the node that is stopped.

Done when every event whose commit was acknowledged reached every subscribed endpoint
(at least once: a repeat carries the same event id), each durable deposit event is in
the outbox once and fanned out once per endpoint, the stream moved on after each
switch while node 0 was down (an event committed after the switch reached its endpoint
before node 0 came back), and the time each switch cost is printed. Bounded: a few
minutes, most of it Erlang booting.

For a failure: `--log-file=F --log-file-level=INFO` keeps every thread's log lines, and
SETTLE_TEST_RABBIT_LOGS=<folder> the RabbitMQ nodes' logs (tests/support/rabbit_cluster.py).
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest
import sqlalchemy as sa

from services.core import outbox
from services.core.models import OutboxEvent
from services.notifier.models import Delivery
from shared import components, events, failover, migrate
from shared.bus import RabbitPublisher
from shared.db import Database
from tests.conftest import make_tenant
from tests.support.pg_cluster import PgCluster
from tests.support.pipeline import running_pipeline, wait_until
from tests.support.rabbit_cluster import RabbitCluster
from tests.support.receiver import Receiver

pytestmark = pytest.mark.soak

TENANTS = 3
ENDPOINTS_PER_TENANT = 2
#: Events a second, over all tenants.
RATE = 20
#: Seconds of steady traffic before and after each switch.
PHASE_S = 6.0
#: At most this long for the stream to move on after a switch, before the next one.
MOVE_ON_S = 60.0
#: Longest wait for the last deliveries once the traffic stops.
DRAIN_S = 120


@dataclass
class Emitter:
    """Commits deposit events at a steady rate; keeps the ids whose commit returned."""

    db: Database
    tenants: list[str]
    acked: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> tenant, when
    attempted: set[str] = field(default_factory=set)
    slowest: list[tuple[float, float]] = field(default_factory=list)  # (started, seconds)
    stop: threading.Event = field(default_factory=threading.Event)
    failed: list[str] = field(default_factory=list)

    def run(self) -> None:
        n = 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            tenant = self.tenants[n % len(self.tenants)]
            deposit_id = f"dep_{uuid.uuid4().hex[:12]}"
            event_id = events.durable_event_id(deposit_id, "credited")
            self.attempted.add(event_id)
            started = time.monotonic()
            try:
                failover.retry_idempotent(
                    functools.partial(self._emit, tenant, deposit_id, event_id),
                    what="emit",
                    retry_for_s=60,
                )
                self.acked[event_id] = (tenant, time.time())
            except Exception as err:  # not acknowledged: the test expects nothing of it
                self.failed.append(repr(err))
            self.slowest.append((started, time.monotonic() - started))
            n += 1
            next_at += 1 / RATE
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def _emit(self, tenant: str, deposit_id: str, event_id: str) -> None:
        data = {"deposit": {"id": deposit_id, "amount": "1.00", "status": "credited"}}
        try:
            with self.db.transaction() as session:
                outbox.emit(session, events.DEPOSIT_CREDITED, tenant, data, event_id=event_id)
        except sa.exc.IntegrityError:
            pass  # a try whose answer the failover cut had committed it: emitted once


def _largest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch in [start, end] with no delivery received."""
    inside = sorted(t for t in times if start <= t <= end)
    points = [start, *inside, end]
    return max(b - a for a, b in itertools.pairwise(points))


@pytest.mark.timeout(480)  # three Erlang boots and a rejoin on a busy machine
def test_a_node_loss_and_a_database_failover_lose_nothing() -> None:
    with RabbitCluster(3) as rabbit, PgCluster() as pg, Receiver() as rx:
        url = pg.create_database("settle_chaos")
        for component in (components.IDENTITY, components.CORE, components.NOTIFIER):
            migrate.upgrade(component, url)
        amqp_url = rabbit.url()
        with running_pipeline(
            url,
            amqp_url=amqp_url,
            publisher_factory=lambda names: RabbitPublisher(amqp_url, names),
            worker_threads=8,
        ) as pipeline:
            endpoints: dict[str, list[str]] = {}
            for t in range(TENANTS):
                tenant_id = make_tenant(pipeline.db).tenant_id
                endpoints[tenant_id] = []
                for e in range(ENDPOINTS_PER_TENANT):
                    path = f"/t{t}/e{e}"
                    pipeline.endpoint(tenant_id, rx.url(path), [events.DEPOSIT_CREDITED])
                    endpoints[tenant_id].append(path)
            emitter = Emitter(pipeline.db, list(endpoints))
            thread = threading.Thread(target=emitter.run, daemon=True)
            thread.start()
            switches: dict[str, tuple[float, float]] = {}  # name -> (wall time, seconds)

            def moved_on(since: float) -> bool:
                """An event committed after `since` reached an endpoint."""
                late = {i for i, (_, at) in dict(emitter.acked).items() if at > since}
                return any(json.loads(hit.body)["id"] in late for hit in rx.hits())

            try:
                time.sleep(PHASE_S)
                at = time.time()
                took = rabbit.stop(0)
                switches["RabbitMQ node 0 stopped"] = (at, took)
                time.sleep(PHASE_S)
                # The stream must move on without node 0 (a bounded wait, not a timing:
                # on a busy machine the reconnection may take longer than a phase). From
                # the switch's end: events committed while the node stops (seconds) may
                # still go through it.
                wait_until(lambda: moved_on(at + took), MOVE_ON_S, "deliveries without node 0")
                at = time.time()
                promoted = pg.promote_standby()
                stopped = pg.stop("primary")
                switches["PostgreSQL standby promoted, old primary stopped"] = (
                    at,
                    promoted + stopped,
                )
                time.sleep(PHASE_S)
                wait_until(
                    lambda: moved_on(at + promoted + stopped),
                    MOVE_ON_S,
                    "deliveries on the promoted database with node 0 down",
                )
                at = time.time()
                switches["RabbitMQ node 0 back"] = (at, rabbit.start(0))
                assert len(rabbit.running_nodes(1)) == 3
                time.sleep(PHASE_S)
            finally:
                emitter.stop.set()
                thread.join(90)
            acked = dict(emitter.acked)
            assert len(acked) > RATE * PHASE_S, "the stream did not flow"

            def received() -> list[tuple[str, str, float]]:
                return [
                    (json.loads(hit.body)["id"], hit.path, hit.received_at) for hit in rx.hits()
                ]

            def missing() -> set[tuple[str, str]]:
                got = {(event_id, path) for event_id, path, _ in received()}
                return {
                    (event_id, path)
                    for event_id, (tenant, _) in acked.items()
                    for path in endpoints[tenant]
                    if (event_id, path) not in got
                }

            drain_started = time.monotonic()
            wait_until(lambda: not missing(), DRAIN_S, "every event at every endpoint")
            drained_s = time.monotonic() - drain_started
            hits = received()
            # None lost; repeats only of events that were sent (the same id)
            assert missing() == set()
            assert {event_id for event_id, _, _ in hits} <= emitter.attempted
            pairs = Counter((event_id, path) for event_id, path, _ in hits)
            repeats = sum(count - 1 for count in pairs.values())
            # Each durable event once in the outbox, and one delivery per endpoint
            with pipeline.db.reader() as session:
                outbox_twice = session.execute(
                    sa.select(OutboxEvent.event_id)
                    .group_by(OutboxEvent.event_id)
                    .having(sa.func.count() > 1)
                ).all()
                deliveries_twice = session.execute(
                    sa.select(Delivery.event_id, Delivery.endpoint_id)
                    .group_by(Delivery.event_id, Delivery.endpoint_id)
                    .having(sa.func.count() > 1)
                ).all()
                in_outbox = session.scalar(sa.select(sa.func.count()).select_from(OutboxEvent))
            assert outbox_twice == [] and deliveries_twice == []
            assert in_outbox is not None and in_outbox >= len(acked)
            # And the stream moved on while node 0 was down: events committed after
            # each switch were delivered before node 0 came back (through the other
            # nodes, and on the promoted database)
            (rabbit_at, rabbit_s), (pg_at, pg_s), (back_at, _) = switches.values()
            first_seen = {}
            for event_id, _, received_at in sorted(hits, key=lambda hit: hit[2]):
                first_seen.setdefault(event_id, received_at)
            resumed = []  # seconds from a switch's end to the first later event's receipt
            for since, until in ((rabbit_at + rabbit_s, pg_at), (pg_at + pg_s, back_at)):
                committed = [i for i, (_, at) in acked.items() if since < at < until]
                assert committed, f"nothing committed between {since} and {until}"
                first = min(first_seen[i] for i in committed)
                assert first < back_at, "the stream waited for node 0"
                resumed.append(first - since)
            times = [received_at for _, _, received_at in hits]
            lines = [
                f"chaos: {len(acked)} events committed, {len(acked) * ENDPOINTS_PER_TENANT} "
                f"deliveries due, lost 0, repeats {repeats} (same event id), outbox rows "
                f"twice 0, deliveries twice 0; last delivery {drained_s:.1f} s after the "
                "traffic stopped; the first event committed after the node's stop reached "
                f"its endpoint {resumed[0]:.1f} s after it, after the failover "
                f"{resumed[1]:.1f} s after it (node 0 still down)"
            ]
            for name, (at, took) in switches.items():
                # From the switch's start to a while after it returned (a node's stop
                # drops its connections somewhere inside the call)
                gap = _largest_gap(times, at, at + took + 2 * PHASE_S / 3)
                commit = max(
                    (s for started, s in emitter.slowest if abs(started - _mono(at)) < 5),
                    default=0.0,
                )
                lines.append(
                    f"  {name}: the switch took {took:.1f} s; longest pause in deliveries "
                    f"{gap:.1f} s; slowest commit {commit:.2f} s"
                )
            print("\n" + "\n".join(lines))


def _mono(wall: float) -> float:
    """A wall-clock time as time.monotonic() reads it (for the emitter's timings)."""
    return time.monotonic() - (time.time() - wall)
