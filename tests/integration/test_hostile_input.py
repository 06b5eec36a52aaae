"""Hostile input to both apps (real PostgreSQL): nesting, recursion, content types, `//`, amounts.

Each case once answered a 500, a crash, a redirect built from the Host header, or a
misleading message. The process-level twin (gunicorn workers and `settle dev`
surviving) is tests/e2e/test_hostile_clients.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import Client

from services.core.app import create_app as create_core_app
from services.core.context import CoreContext
from services.dev import PathDispatcher
from services.notifier.app import create_app as create_notifier_app
from services.notifier.context import NotifierContext
from shared.db import Database
from tests.conftest import TenantKeys, make_tenant
from tests.integration.conftest import USDC_BASE, assert_error, destination
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
)
from tests.support.deposits import AccountRef, make_account

pytestmark = pytest.mark.integration

JSON = "application/json"
#: The documented nesting cap of a JSON body (docs/DECISIONS.md).
MAX_DEPTH = 32
#: Deep enough that the old parser recursed past the default limit (a 500), shallow
#: enough that it cannot overflow the C stack of this test process whatever its limit.
DEEP = 5000


def nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def nested_metadata(depth: int) -> bytes:
    """An account body whose metadata value nests `depth` levels in all (the body is 1)."""
    value = b'{"k":' * (depth - 2) + b"1" + b"}" * (depth - 2)
    return b'{"externalUserId": "deep", "metadata": {"x": ' + value + b"}}"


# --- nesting -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/sessions"),
        ("POST", "/v1/deposit-accounts"),
        ("PUT", "/v1/destination-policy"),
        ("POST", "/v1/fee-preview"),
        ("POST", "/v1/sandbox/deposits"),
        ("PATCH", "/v1/deposit-accounts/x/destination"),
    ],
)
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, DEEP])
def test_core_refuses_json_nested_beyond_the_cap(
    client: FlaskClient, tenant: TenantKeys, method: str, path: str, depth: int
) -> None:
    headers = {**tenant.headers, "Content-Type": JSON}
    for body in (nested(depth), b'{"a":' * depth + b"1" + b"}" * depth):
        error = assert_error(
            client.open(path, method=method, data=body, headers=headers), 400, "invalid_json"
        )
        assert f"{MAX_DEPTH} levels" in error["error"]


def test_nesting_up_to_the_cap_is_read_and_judged_by_the_schema(
    client: FlaskClient, tenant: TenantKeys
) -> None:
    headers = {**tenant.headers, "Content-Type": JSON}
    # At the cap the body is parsed: metadata may not nest, so the schema refuses it
    at_cap = client.post("/v1/deposit-accounts", data=nested_metadata(MAX_DEPTH), headers=headers)
    assert_error(at_cap, 400, "invalid_request")
    # One level more and it is not read at all
    beyond = client.post(
        "/v1/deposit-accounts", data=nested_metadata(MAX_DEPTH + 1), headers=headers
    )
    assert_error(beyond, 400, "invalid_json")
    # Brackets inside strings are text, not nesting
    text = "[" * 10_000 + "{" * 10_000
    ok = client.post(
        "/v1/deposit-accounts",
        json={
            "externalUserId": "brackets",
            "destination": destination(),
            "metadata": {"t": text[:500]},
        },
        headers=tenant.headers,
    )
    assert ok.status_code == 200, ok.get_json()
    # Escaped quotes and backslashes inside strings do not end them early
    escaped = json.dumps(
        {
            "externalUserId": 'q"[[[[\\',
            "destination": destination(),
            "metadata": {"t": "[" * 200 + '\\"' + "{" * 100},
        }
    ).encode()
    assert client.post("/v1/deposit-accounts", data=escaped, headers=headers).status_code == 200


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, DEEP])
def test_notifier_refuses_json_nested_beyond_the_cap(
    notifier_client: FlaskClient, tenant: TenantKeys, depth: int
) -> None:
    headers = {**tenant.headers, "Content-Type": JSON}
    for path in ("/v1/webhook-endpoints", "/v1/webhook-endpoints/we_1/rotate-secret"):
        for body in (nested(depth), b'{"a":' * depth + b"1" + b"}" * depth):
            error = assert_error(
                notifier_client.post(path, data=body, headers=headers), 400, "invalid_json"
            )
            assert f"{MAX_DEPTH} levels" in error["error"]
    patched = notifier_client.patch(
        "/v1/webhook-endpoints/we_1", data=nested(depth), headers=headers
    )
    assert_error(patched, 400, "invalid_json")


def test_unbalanced_deep_brackets_are_invalid_json(client: FlaskClient) -> None:
    # The parser would recurse through every '[' before meeting the wrong closer
    body = b"[" * DEEP + b"}" * DEEP
    response = client.post("/v1/sessions", data=body, headers={"Content-Type": JSON})
    assert_error(response, 400, "invalid_json")


def _app_with_a_recursive_route(app: Flask) -> FlaskClient:
    def recurse(n: int) -> int:
        return recurse(n + 1) + 1

    @app.route("/v1/recurse")
    def _recurse() -> str:
        return str(recurse(0))

    return app.test_client()


def test_a_recursion_error_anywhere_is_a_400_in_both_services(
    core_context: CoreContext, notifier_context: NotifierContext
) -> None:
    for app in (
        create_core_app(context=core_context),
        create_notifier_app(context=notifier_context),
    ):
        client = _app_with_a_recursive_route(app)
        assert_error(client.get("/v1/recurse"), 400, "invalid_request")


def test_the_api_processes_import_no_web3_and_keep_the_default_recursion_limit(
    pg_url: str, tmp_path: Any
) -> None:
    # Given a fresh interpreter, when each app factory builds its app
    script = textwrap.dedent(
        f"""
        import sys
        default = sys.getrecursionlimit()
        from services.core.app import create_app as core_app
        from services.core.config import CoreConfig
        from services.notifier.app import create_app as notifier_app
        from services.notifier.config import NotifierConfig
        from tests.support.keys import test_xpub
        url = {pg_url!r}
        core_app(CoreConfig(database_url=url, identity_database_url=url, env="dev",
                            data_dir={str(tmp_path)!r}, deposit_xpub=test_xpub()))
        notifier_app(NotifierConfig(database_url=url, identity_database_url=url,
                                    secret_key="k" * 40, env="dev"))
        heavy = sorted(m for m in ("web3", "py_ecc", "eth") if m in sys.modules)
        print(default, sys.getrecursionlimit(), heavy)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Then web3 (whose py_ecc raises the limit to 100000) was never imported
    default, limit, heavy = done.stdout.split(" ", 2)
    assert heavy.strip() == "[]"
    assert int(limit) == int(default) == 1000


# --- content types ---------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_declared_json_asks_for_application_json(
    client: FlaskClient, notifier_client: FlaskClient, tenant: TenantKeys, content_type: str | None
) -> None:
    headers = dict(tenant.headers)
    if content_type is not None:
        headers["Content-Type"] = content_type
    for app_client, path in (
        (client, "/v1/deposit-accounts"),
        (client, "/v1/fee-preview"),
        (client, "/v1/sessions"),
        (notifier_client, "/v1/webhook-endpoints"),
    ):
        response = app_client.post(path, data='{"externalUserId": "a"}', headers=headers)
        error = assert_error(response, 415, "unsupported_media_type")
        assert "application/json" in error["error"]


def test_json_content_types_with_parameters_or_suffixes_are_read(
    client: FlaskClient, tenant: TenantKeys
) -> None:
    for content_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        response = client.post(
            "/v1/fee-preview",
            data='{"amount": "10"}',
            headers={**tenant.headers, "Content-Type": content_type},
        )
        assert response.status_code == 200, response.get_json()


def test_an_optional_body_may_be_left_out_without_a_content_type(
    notifier_client: FlaskClient, tenant: TenantKeys
) -> None:
    created = notifier_client.post(
        "/v1/webhook-endpoints",
        json={"name": "n", "url": "https://hooks.example.com/x", "eventTypes": ["webhook.test"]},
        headers=tenant.headers,
    )
    endpoint_id = created.get_json()["webhookEndpoint"]["id"]
    rotated = notifier_client.post(
        f"/v1/webhook-endpoints/{endpoint_id}/rotate-secret", headers=tenant.headers
    )
    assert rotated.status_code == 200, rotated.get_json()


# --- double slashes ----------------------------------------------------------------------


@pytest.fixture
def dev_client(core_context: CoreContext, notifier_context: NotifierContext) -> Client:
    """`settle dev`'s dispatcher in front of both apps, as `settle dev` builds it."""
    return Client(
        PathDispatcher(
            create_core_app(context=core_context), create_notifier_app(context=notifier_context)
        )
    )


@pytest.mark.parametrize(
    "path",
    [
        "/v1//chains",
        "//v1/chains",
        "///v1/chains",
        "/v1/chains//",
        "/v1//webhook-endpoints",
        "//v1/webhook-endpoints",
        "/v1/notifier//status",
    ],
)
def test_double_slashes_are_a_json_404_in_both_services_and_settle_dev(
    client: FlaskClient, notifier_client: FlaskClient, dev_client: Client, path: str
) -> None:
    for app_client in (client, notifier_client, dev_client):
        # PATH_INFO set as a server sets it (a test client reads `//v1` as a host name)
        response = app_client.get(
            "/", headers={"Host": "evil.example"}, environ_overrides={"PATH_INFO": path}
        )
        assert response.status_code == 404, (path, response.headers.get("Location"))
        assert "Location" not in response.headers
        assert_error(response, 404, "not_found")


# --- amounts and assets ---------------------------------------------------------------------


@pytest.fixture
def sandbox_tenant(pg_db: Database) -> TenantKeys:
    return make_tenant(pg_db, sandbox=True)


@pytest.fixture
def account(pg_db: Database, core_context: CoreContext, sandbox_tenant: TenantKeys) -> AccountRef:
    return make_account(
        pg_db,
        sandbox_tenant.tenant_id,
        core_context.registry,
        dest_chain_id=8453,
        dest_token_address=USDC_BASE,
    )


def _sandbox(client: FlaskClient, tenant: TenantKeys, account: AccountRef, **body: Any) -> Any:
    body = {"depositAddress": account.address(8453), "chainId": 8453, **body}
    return client.post("/v1/sandbox/deposits", json=body, headers=tenant.headers)


def _preview(client: FlaskClient, tenant: TenantKeys, **body: Any) -> Any:
    return client.post("/v1/fee-preview", json={"chainId": 8453, **body}, headers=tenant.headers)


BAD_AMOUNTS = [
    "1" + "0" * 22,  # 10^22: once a 500 (decimal overflow)
    "9" * 40,
    "1" + "0" * 15,  # 10^15: beyond the sane magnitude
    "125.50\n",  # once accepted
    "125.50 ",
    "\n125.50",
    "125.50\r\n",
    "1.0000000",  # 7 decimals for a 6-decimal token, even as zeros
    "1." + "0" * 36,
    "\uff11\uff12",  # fullwidth digits
    "1\u00b75",
    "+1",
    "1e3",
]


@pytest.mark.parametrize("amount", BAD_AMOUNTS)
def test_bad_amounts_are_400_in_fee_preview_and_sandbox_deposits_alike(
    client: FlaskClient,
    sandbox_tenant: TenantKeys,
    account: AccountRef,
    pg_db: Database,
    amount: str,
) -> None:
    preview = _preview(client, sandbox_tenant, asset="USDC", amount=amount)
    error = assert_error(preview, 400, "invalid_request")
    assert "amount" in error["details"]["fields"], error
    sandbox = _sandbox(client, sandbox_tenant, account, asset="USDC", amount=amount)
    error = assert_error(sandbox, 400, "invalid_request")
    assert "amount" in error["details"]["fields"], error


def test_the_largest_sane_amount_is_quoted_and_deposited(
    client: FlaskClient, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    top = "9" * 15 + ".999999"
    quote = _preview(client, sandbox_tenant, asset="USDC", amount=top)
    assert quote.status_code == 200, quote.get_json()
    assert quote.get_json()["quotes"][0]["amount"] == top
    deposit = _sandbox(client, sandbox_tenant, account, asset="USDC", amount=top)
    assert deposit.status_code == 200, deposit.get_json()
    assert deposit.get_json()["deposit"]["amount"] == top
    dai = _preview(client, sandbox_tenant, asset="DAI", amount="9" * 15 + "." + "9" * 18)
    assert dai.status_code == 200, dai.get_json()


@pytest.mark.parametrize("symbol", ["USDC", "usdc", "Usdc"])
def test_asset_symbols_match_the_same_way_in_fee_preview_and_sandbox_deposits(
    client: FlaskClient, sandbox_tenant: TenantKeys, account: AccountRef, symbol: str
) -> None:
    quote = _preview(client, sandbox_tenant, asset=symbol, amount="125.5")
    assert quote.status_code == 200, quote.get_json()
    deposit = _sandbox(client, sandbox_tenant, account, asset=symbol, amount="125.5")
    assert deposit.status_code == 200, deposit.get_json()
    # Both answer with the chain's own symbol, and write the amount the same way
    (quoted,) = quote.get_json()["quotes"]
    made = deposit.get_json()["deposit"]
    assert quoted["asset"] == made["asset"] == "USDC"
    assert quoted["amount"] == made["amount"] == "125.50"


def test_a_quote_writes_the_amount_with_the_token_decimals_at_most(
    client: FlaskClient, tenant: TenantKeys
) -> None:
    quotes = client.post(
        "/v1/fee-preview", json={"amount": "1.000001"}, headers=tenant.headers
    ).get_json()["quotes"]
    assert {q["amount"] for q in quotes} == {"1.000001"}
    quotes = client.post(
        "/v1/fee-preview",
        json={"chainId": 1, "asset": "DAI", "amount": "0.5"},
        headers=tenant.headers,
    ).get_json()["quotes"]
    assert [q["amount"] for q in quotes] == ["0.50"]
