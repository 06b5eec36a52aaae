"""A delivery job says when its event was stored, so the claim reads the body with the lease.

The consumer's jobs and the worker's own (retries, put-backs) carry the event's
received_at (`event_at`): it names the one partition of `notifier_events` the body is
in, so the claim's statement reads it and an attempt costs two round trips, not three
(docs/PERFORMANCE.md). It is only a hint: a job without it, or with a wrong one, still
sends the event's own body, at the price of the third round trip.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from services.core import outbox
from services.core.relay import start_relay_thread
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.consumer import event_times, store_events
from services.notifier.delivery_engine import EmbeddedEngine, EngineSettings, start_embedded
from services.notifier.delivery_store import Claim, DeliveryStore
from services.notifier.models import PENDING, SUCCEEDED, Delivery, StoredEvent
from services.notifier.secrets import SecretBox
from shared import events
from shared.db import Database
from shared.identity import service as identity
from shared.timefmt import utcnow
from tests.support.pipeline import isolated_database, notifier_config, wait_until
from tests.support.receiver import Answer, Receiver

pytestmark = pytest.mark.integration


class CountingConnection:
    """A psycopg connection that counts the statements sent through it (and sends them)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements = 0

    def execute(self, query: Any, params: Any = None) -> Any:
        self.statements += 1
        return self.conn.execute(query, params)


def _stored_event(pg_db: Database) -> tuple[str, str, datetime]:
    """A new tenant's endpoint and one event stored for it: (delivery id, body, received_at)."""
    tenant_id = str(uuid.uuid4())
    with pg_db.transaction() as session:
        endpoint_domain.create_endpoint(
            session,
            SecretBox("hint-test-key"),
            tenant_id,
            name="hint",
            url="https://hooks.example.com/hint",
            event_types=[events.DEPOSIT_CREDITED],
            allow_private=False,
            max_endpoints=10,
        )
    envelope = events.envelope(events.DEPOSIT_CREDITED, tenant_id, {"n": 1})
    body = events.encode(envelope)
    (handled,) = store_events(pg_db, [body])
    (delivery_id,) = handled.delivery_ids
    with pg_db.reader() as session:
        received_at = session.scalar(
            sa.select(StoredEvent.received_at).where(StoredEvent.id == envelope["id"])
        )
    assert received_at is not None
    # The consumer hands the job exactly the time the event was stored with
    assert event_times([handled]) == {delivery_id: received_at}
    return delivery_id, body.decode(), received_at


def _claim(pg_db: Database, delivery_id: str, event_at: datetime | None) -> tuple[Claim, int]:
    store = DeliveryStore(pg_db)
    now = utcnow()
    with store.connection() as conn:
        counting = CountingConnection(conn)
        claim = store.claim(
            counting,  # type: ignore[arg-type]
            delivery_id,
            now=now,
            lease=now + timedelta(seconds=30),
            due_by=now + timedelta(seconds=1),
            gap_cutoff=now,
            event_at=event_at,
        )
    assert claim is not None
    return claim, counting.statements


def test_a_job_that_says_when_the_event_was_stored_claims_it_with_its_body_in_one_statement(
    pg_db: Database,
) -> None:
    delivery_id, body, received_at = _stored_event(pg_db)
    claim, statements = _claim(pg_db, delivery_id, received_at)
    assert claim.event_body == body
    assert statements == 1
    # And the claim knows it, for the delivery's later jobs
    assert claim.event_received_at == received_at


@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param(None, id="no time"),
        pytest.param(timedelta(milliseconds=1), id="a millisecond off"),
        pytest.param(timedelta(days=-2), id="another day's partition"),
        pytest.param(timedelta(days=400), id="no partition at all"),
    ],
)
def test_a_job_with_no_or_a_wrong_event_time_still_sends_the_events_own_body(
    pg_db: Database, wrong: timedelta | None
) -> None:
    delivery_id, body, received_at = _stored_event(pg_db)
    claim, statements = _claim(pg_db, delivery_id, None if wrong is None else received_at + wrong)
    # The body is the event's, read in a round trip of its own; the delivery is taken
    # (attempt 1), not failed for want of its event
    assert claim.event_body == body
    assert (claim.attempt_number, statements) == (1, 2)
    with pg_db.reader() as session:
        assert session.get_one(Delivery, delivery_id).status == PENDING


@pytest.fixture
def engine() -> Iterator[tuple[Database, EmbeddedEngine]]:
    with isolated_database("event_hint") as url:
        db = Database(url)
        embedded = start_embedded(
            notifier_config(url, amqp_url=None, worker_threads=2, retry_schedule=(0.2, 0.2)),
            EngineSettings(sweep_interval_s=60.0, sweep_grace_s=60.0),
            db=db,
            identity_db=db,
        )
        stop = threading.Event()
        relay = start_relay_thread(db, lambda: embedded.bus, stop, poll_s=5.0)
        try:
            yield db, embedded
        finally:
            stop.set()
            relay.join(10)
            embedded.stop()
            db.dispose()


def test_first_attempts_and_retries_reach_the_claim_with_the_events_time(
    engine: tuple[Database, EmbeddedEngine],
) -> None:
    db, embedded = engine
    store = embedded.engine.deliverer.store
    given: list[tuple[str, datetime | None]] = []
    claim = store.claim

    def noting_claim(conn: Any, delivery_id: str, **kwargs: Any) -> Claim | None:
        given.append((delivery_id, kwargs.get("event_at")))
        return claim(conn, delivery_id, **kwargs)

    store.claim = noting_claim  # type: ignore[method-assign]
    with Receiver() as rx:
        # Given an endpoint that fails the first attempt (a retry follows)
        rx.script("/hook", Answer.fail(503), Answer.ok())
        with db.transaction() as session:
            tenant, _ = identity.create_tenant(session, "hint")
            endpoint_domain.create_endpoint(
                session,
                embedded.ctx.secret_box,
                tenant.id,
                name="hint",
                url=rx.url("/hook"),
                event_types=[events.DEPOSIT_CREDITED],
                allow_private=True,
                max_endpoints=10,
            )
        # When an event goes through core's outbox, the notifier and the worker
        with db.transaction() as session:
            event_id = outbox.emit(session, events.DEPOSIT_CREDITED, tenant.id, {"n": 1})["id"]

        def succeeded() -> bool:
            with db.reader() as session:
                status = session.scalar(
                    sa.select(Delivery.status).where(Delivery.event_id == event_id)
                )
                return bool(status == SUCCEEDED)

        wait_until(succeeded, 15, "the delivery succeeded after one retry")
    with db.reader() as session:
        received_at = session.scalar(
            sa.select(StoredEvent.received_at).where(StoredEvent.id == event_id)
        )
    # Then both jobs, the consumer's and the worker's retry, named where the event is
    assert len(given) == 2
    assert [at for _, at in given] == [received_at, received_at]
