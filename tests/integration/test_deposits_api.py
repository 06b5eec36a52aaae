"""GET /v1/deposits and GET /v1/deposits/<id>: filters, pagination, isolation, scopes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from flask.testing import FlaskClient

from services.core.context import CoreContext
from services.core.deposits.settings import PipelineSettings
from shared.db import Database
from tests.conftest import TenantKeys
from tests.support.deposits import FakeClock, deposit_parts, make_account

pytestmark = pytest.mark.integration

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
DEPOSIT_FIELDS = {
    "id",
    "accountId",
    "externalUserId",
    "status",
    "chainId",
    "depositAddress",
    "asset",
    "tokenAddress",
    "amount",
    "amountUsd",
    "settlementGasFeeUsd",
    "netAmountUsd",
    "sourceTxHash",
    "confirmations",
    "requiredConfirmations",
    "blockNumber",
    "destination",
    "creditTxHash",
    "failureReason",
    "route",
    "createdAt",
    "updatedAt",
}
START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def assert_error(response: Any, status: int, code: str) -> None:
    body = response.get_json()
    assert response.status_code == status, body
    assert body["code"] == code and body["error"].startswith(f"{code}: ")


@pytest.fixture
def seeded(pg_db: Database, core_context: CoreContext, tenant: TenantKeys) -> dict[str, Any]:
    """Five deposits of two users, one hour apart, on Base and Ethereum; one failed."""
    clock = FakeClock(START)
    parts = deposit_parts(
        pg_db,
        core_context.registry,
        settings=PipelineSettings(ops_stuck_after_s=0),
        clock=clock,
    )
    alice = make_account(
        pg_db, tenant.tenant_id, core_context.registry, external_user_id="alice", dest_chain_id=8453
    )
    bob = make_account(
        pg_db, tenant.tenant_id, core_context.registry, external_user_id="bob", dest_chain_id=8453
    )
    plan = [
        (alice, 8453, "10"),
        (alice, 1, "20"),
        (bob, 8453, "30"),
        (bob, 1, "40"),
        (alice, 8453, "50"),
    ]
    ids = []
    for account, chain_id, amount in plan:
        deposit = parts.sandbox.create(
            tenant.tenant_id,
            chain_id=chain_id,
            deposit_address=account.address(chain_id),
            asset="USDC",
            amount=Decimal(amount),
        )
        ids.append(deposit.id)
        clock.advance(hours=1)
    parts.ops.fail(ids[2], "refunded to sender", by="ops")
    return {"ids": ids, "alice": alice, "bob": bob}


def listed(client: FlaskClient, headers: dict[str, str], query: str = "") -> list[str]:
    response = client.get(f"/v1/deposits{query}", headers=headers)
    assert response.status_code == 200, response.get_json()
    return [d["id"] for d in response.get_json()["deposits"]]


def test_list_is_newest_first_and_filters(
    client: FlaskClient, tenant: TenantKeys, seeded: dict[str, Any]
) -> None:
    ids = seeded["ids"]
    headers = tenant.headers
    assert listed(client, headers) == ids[::-1]
    assert listed(client, headers, "?externalUserId=alice") == [ids[4], ids[1], ids[0]]
    assert listed(client, headers, "?chainId=1") == [ids[3], ids[1]]
    assert listed(client, headers, "?status=failed") == [ids[2]]
    assert listed(client, headers, "?status=source_seen&externalUserId=bob") == [ids[3]]
    after = (START + timedelta(hours=1)).isoformat()
    before = (START + timedelta(hours=3)).isoformat()
    assert listed(client, headers, f"?createdAfter={after.replace('+', '%2B')}") == [
        ids[4],
        ids[3],
        ids[2],
        ids[1],
    ]
    query = f"?createdAfter=2026-03-01T13:00:00.000Z&createdBefore={before.replace('+', '%2B')}"
    assert listed(client, headers, query) == [ids[2], ids[1]]
    assert listed(client, headers, "?externalUserId=nobody") == []


def test_pages_follow_the_cursor_to_the_end(
    client: FlaskClient, tenant: TenantKeys, seeded: dict[str, Any]
) -> None:
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        body = client.get(f"/v1/deposits{query}", headers=tenant.headers).get_json()
        assert len(body["deposits"]) <= 2
        seen += [d["id"] for d in body["deposits"]]
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert seen == seeded["ids"][::-1]


def test_deposit_object_and_single_read(
    client: FlaskClient, tenant: TenantKeys, seeded: dict[str, Any]
) -> None:
    deposit_id = seeded["ids"][0]
    response = client.get(f"/v1/deposits/{deposit_id}", headers=tenant.headers)
    assert response.status_code == 200
    deposit = response.get_json()["deposit"]
    assert set(deposit) >= DEPOSIT_FIELDS
    assert deposit["amount"] == "10.00" and deposit["amountUsd"] == 10.0
    assert isinstance(deposit["settlementGasFeeUsd"], float)
    assert deposit["externalUserId"] == "alice" and deposit["chainId"] == 8453
    assert set(deposit["destination"]) == {"chainId", "address", "tokenAddress"}
    assert TIMESTAMP.match(deposit["createdAt"]) and TIMESTAMP.match(deposit["updatedAt"])
    assert deposit["createdAt"] == "2026-03-01T12:00:00.000Z"
    listed_one = client.get("/v1/deposits?limit=200", headers=tenant.headers).get_json()
    assert deposit in listed_one["deposits"]
    failed = client.get(f"/v1/deposits/{seeded['ids'][2]}", headers=tenant.headers).get_json()
    assert failed["deposit"]["failureReason"] == "refunded to sender"


def test_another_tenants_deposits_are_invisible(
    client: FlaskClient, tenant: TenantKeys, other_tenant: TenantKeys, seeded: dict[str, Any]
) -> None:
    # (a NUL in the path is a 400 on every route: test_control_characters.py)
    for deposit_id in (seeded["ids"][0], "dep_01NOSUCHDEPOSIT0000000000", "a" * 300):
        response = client.get(f"/v1/deposits/{deposit_id}", headers=other_tenant.headers)
        assert_error(response, 404, "not_found")
    assert listed(client, other_tenant.headers) == []
    assert listed(client, other_tenant.headers, "?externalUserId=alice") == []


def test_scopes_and_bad_queries(
    client: FlaskClient, tenant: TenantKeys, seeded: dict[str, Any]
) -> None:
    deposit_id = seeded["ids"][0]
    wrong = tenant.key_with("deposit_accounts:read", "sandbox:write")
    assert_error(client.get("/v1/deposits", headers=wrong), 403, "insufficient_scope")
    assert_error(client.get(f"/v1/deposits/{deposit_id}", headers=wrong), 403, "insufficient_scope")
    assert_error(client.get("/v1/deposits"), 401, "unauthorized")
    read_only = tenant.key_with("deposits:read")
    assert client.get(f"/v1/deposits/{deposit_id}", headers=read_only).status_code == 200
    for query in (
        "?limit=0",
        "?limit=201",
        "?limit=x",
        "?status=done",
        "?chainId=abc",
        "?createdAfter=yesterday",
        "?cursor=!!!",
        "?cursor=eyJwayI6MX0",  # a cursor of another list ({"pk": 1})
        "?chainId=99999999999",
        "?externalUserId=a%00b",
    ):
        assert_error(
            client.get(f"/v1/deposits{query}", headers=tenant.headers), 400, "invalid_request"
        )
