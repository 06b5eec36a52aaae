"""`settle deliveries ...` and `settle endpoints ...`: the ops commands, against PostgreSQL."""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import pytest
from flask.testing import FlaskClient

from services import support
from services.notifier.context import NotifierContext
from services.notifier.models import FAILED, SUCCEEDED
from shared import events
from shared.db import Database
from tests.conftest import make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    TEST_SECRET_KEY,
    EnqueueRecorder,
    deliver_event,
    enqueued_fixture,
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
    update_delivery,
)

pytestmark = pytest.mark.integration


def settle(
    capsys: pytest.CaptureFixture[str], ctx: NotifierContext | None, *argv: str
) -> tuple[int, Any, str]:
    """Run the ops commands in-process (with `ctx`, or built from the environment)."""
    parser = argparse.ArgumentParser(prog="settle")
    sub = parser.add_subparsers(dest="command", required=True)
    if ctx is None:
        support.register(sub)
    else:
        support.register(sub, make_context=lambda: ctx)
    args = parser.parse_args(list(argv))
    code = args.func(args)
    captured = capsys.readouterr()
    out = captured.out.strip()
    return code, (json.loads(out) if out else None), captured.err


def test_deliveries_list_show_and_replay(
    capsys: pytest.CaptureFixture[str],
    notifier_client: FlaskClient,
    notifier_context: NotifierContext,
    pg_db: Database,
    enqueued: EnqueueRecorder,
) -> None:
    # Given a tenant's failed delivery
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    event, (delivery,) = deliver_event(pg_db, tenant.tenant_id)
    update_delivery(pg_db, delivery.id, status=FAILED, next_attempt_at=None)

    # When ops list the tenant's failed deliveries, Then they see it in the API's shape
    code, listed, _ = settle(
        capsys,
        notifier_context,
        "deliveries",
        "list",
        "--tenant",
        tenant.tenant_id,
        "--status",
        "failed",
    )
    assert code == 0
    assert [d["id"] for d in listed["webhookDeliveries"]] == [delivery.id]
    assert listed["webhookDeliveries"][0]["endpointId"] == endpoint["id"]

    # When they show it, Then the event comes with it
    code, shown, _ = settle(capsys, notifier_context, "deliveries", "show", delivery.id)
    assert code == 0 and shown["webhookDelivery"]["event"]["id"] == event.id

    # When they replay it, Then a new delivery names it and is handed to the engine
    code, replayed, _ = settle(capsys, notifier_context, "deliveries", "replay", delivery.id)
    assert code == 0
    assert replayed["webhookDelivery"]["replayOf"] == delivery.id
    assert replayed["webhookDelivery"]["eventId"] == event.id
    assert enqueued.ids == [replayed["webhookDelivery"]["id"]]

    # And an unknown id (or another tenant's, with --tenant) is exit 2 with the reason
    other = make_tenant(pg_db)
    code, out, err = settle(
        capsys, notifier_context, "deliveries", "show", delivery.id, "--tenant", other.tenant_id
    )
    assert (code, out) == (2, None) and err.startswith("error: not_found:")


def test_endpoints_list_disable_enable(
    capsys: pytest.CaptureFixture[str],
    notifier_client: FlaskClient,
    notifier_context: NotifierContext,
    pg_db: Database,
) -> None:
    # Given a tenant with an endpoint
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)

    # When ops list the tenant's endpoints, Then they see it (and no secret)
    code, listed, _ = settle(
        capsys, notifier_context, "endpoints", "list", "--tenant", tenant.tenant_id
    )
    assert code == 0 and listed == {"webhookEndpoints": [endpoint], "nextCursor": None}

    # When they disable it, Then it gets no new deliveries
    code, disabled, _ = settle(capsys, notifier_context, "endpoints", "disable", endpoint["id"])
    assert code == 0
    assert disabled["webhookEndpoint"]["status"] == "disabled"
    assert disabled["webhookEndpoint"]["disabledReason"] == "manual"
    assert deliver_event(pg_db, tenant.tenant_id, events.DEPOSIT_CREDITED)[1] == []

    # When they enable it, Then deliveries resume
    code, enabled, _ = settle(capsys, notifier_context, "endpoints", "enable", endpoint["id"])
    assert code == 0 and enabled["webhookEndpoint"]["status"] == "enabled"
    assert len(deliver_event(pg_db, tenant.tenant_id, events.DEPOSIT_CREDITED)[1]) == 1


def test_commands_build_their_context_from_the_environment(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    notifier_client: FlaskClient,
    pg_url: str,
    pg_db: Database,
) -> None:
    # Given the settings of a deployment in the environment
    tenant = make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    monkeypatch.setenv("SETTLE_DATABASE_URL", pg_url)
    monkeypatch.setenv("SETTLE_SECRET_KEY", TEST_SECRET_KEY)
    monkeypatch.setenv("SETTLE_ENV", "dev")

    # When `settle endpoints list` runs as a user would, Then it reads that database
    code, listed, _ = settle(capsys, None, "endpoints", "list", "--tenant", tenant.tenant_id)
    assert code == 0 and [e["id"] for e in listed["webhookEndpoints"]] == [endpoint["id"]]


def test_a_replay_says_when_it_will_go_and_can_wait_for_it_with_progress(
    capsys: pytest.CaptureFixture[str],
    notifier_client: FlaskClient,
    notifier_context: NotifierContext,
    pg_db: Database,
    enqueued: EnqueueRecorder,
) -> None:
    # Given a failed delivery
    tenant = make_tenant(pg_db)
    make_endpoint(notifier_client, tenant)
    _, (delivery,) = deliver_event(pg_db, tenant.tenant_id)
    update_delivery(pg_db, delivery.id, status=FAILED, next_attempt_at=None)

    # When ops replay it without waiting, Then they are told it is queued and how to follow
    code, _, err = settle(capsys, notifier_context, "deliveries", "replay", delivery.id)
    assert code == 0 and "queued" in err and "settle deliveries show" in err

    # When they replay it with --wait and a worker sends it half a second later
    def engine_attempts_it() -> None:
        time.sleep(0.5)
        for new in enqueued.ids[1:]:
            update_delivery(pg_db, new, status=SUCCEEDED, attempt_count=1, next_attempt_at=None)

    worker = threading.Thread(target=engine_attempts_it)
    enqueued.calls.clear()
    enqueued.calls.append(["placeholder"])  # ids[1:] are this replay's
    worker.start()
    code, waited, err = settle(
        capsys, notifier_context, "deliveries", "replay", delivery.id, "--wait", "10"
    )
    worker.join()
    # Then it showed progress and printed the delivery as attempted
    assert code == 0 and waited["webhookDelivery"]["status"] == "succeeded"
    assert "pending, 0 attempt(s)" in err and "succeeded, 1 attempt(s)" in err
