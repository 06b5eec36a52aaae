"""Ordered delivery per deposit account (`ordering: per_account`): an account's events
reach the endpoint one at a time in commit order, other accounts' flow meanwhile, a
failing delivery holds only its account's later ones (and says which holds them), and
an event that arrives before an earlier one of its account waits for it (bounded).

The engine runs embedded (the production code, Dramatiq's in-memory broker) on a
database of its own; the store-level checks run on the shared test database.
(tests/e2e/test_faults.py kills the worker mid-delivery on an ordered endpoint.)
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from services.core import outbox
from services.core.relay import start_relay_thread
from services.notifier import deliveries, ordering
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.consumer import store_events
from services.notifier.delivery_engine import EmbeddedEngine, EngineSettings, start_embedded
from services.notifier.delivery_store import EVENT_GONE, DeliveryStore
from services.notifier.models import FAILED, PER_ACCOUNT, SUCCEEDED, Delivery, Endpoint
from services.notifier.secrets import SecretBox
from services.notifier.sweeper import due_deliveries
from shared import events
from shared.db import Database
from shared.identity import service as identity
from shared.timefmt import utcnow
from tests.support.pipeline import isolated_database, notifier_config, wait_until
from tests.support.receiver import Answer, Hit, Receiver

pytestmark = pytest.mark.integration


def _data(account: str) -> dict[str, Any]:
    return {"deposit": {"id": f"dep_{uuid.uuid4().hex[:12]}", "accountId": account}}


class Ordered:
    def __init__(self, db: Database, engine: EmbeddedEngine) -> None:
        self.db, self.engine = db, engine
        with db.transaction() as session:
            tenant, _ = identity.create_tenant(session, "ordered")
            self.tenant_id = tenant.id

    def endpoint(self, url: str, ordered: bool = True) -> str:
        with self.db.transaction() as session:
            endpoint, _ = endpoint_domain.create_endpoint(
                session,
                self.engine.ctx.secret_box,
                self.tenant_id,
                name="ordered",
                url=url,
                event_types=[events.DEPOSIT_CREDIT_SUBMITTED],
                allow_private=True,
                max_endpoints=10,
                ordering=PER_ACCOUNT if ordered else None,
            )
            return endpoint.id

    def emit(self, account: str, event_id: str | None = None) -> str:
        with self.db.transaction() as session:
            event = outbox.emit(
                session,
                events.DEPOSIT_CREDIT_SUBMITTED,
                self.tenant_id,
                _data(account),
                event_id=event_id,
            )
        return str(event["id"])

    def deliveries(self) -> dict[str, Delivery]:
        """The tenant's deliveries by event id."""
        with self.db.reader() as session:
            rows = session.scalars(sa.select(Delivery).where(Delivery.tenant_id == self.tenant_id))
            found = {d.event_id: d for d in rows}
            session.expunge_all()
            return found


@pytest.fixture
def ordered() -> Iterator[Ordered]:
    with isolated_database("ordered") as url:
        db = Database(url)
        engine = start_embedded(
            notifier_config(
                url,
                amqp_url=None,
                worker_threads=4,
                webhook_timeout_s=5.0,
                per_endpoint_concurrency=4,
                retry_schedule=(0.3, 0.3, 0.3),
            ),
            EngineSettings(sweep_interval_s=0.25, sweep_grace_s=1.0),
            db=db,
            identity_db=db,
        )
        stop = threading.Event()
        relay = start_relay_thread(db, lambda: engine.bus, stop, poll_s=5.0)
        try:
            yield Ordered(db, engine)
        finally:
            stop.set()
            relay.join(10)
            engine.stop()
            db.dispose()


def _event_id(hit: Hit) -> str:
    return str(json.loads(hit.body)["id"])


def test_an_accounts_events_wait_their_turn_while_another_accounts_flow(
    ordered: Ordered,
) -> None:
    with Receiver() as rx:
        # Given an ordered endpoint whose first request takes 2.5 s to answer (long
        # enough for another account's events to pass on a loaded machine)
        rx.script("/in-order", Answer.hang(2.5), Answer.ok())
        ordered.endpoint(rx.url("/in-order"))
        # When account A's first event is in flight
        a1 = ordered.emit("acc_A")
        assert rx.wait_for(lambda r: len(r.hits("/in-order")) >= 1, 10)
        # And A's next two and account B's two are committed meanwhile
        a2, a3 = ordered.emit("acc_A"), ordered.emit("acc_A")
        b1, b2 = ordered.emit("acc_B"), ordered.emit("acc_B")
        assert rx.wait_for(lambda r: len(r.hits("/in-order")) >= 5, 15)
        hits = rx.hits("/in-order")
        by_event = {_event_id(h): h for h in hits}
        # Then A's arrive in commit order, each once
        assert [_event_id(h) for h in hits if _event_id(h) in (a1, a2, a3)] == [a1, a2, a3]
        assert len(hits) == 5
        # And B's arrived while A's first was still unanswered: the two interleave
        a1_answered = by_event[a1].received_at + 2.5
        assert by_event[b1].received_at < a1_answered
        assert by_event[b2].received_at < a1_answered
        # And A's second only after its first was answered (one in flight per account)
        assert by_event[a2].received_at >= a1_answered - 0.05
    wait_until(
        lambda: all(d.status == SUCCEEDED for d in ordered.deliveries().values()),
        5,
        "every delivery succeeded",
    )


def test_a_failing_delivery_holds_only_its_accounts_later_events_and_says_so(
    ordered: Ordered,
) -> None:
    with Receiver() as rx:
        # Given an ordered endpoint that fails account A's first event three times
        a1 = events.new_event_id()
        rx.script(
            "/flaky", Answer.fail(503), Answer.fail(503), Answer.fail(503), Answer.ok(), event_id=a1
        )
        ordered.endpoint(rx.url("/flaky"))
        ordered.emit("acc_A", event_id=a1)
        assert rx.wait_for(lambda r: len(r.hits("/flaky")) >= 1, 10)
        # When A's next event and B's come while A's first waits for its retry
        a2 = ordered.emit("acc_A")
        b1 = ordered.emit("acc_B")
        # Then B's goes through, A's second waits: the delivery list says for which
        assert rx.wait_for(lambda r: b1 in {_event_id(h) for h in r.hits("/flaky")}, 10)
        made = ordered.deliveries()
        with ordered.db.reader() as session:
            holders = deliveries.holders(session, list(made.values()))
        if made[a1].status != SUCCEEDED:  # (it may have got through meanwhile)
            assert made[a2].status != SUCCEEDED
            assert holders == {made[a2].id: made[a1].id}
        # And A's second comes only after A's first got through, on its fourth try
        assert rx.wait_for(lambda r: len(r.hits("/flaky")) >= 6, 15)
        order = [_event_id(h) for h in rx.hits("/flaky")]
        assert order.count(a1) == 4 and order.count(a2) == 1 and order.count(b1) == 1
        assert order.index(a2) > max(i for i, e in enumerate(order) if e == a1)
        assert order.index(b1) < max(i for i, e in enumerate(order) if e == a1)


def test_an_unordered_endpoint_is_not_held(ordered: Ordered) -> None:
    with Receiver() as rx:
        # Given an endpoint without ordering whose first request takes 2.5 s
        rx.script("/any", Answer.hang(2.5), Answer.ok())
        ordered.endpoint(rx.url("/any"), ordered=False)
        a1 = ordered.emit("acc_A")
        assert rx.wait_for(lambda r: len(r.hits("/any")) >= 1, 10)
        a2 = ordered.emit("acc_A")
        # Then the account's second event does not wait for the first
        assert rx.wait_for(lambda r: len(r.hits("/any")) >= 2, 10)
        by_event = {_event_id(h): h for h in rx.hits("/any")}
        assert by_event[a2].received_at < by_event[a1].received_at + 2.5


# -- the claim itself, on the shared database -------------------------------------------


def _new_tenants_endpoint(
    pg_db: Database, *, ordering: str | None = PER_ACCOUNT
) -> tuple[str, str, Endpoint]:
    """A new tenant's endpoint for deposit events (ordered per account by default), and
    an account of its."""
    tenant_id = str(uuid.uuid4())
    with pg_db.transaction() as session:
        endpoint, _ = endpoint_domain.create_endpoint(
            session,
            SecretBox("ordered-test-key"),
            tenant_id,
            name="ordered",
            url="https://hooks.example.com/ordered",
            event_types=[events.DEPOSIT_CREDIT_SUBMITTED],
            allow_private=False,
            max_endpoints=10,
            ordering=ordering,
        )
    return tenant_id, f"acc_{uuid.uuid4().hex[:20]}", endpoint


def _envelope(tenant_id: str, account: str, sequence: int) -> bytes:
    envelope = events.envelope(
        events.DEPOSIT_CREDIT_SUBMITTED, tenant_id, _data(account), sequence=sequence
    )
    return events.encode(envelope)


def test_an_event_that_overtook_an_earlier_one_waits_for_it_bounded(pg_db: Database) -> None:
    tenant_id, account, endpoint = _new_tenants_endpoint(pg_db)
    store = DeliveryStore(pg_db)
    # Given the account's events 1 and 3 stored (1's delivery done), 2 not yet arrived
    first, third = store_events(
        pg_db, [_envelope(tenant_id, account, 1), _envelope(tenant_id, account, 3)]
    )
    with pg_db.transaction() as session:
        session.execute(
            sa.update(Delivery)
            .where(Delivery.id == first.delivery_ids[0])
            .values(status=SUCCEEDED, next_attempt_at=None)
        )
    (waiting,) = third.delivery_ids
    now = utcnow()

    def claim(gap_cutoff_s: float) -> bool:
        with store.connection() as conn:
            got = store.claim(
                conn,
                waiting,
                now=now,
                lease=now + timedelta(seconds=30),
                due_by=now + timedelta(seconds=1),
                gap_cutoff=now - timedelta(seconds=gap_cutoff_s),
            )
            if got is not None:  # let go again
                store.put_back(conn, got, now)
            return got is not None

    # Then 3 waits for 2 (received just now, within the wait)
    assert not claim(gap_cutoff_s=60)
    # And goes once 2 has arrived (its delivery, 2's, must go first: 3 is held by it)
    (second,) = store_events(pg_db, [_envelope(tenant_id, account, 2)])
    assert not claim(gap_cutoff_s=60)
    with pg_db.reader() as session:
        held = {
            d.id: d
            for d in session.scalars(sa.select(Delivery).where(Delivery.endpoint_id == endpoint.id))
        }
        assert deliveries.holders(session, list(held.values())) == {waiting: second.delivery_ids[0]}
    # And the sweeper leaves 3 to 2's end (it is held), but not 2
    swept = {d for d, _, _ in due_deliveries(pg_db, grace_s=-60, batch=10_000)}
    assert second.delivery_ids[0] in swept and waiting not in swept
    with pg_db.transaction() as session:
        session.execute(
            sa.update(Delivery)
            .where(Delivery.id == second.delivery_ids[0])
            .values(status=SUCCEEDED, next_attempt_at=None)
        )
    assert claim(gap_cutoff_s=60)


def test_a_missing_earlier_event_holds_its_successor_only_for_the_gap_wait(
    pg_db: Database,
) -> None:
    tenant_id, account, _ = _new_tenants_endpoint(pg_db)
    # Given an event numbered 5 whose 1..4 never arrive (from before this database)
    (late,) = store_events(pg_db, [_envelope(tenant_id, account, 5)])
    store = DeliveryStore(pg_db)
    now = utcnow()
    with store.connection() as conn:
        args = {
            "now": now,
            "lease": now + timedelta(seconds=30),
            "due_by": now + timedelta(seconds=1),
        }
        # Then it waits while its event is younger than the gap wait...
        assert (
            store.claim(conn, late.delivery_ids[0], **args, gap_cutoff=now - timedelta(seconds=60))
            is None
        )
        # ...and goes once it is older
        assert (
            store.claim(conn, late.delivery_ids[0], **args, gap_cutoff=now + timedelta(seconds=1))
            is not None
        )
    assert ordering.GAP_WINDOW >= 4


def _claim_due_now() -> dict[str, Any]:
    """Claim arguments: due now, no gap wait left."""
    now = utcnow()
    return {
        "now": now,
        "lease": now + timedelta(seconds=30),
        "due_by": now + timedelta(seconds=1),
        "gap_cutoff": now + timedelta(seconds=1),
    }


def _forget_event_of(pg_db: Database, delivery_id: str, *tables: str) -> None:
    """Delete the delivery's event from `tables`, as retention does."""
    with pg_db.transaction() as session:
        for table in tables:
            session.execute(
                sa.text(
                    f"DELETE FROM {table} WHERE id ="  # noqa: S608 (a name of this file's)
                    " (SELECT event_id FROM webhook_deliveries WHERE id = :id)"
                ),
                {"id": delivery_id},
            )


@pytest.mark.parametrize("order", [PER_ACCOUNT, None])
def test_a_claim_whose_event_is_gone_ends_it_failed_with_no_attempt_number(
    pg_db: Database, order: str | None
) -> None:
    tenant_id, account, _ = _new_tenants_endpoint(pg_db, ordering=order)
    (stored,) = store_events(pg_db, [_envelope(tenant_id, account, 1)])
    (delivery_id,) = stored.delivery_ids
    # Given its event's partition dropped, its id row not yet pruned (retention deletes
    # the id rows after the drop, in batches; a drop kept back leaves them an hour)
    _forget_event_of(pg_db, delivery_id, "notifier_events")
    store = DeliveryStore(pg_db)
    # When a worker tries to claim it
    with store.connection() as conn:
        got = store.claim(conn, delivery_id, **_claim_due_now())
    # Then nothing is sent, no attempt is counted (attemptCount: attempts started) and
    # the delivery ends: nothing can ever be sent for it
    assert got is None
    with pg_db.reader() as session:
        row = session.get_one(Delivery, delivery_id)
        assert (row.attempt_count, row.status, row.last_error) == (0, FAILED, EVENT_GONE)


def test_an_ordered_delivery_whose_event_is_gone_ends_and_lets_its_account_go_on(
    pg_db: Database,
) -> None:
    tenant_id, account, _ = _new_tenants_endpoint(pg_db)
    first, second = store_events(
        pg_db, [_envelope(tenant_id, account, 1), _envelope(tenant_id, account, 2)]
    )
    # Given the first event gone whole, its id row pruned too (a replayed old event's,
    # or equal retentions)
    _forget_event_of(pg_db, first.delivery_ids[0], "notifier_events", "notifier_event_ids")
    store = DeliveryStore(pg_db)
    args = _claim_due_now()
    with store.connection() as conn:
        # When a worker tries the first: it ends, failed, with no attempt...
        assert store.claim(conn, first.delivery_ids[0], **args) is None
        # ...and the account's next is no longer held behind it
        assert store.claim(conn, second.delivery_ids[0], **args) is not None
    with pg_db.reader() as session:
        row = session.get_one(Delivery, first.delivery_ids[0])
        assert (row.attempt_count, row.status, row.last_error) == (0, FAILED, EVENT_GONE)
