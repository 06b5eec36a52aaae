"""One request id from the ingress to every delivery attempt it caused (issue 13, item 2).

Core's API (in-process) on the pipeline's database, the relay, RabbitMQ, the
consumer and a worker (tests/support/pipeline.py), a real receiver on 127.0.0.1. A
request sent with `X-Request-Id` creates an account; its `deposit.account.created`
event carries the id in the outbox row, on the bus (AMQP `correlation_id`), in the
notifier's stored event, and on the log line of each delivery attempt, so a JSON log
search for the id finds the request and every webhook it set off.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from services.core.app import create_app
from services.core.context import CoreContext
from services.core.models import OutboxEvent
from services.notifier.models import StoredEvent
from shared import events, logs
from tests.conftest import core_config, make_tenant
from tests.integration.conftest import destination
from tests.support.pipeline import Pipeline, isolated_database, running_pipeline, wait_until
from tests.support.receiver import Receiver
from tests.support.services import require_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    require_service("RabbitMQ", "127.0.0.1", 5672)
    with isolated_database("trail") as url, running_pipeline(url) as running:
        yield running


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """What production logging writes (JSON lines), captured."""
    stream = io.StringIO()
    logs.configure("production", stream=stream)
    yield stream
    logs.unconfigure()


def test_the_request_id_reaches_the_outbox_the_bus_the_stored_event_and_each_attempt(
    pipeline: Pipeline, tmp_path: Path, json_log: io.StringIO
) -> None:
    db = pipeline.db
    core = create_app(
        context=CoreContext.build(core_config(db.url, tmp_path), db=db, identity_db=db)
    ).test_client()
    tenant = make_tenant(db)
    with Receiver() as rx:
        pipeline.endpoint(tenant.tenant_id, rx.url("/trail"), [events.ACCOUNT_CREATED])
        rid = f"req_trail-{uuid.uuid4().hex[:12]}"

        # When a request that came through the ingress with an id creates an account
        created = core.post(
            "/v1/deposit-accounts",
            json={"externalUserId": "trail-user", "destination": destination()},
            headers={**tenant.headers, "X-Request-Id": rid},
        )
        assert created.status_code == 200, created.get_json()
        assert created.headers["X-Request-Id"] == rid

        # Then its event's outbox row holds the id
        with db.reader() as session:
            row = session.execute(
                sa.select(OutboxEvent.event_id, OutboxEvent.request_id).where(
                    OutboxEvent.tenant_id == tenant.tenant_id
                )
            ).one()
        assert row.request_id == rid

        # And the notifier stored it with the event it received over RabbitMQ
        def stored() -> str | None:
            with db.reader() as session:
                return session.scalar(
                    sa.select(StoredEvent.request_id).where(StoredEvent.id == row.event_id)
                )

        assert wait_until(stored, 15, "the stored event") == rid

        # And the delivery attempt's JSON log line carries it
        assert rx.wait_for(lambda r: len(r.hits("/trail")) >= 1, 15)

        def attempt_lines() -> list[dict[str, Any]]:
            lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
            return [
                line
                for line in lines
                if row.event_id in line["message"] and "attempt" in line["message"]
            ]

        lines = wait_until(attempt_lines, 5, "the attempt's log line")
        assert [line.get("requestId") for line in lines] == [rid] * len(lines)


def test_events_not_caused_by_a_request_carry_no_id(pipeline: Pipeline) -> None:
    # Given an event the worker emits on its own (no request running)
    tenant = make_tenant(pipeline.db)
    envelope = pipeline.emit(tenant.tenant_id, events.ACCOUNT_CREATED, {"depositAccount": {}})
    # Then the outbox row and the stored event have no request id
    with pipeline.db.reader() as session:
        assert (
            session.scalar(
                sa.select(OutboxEvent.request_id).where(OutboxEvent.event_id == envelope["id"])
            )
            is None
        )

    def stored() -> list[str | None]:
        with pipeline.db.reader() as session:
            return list(
                session.scalars(
                    sa.select(StoredEvent.request_id).where(StoredEvent.id == envelope["id"])
                )
            )

    assert wait_until(stored, 15, "the stored event") == [None]
