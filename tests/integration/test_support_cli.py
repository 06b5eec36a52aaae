"""Support commands from a laptop: `settle deliveries|endpoints|deposits|events` over HTTP
with an API key, as a separate process with no database settings at all.

Core and the notifier are served on 127.0.0.1 behind one address (the dev server's path
split), on the real PostgreSQL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from werkzeug.serving import make_server

from services.dev import PathDispatcher
from services.notifier.models import FAILED
from shared.db import Database
from tests.conftest import make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    deliver_event,
    enqueued_fixture,
    make_endpoint,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
    update_delivery,
)

pytestmark = pytest.mark.integration

SETTLE = str(Path(sys.executable).parent / "settle")


@pytest.fixture(scope="module")
def api_url(core_app: Flask, notifier_app: Flask) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, PathDispatcher(core_app, notifier_app), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def settle(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`settle ...` as a laptop runs it: no database URL, no data dir around."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    clean["SETTLE_DATA_DIR"] = "/nonexistent/settle-data"
    done = subprocess.run(
        [SETTLE, *argv],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    return done.returncode, done.stdout, done.stderr


def as_json(out: str) -> Any:
    return json.loads(out)


def test_support_reads_and_replays_a_tenants_deliveries_with_its_api_key(
    api_url: str, notifier_client: Any, pg_db: Database, enqueued: Any
) -> None:
    # Given a tenant with an endpoint and a failed delivery, and another tenant's
    tenant, other = make_tenant(pg_db), make_tenant(pg_db)
    endpoint, _ = make_endpoint(notifier_client, tenant)
    _, (delivery,) = deliver_event(pg_db, tenant.tenant_id)
    update_delivery(pg_db, delivery.id, status=FAILED, next_attempt_at=None)
    make_endpoint(notifier_client, other)
    deliver_event(pg_db, other.tenant_id)
    key = ["--api-url", api_url, "--api-key", tenant.api_key]

    # When support lists the failed deliveries with the tenant's key (as JSON)
    code, out, err = settle("deliveries", "list", "--status", "failed", *key, "--json")
    # Then they see this tenant's, and only this tenant's
    assert code == 0, err
    assert [d["id"] for d in as_json(out)["webhookDeliveries"]] == [delivery.id]

    # And the delivery in full, the endpoint, and a replay, all over the API
    code, out, err = settle("deliveries", "show", delivery.id, *key, "--json")
    assert code == 0 and as_json(out)["webhookDelivery"]["id"] == delivery.id, err
    code, out, err = settle("endpoints", "list", *key, "--json")
    assert [e["id"] for e in as_json(out)["webhookEndpoints"]] == [endpoint["id"]], err
    code, out, err = settle("endpoints", "show", endpoint["id"], *key, "--json")
    assert as_json(out)["webhookEndpoint"]["url"] == endpoint["url"], err
    code, out, err = settle("deliveries", "replay", delivery.id, *key, "--json")
    assert code == 0, err
    replay = as_json(out)["webhookDelivery"]
    assert replay["replayOf"] == delivery.id and replay["id"] in enqueued.ids
    code, out, err = settle("endpoints", "test", endpoint["id"], *key, "--json")
    assert code == 0 and as_json(out)["webhookDelivery"]["eventType"] == "webhook.test", err

    # And the environment variables work as the options do
    env = {"SETTLE_API_URL": api_url, "SETTLE_API_KEY": tenant.api_key}
    code, out, err = settle("deliveries", "list", "--json", env=env)
    assert code == 0 and len(as_json(out)["webhookDeliveries"]) >= 2, err

    # And another tenant's delivery is as absent as one that never existed
    foreign = ["--api-url", api_url, "--api-key", other.api_key]
    code, _, err = settle("deliveries", "show", delivery.id, *foreign)
    assert code == 2 and "404" in err


def test_tables_for_people_and_json_for_scripts(api_url: str, pg_db: Database) -> None:
    tenant = make_tenant(pg_db)
    key = ["--api-url", api_url, "--api-key", tenant.api_key]
    code, out, err = settle("events", "list", "--api-url", api_url, "--json")
    assert code == 0, err
    body = as_json(out)
    assert "deposit.credited" in [t["type"] for t in body["eventTypes"]]
    assert "*" in [p["pattern"] for p in body["patterns"]]
    code, out, err = settle("deposits", "list", *key, "--json")
    assert code == 0 and as_json(out)["deposits"] == [], err
    # A terminal gets a table (the process's stdout is a pipe here: the test asks the
    # renderer for the terminal form directly)
    from services import output, support

    output.set_json(False)
    try:
        table = output.render({"webhookDeliveries": [{c: "x" for c in support.DELIVERY_COLUMNS}]})
    finally:
        output.set_json(None)
    assert table.splitlines()[1].split() == list(support.DELIVERY_COLUMNS)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["deliveries", "list", "--api-key", "sk_x"], None),  # filled in with the URL
        (["endpoints", "show", "we_1"], "--api-url"),
        (["deposits", "show", "dep_1"], "--api-url"),
        (
            ["deposits", "credit", "dep_1", "--tx", "0x" + "0" * 64, "--api-url", "http://x"],
            "ops-only",
        ),
        (["endpoints", "disable", "we_1", "--api-url", "http://x"], "ops-only"),
        (["deliveries", "list", "--tenant", "t", "--api-url", "http://x"], "--tenant"),
    ],
)
def test_wrong_uses_say_what_to_do(api_url: str, argv: list[str], says: str | None) -> None:
    if says is None:  # a wrong key: the API's 401, said in one line
        code, _, err = settle(*argv, "--api-url", api_url)
        assert code == 2 and "401" in err and "Traceback" not in err
        return
    code, _, err = settle(*argv)
    assert code == 2 and says in err and "Traceback" not in err, err


def test_an_unreachable_api_is_one_line(api_url: str) -> None:
    code, _, err = settle(
        "deliveries", "list", "--api-url", "http://127.0.0.1:9", "--api-key", "sk_x"
    )
    assert code == 2 and "cannot reach http://127.0.0.1:9" in err and "Traceback" not in err
