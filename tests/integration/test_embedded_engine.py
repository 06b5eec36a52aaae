"""The embedded mode (`settle dev`): in-process bus, StubBroker worker threads.

The same engine code as production, with Dramatiq's in-memory broker and the bus
replaced by a direct call, on one database shared by core and the notifier.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from services.core import outbox
from services.core.relay import start_relay_thread
from services.notifier import webhook_endpoints as endpoint_domain
from services.notifier.context import NotifierContext
from services.notifier.delivery_engine import EmbeddedEngine, EngineSettings, start_embedded
from services.notifier.models import SUCCEEDED, Delivery
from shared import events, signing
from shared.db import Database
from shared.identity import service as identity
from tests.support.pipeline import isolated_database, notifier_config, wait_until
from tests.support.receiver import Answer, Receiver

pytestmark = pytest.mark.integration


class Embedded:
    def __init__(self, db: Database, ctx: NotifierContext, engine: EmbeddedEngine) -> None:
        self.db, self.ctx, self.engine = db, ctx, engine

    def endpoint(self, tenant_id: str, url: str) -> str:
        with self.db.transaction() as session:
            _, secret = endpoint_domain.create_endpoint(
                session,
                self.ctx.secret_box,
                tenant_id,
                name="dev",
                url=url,
                event_types=[events.DEPOSIT_CREDITED],
                allow_private=True,
                max_endpoints=10,
            )
        return secret

    def emit(self, tenant_id: str) -> str:
        with self.db.transaction() as session:
            event = outbox.emit(session, events.DEPOSIT_CREDITED, tenant_id, {"deposit": {}})
        return str(event["id"])


@pytest.fixture
def embedded() -> Iterator[Embedded]:
    # Given core and the notifier on one database of their own, wired as `settle dev` wires
    # them (the sweeper and the relay act on every row they see)
    with isolated_database("embedded") as url:
        db = Database(url)
        engine = start_embedded(
            notifier_config(url, amqp_url=None, worker_threads=4),
            EngineSettings(sweep_interval_s=0.25, sweep_grace_s=1.0),
            db=db,
            identity_db=db,
        )
        stop = threading.Event()
        relay = start_relay_thread(db, lambda: engine.bus, stop, poll_s=5.0)
        try:
            yield Embedded(db, engine.ctx, engine)
        finally:
            stop.set()
            relay.join(10)
            engine.stop()
            db.dispose()


def _tenant(db: Database) -> str:
    with db.transaction() as session:
        tenant, _ = identity.create_tenant(session, "embedded")
        return tenant.id


def test_an_event_is_delivered_signed_in_the_embedded_mode(embedded: Embedded) -> None:
    with Receiver() as rx:
        tenant_id = _tenant(embedded.db)
        secret = embedded.endpoint(tenant_id, rx.url("/hook"))
        # When core commits an event
        event_id = embedded.emit(tenant_id)
        # Then the receiver gets it at once, signed
        assert rx.wait_for(lambda r: len(r.hits("/hook")) >= 1, 5)
        (hit,) = rx.hits("/hook")
        assert hit.headers["x-service-event-id"] == event_id
        signing.verify(secret, hit.headers, hit.body)


def test_retries_run_on_the_in_memory_broker(embedded: Embedded) -> None:
    with Receiver() as rx:
        # Given a receiver failing twice before it answers
        rx.script("/flaky", Answer.fail(500), Answer.fail(502), Answer.ok())
        tenant_id = _tenant(embedded.db)
        embedded.endpoint(tenant_id, rx.url("/flaky"))
        # When an event is emitted
        event_id = embedded.emit(tenant_id)
        # Then the delayed retries run and the delivery succeeds on the third attempt
        assert rx.wait_for(lambda r: len(r.hits("/flaky")) >= 3, 10)

        def succeeded() -> bool:
            with embedded.db.reader() as session:
                rows = session.query(Delivery).filter_by(event_id=event_id).all()
                return [(d.status, d.attempt_count) for d in rows] == [(SUCCEEDED, 3)]

        wait_until(succeeded, 5, "the delivery succeeded after 3 attempts")
