"""The sweeper on real PostgreSQL: what it re-sends, and what its jobs carry."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import pytest
from flask.testing import FlaskClient

from services.notifier.metrics import NotifierMetrics
from services.notifier.sweeper import Sweeper
from shared.db import Database
from shared.timefmt import utcnow
from tests.conftest import TenantKeys
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    deliver_event,
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration


def test_swept_jobs_carry_their_route(
    pg_db: Database, notifier_client: FlaskClient, tenant: TenantKeys
) -> None:
    """A delivery waiting in a worker for a slot of its tenant is due in the database with
    no lease, so the sweeper finds it too: its job carries the route, so that a worker
    whose tenant is still full drops the repeat without a claim (the waiting room keeps
    one of each), instead of claiming and putting back every one."""
    endpoint, _ = make_endpoint(notifier_client, tenant)
    # Given a delivery overdue by more than the grace, with no job in flight
    _, made = deliver_event(pg_db, tenant.tenant_id, at=utcnow() - timedelta(minutes=5))
    sent: list[tuple[list[str], dict[str, tuple[str, str]]]] = []

    def enqueue(ids: list[str], routes: Mapping[str, tuple[str, str]], **_: object) -> None:
        sent.append((ids, dict(routes)))

    sweeper = Sweeper(pg_db, enqueue, NotifierMetrics(), interval_s=5, grace_s=30, batch=100_000)
    # When the sweeper runs
    swept = sweeper.sweep_once()
    # Then it is re-sent with its endpoint and tenant
    (delivery,) = made
    assert delivery.id in swept
    ((ids, routes),) = sent
    assert ids == swept
    assert routes[delivery.id] == (endpoint["id"], tenant.tenant_id)
