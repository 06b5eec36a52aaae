"""Delivery SLA: GET /v1/webhook-endpoints/{id}/stats and `settle sla` agree with the rows.

Deliveries and attempts are written as the engine leaves them (real PostgreSQL); the
expected figures are computed here from the rows themselves, in Python, and both the
API and the command must give exactly those.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from services import output
from services.cli import main
from services.notifier.models import (
    FAILED,
    PENDING,
    RETRYING,
    SKIPPED,
    SUCCEEDED,
    Attempt,
    Delivery,
    StoredEvent,
)
from services.notifier.webhook_endpoints import ENDPOINT_DELETED
from shared import events
from shared.db import Database
from shared.timefmt import iso_ms, utcnow
from tests.conftest import TenantKeys, make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    EnqueueRecorder,
    add_attempt,
    deliver_event,
    enqueued_fixture,
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
    update_delivery,
)

pytestmark = pytest.mark.integration


def _delivery(db: Database, tenant_id: str, at: datetime, **values: Any) -> str:
    """A deposit.credited event made at `at` and its one delivery, then set to `values`."""
    _, (delivery,) = deliver_event(db, tenant_id, at=at)
    if values:
        update_delivery(db, delivery.id, **values)
    return delivery.id


def _attempts(db: Database, delivery_id: str, *latencies_ms: float, ok_last: bool) -> None:
    for number, latency in enumerate(latencies_ms, start=1):
        ok = ok_last and number == len(latencies_ms)
        add_attempt(
            db,
            delivery_id,
            number,
            attempted_at=utcnow(),
            latency_ms=latency,
            response_status=200 if ok else 500,
            error=None if ok else "http_500",
        )


def _seed(db: Database, tenant: TenantKeys, now: datetime) -> None:
    """Every kind of delivery the figures tell apart (one endpoint subscribed to it)."""
    hour = now - timedelta(hours=1)
    # First attempt succeeded: 120 ms, 0.5 s from commit to success
    d = _delivery(db, tenant.tenant_id, hour, status=SUCCEEDED, next_attempt_at=None)
    update_delivery(db, d, succeeded_at=hour + timedelta(seconds=0.5), attempt_count=1)
    _attempts(db, d, 120.0, ok_last=True)
    first_ok = d
    # Succeeded at the second attempt, 65 s after the commit
    d = _delivery(db, tenant.tenant_id, hour, status=SUCCEEDED, next_attempt_at=None)
    update_delivery(db, d, succeeded_at=hour + timedelta(seconds=65), attempt_count=2)
    _attempts(db, d, 3000.0, 80.0, ok_last=True)
    # Gave up after three failed attempts (exhausted)
    d = _delivery(db, tenant.tenant_id, hour, status=FAILED, next_attempt_at=None)
    update_delivery(db, d, last_error="http_500", attempt_count=3)
    _attempts(db, d, 40.0, 45.0, 50.0, ok_last=False)
    # Stopped because its endpoint was deleted (failed, not exhausted)
    d = _delivery(db, tenant.tenant_id, hour, status=FAILED, next_attempt_at=None)
    update_delivery(db, d, last_error=ENDPOINT_DELETED, attempt_count=1)
    _attempts(db, d, 55.0, ok_last=False)
    # Retrying since two minutes ago (its first attempt timed out at 10 s)
    d = _delivery(db, tenant.tenant_id, now - timedelta(minutes=2), status=RETRYING)
    _attempts(db, d, 10000.0, ok_last=False)
    # Pending, never attempted, made 30 s ago
    _delivery(db, tenant.tenant_id, now - timedelta(seconds=30), status=PENDING)
    # Skipped while the endpoint was disabled
    _delivery(db, tenant.tenant_id, hour, status=SKIPPED, next_attempt_at=None)
    # A replay (an hour ago) of an event committed three days ago: counted, but its
    # commit-to-success of three days is the tenant's, not Settle's
    d = _delivery(
        db,
        tenant.tenant_id,
        now - timedelta(days=3),
        status=SUCCEEDED,
        next_attempt_at=None,
        replay_of=first_ok,
        created_at=hour,
        succeeded_at=hour + timedelta(seconds=1),
    )
    _attempts(db, d, 90.0, ok_last=True)
    # Before the window: left out
    d = _delivery(db, tenant.tenant_id, now - timedelta(days=8), status=FAILED)
    _attempts(db, d, 999_000.0, ok_last=False)


def _percentile(values: list[float], fraction: float) -> float | None:
    """PostgreSQL's percentile_cont: linear between the two nearest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _expected(db: Database, endpoint_id: str, since: datetime, now: datetime) -> dict[str, Any]:
    """The figures, from the rows, in Python."""
    with db.reader() as session:
        rows = session.execute(
            sa.select(Delivery, StoredEvent.created_at)
            .join(StoredEvent, StoredEvent.id == Delivery.event_id)
            .where(
                Delivery.endpoint_id == endpoint_id,
                Delivery.created_at >= since,
                Delivery.created_at < now,
            )
        ).all()
        ids = [d.id for d, _ in rows]
        firsts = list(
            session.scalars(
                sa.select(Attempt.latency_ms).where(
                    Attempt.delivery_id.in_(ids), Attempt.number == 1
                )
            )
        )
    by_status = [d.status for d, _ in rows]
    succeeded, failed = by_status.count(SUCCEEDED), by_status.count(FAILED)
    commit = [
        (d.succeeded_at - committed).total_seconds()
        for d, committed in rows
        if d.status == SUCCEEDED and d.replay_of is None
    ]
    pending = [d.created_at for d, _ in rows if d.status in (PENDING, RETRYING)]
    latencies = [ms / 1000.0 for ms in firsts]
    return {
        "deliveries": len(rows),
        "succeeded": succeeded,
        "failed": failed,
        "exhausted": sum(
            1 for d, _ in rows if d.status == FAILED and d.last_error != ENDPOINT_DELETED
        ),
        "pending": len(pending),
        "skipped": by_status.count(SKIPPED),
        "successRate": succeeded / (succeeded + failed),
        "firstAttemptLatencyP50Seconds": _percentile(latencies, 0.5),
        "firstAttemptLatencyP99Seconds": _percentile(latencies, 0.99),
        "commitToSuccessP50Seconds": _percentile(commit, 0.5),
        "commitToSuccessP99Seconds": _percentile(commit, 0.99),
        "oldestPendingAgeSeconds": (now - min(pending)).total_seconds(),
    }


def _agrees(served: dict[str, Any], expected: dict[str, Any]) -> None:
    for name, value in expected.items():
        got = served[name]
        if name == "oldestPendingAgeSeconds":
            # Measured at the request's own now, a moment apart from ours
            assert abs(got - value) < 30, (name, got, value)
        elif isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-9, abs=1e-6), (name, got, value)
        else:
            assert got == value, (name, got, value)


def test_the_stats_endpoint_and_settle_sla_agree_with_the_database(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_url: str,
    pg_db: Database,
    notifier_client: FlaskClient,
    enqueued: EnqueueRecorder,
) -> None:
    # Given a tenant's endpoint with deliveries of every kind, a second endpoint of the
    # tenant, and another tenant's endpoint
    tenant, stranger = make_tenant(pg_db), make_tenant(pg_db)
    ledger, _ = make_endpoint(notifier_client, tenant, name="Ledger")
    quiet, _ = make_endpoint(
        notifier_client, tenant, name="Quiet", eventTypes=[events.DEPOSIT_FAILED]
    )
    theirs, _ = make_endpoint(notifier_client, stranger, name="Theirs")
    now = utcnow()
    _seed(pg_db, tenant, now)
    _delivery(pg_db, tenant.tenant_id, now - timedelta(hours=2))  # pending, to the ledger only
    _delivery(pg_db, stranger.tenant_id, now - timedelta(hours=1))
    _, (to_quiet,) = deliver_event(
        pg_db, tenant.tenant_id, events.DEPOSIT_FAILED, at=now - timedelta(hours=1)
    )
    since = now - timedelta(days=7)

    # When the tenant asks for its ledger's stats over the last 7 days
    response = notifier_client.get(
        f"/v1/webhook-endpoints/{ledger['id']}/stats?since=7d", headers=tenant.headers
    )
    # Then every figure is the one the rows give
    assert response.status_code == 200, response.get_json()
    served = response.get_json()["stats"]
    expected = _expected(pg_db, ledger["id"], since, utcnow())
    assert expected["deliveries"] == 9 and expected["exhausted"] == 1  # the seed's shape
    assert expected["commitToSuccessP99Seconds"] < 70  # the replay left out
    _agrees(served, expected)
    assert served["endpointId"] == ledger["id"]
    assert abs(datetime.fromisoformat(served["since"]) - since) < timedelta(seconds=30)

    # And an ISO time for since gives the same figures
    at = iso_ms(since)
    by_time = notifier_client.get(
        f"/v1/webhook-endpoints/{ledger['id']}/stats",
        query_string={"since": at},
        headers=tenant.headers,
    )
    assert by_time.status_code == 200
    _agrees(by_time.get_json()["stats"], _expected(pg_db, ledger["id"], since, utcnow()))

    # When ops run `settle sla --tenant <it> --json`
    monkeypatch.setenv("SETTLE_DATABASE_URL", pg_url)
    monkeypatch.setenv("SETTLE_ENV", "dev")
    assert main(["sla", "--since", "7d", "--tenant", tenant.tenant_id, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # Then each of the tenant's endpoints with deliveries is a row, with the same figures
    rows = {row["endpointId"]: row for row in report["endpoints"]}
    assert set(rows) == {ledger["id"], quiet["id"]}
    assert {row["tenantId"] for row in rows.values()} == {tenant.tenant_id}
    _agrees(rows[ledger["id"]], _expected(pg_db, ledger["id"], since, utcnow()))
    assert rows[quiet["id"]]["deliveries"] == 1 and rows[quiet["id"]]["pending"] == 1
    assert rows[quiet["id"]]["successRate"] is None  # nothing finished
    del to_quiet

    # And on a terminal the same figures are a table, a row per endpoint
    monkeypatch.setattr(output, "wants_json", lambda stream=None: False)
    assert main(["sla", "--tenant", tenant.tenant_id]) == 0
    table = capsys.readouterr().out.splitlines()
    header = next(line for line in table if "oldest_pending_s" in line).split()
    (ledger_line,) = [line.split() for line in table if ledger["id"] in line]
    shown = dict(zip(header, ledger_line, strict=True))
    assert shown["deliveries"] == "9" and shown["exhausted"] == "1"
    assert shown["success_%"] == f"{100 * rows[ledger['id']]['successRate']:.2f}" == "60.00"
    monkeypatch.undo()
    monkeypatch.setenv("SETTLE_DATABASE_URL", pg_url)
    monkeypatch.setenv("SETTLE_ENV", "dev")

    # And without --tenant the other tenant's endpoint is there too
    assert main(["sla", "--json"]) == 0
    everyone = {row["endpointId"] for row in json.loads(capsys.readouterr().out)["endpoints"]}
    assert {ledger["id"], quiet["id"], theirs["id"]} <= everyone


def test_the_stats_of_another_tenants_endpoint_are_a_404(
    pg_db: Database, notifier_client: FlaskClient, enqueued: EnqueueRecorder
) -> None:
    tenant, stranger = make_tenant(pg_db), make_tenant(pg_db)
    theirs, _ = make_endpoint(notifier_client, stranger)
    _delivery(pg_db, stranger.tenant_id, utcnow() - timedelta(minutes=5))
    response = notifier_client.get(
        f"/v1/webhook-endpoints/{theirs['id']}/stats", headers=tenant.headers
    )
    assert response.status_code == 404 and response.get_json()["code"] == "not_found"
    missing = notifier_client.get(
        "/v1/webhook-endpoints/we_01JD3Y8Q2X4N6R5T7V9W0Z1A2B/stats", headers=tenant.headers
    )
    assert missing.status_code == 404
    assert response.get_json()["error"].replace(theirs["id"], "X") == missing.get_json()[
        "error"
    ].replace("we_01JD3Y8Q2X4N6R5T7V9W0Z1A2B", "X")


def test_an_endpoint_without_deliveries_has_zeros_and_nulls(
    pg_db: Database, notifier_client: FlaskClient, tenant: TenantKeys
) -> None:
    endpoint, _ = make_endpoint(notifier_client, tenant)
    response = notifier_client.get(
        f"/v1/webhook-endpoints/{endpoint['id']}/stats?since=1h", headers=tenant.headers
    )
    assert response.status_code == 200
    stats = response.get_json()["stats"]
    assert stats["deliveries"] == 0 and stats["successRate"] is None
    assert stats["firstAttemptLatencyP50Seconds"] is None
    assert stats["oldestPendingAgeSeconds"] is None


@pytest.mark.parametrize(
    "since",
    [
        "",
        "7",
        "7x",
        "0d",
        "-1d",
        "1.5d",
        "99999999d",
        "9999999w",
        "2999-01-01T00:00:00Z",
        "yesterday",
        "7d; DROP TABLE webhook_deliveries",
        "x" * 100,
    ],
)
def test_a_bad_since_is_a_400_naming_it(
    pg_db: Database, notifier_client: FlaskClient, tenant: TenantKeys, since: str
) -> None:
    endpoint, _ = make_endpoint(notifier_client, tenant)
    response = notifier_client.get(
        f"/v1/webhook-endpoints/{endpoint['id']}/stats",
        query_string={"since": since},
        headers=tenant.headers,
    )
    assert response.status_code == 400, (since, response.get_json())
    body = response.get_json()
    assert body["code"] == "invalid_request" and "since" in body["error"]


def test_settle_sla_refuses_a_bad_since(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sla", "--since", "soon"])
    assert exited.value.code == 2
    assert "--since" in capsys.readouterr().err
