"""Every bad input we could think of answers a 4xx in the DESIGN.md error format, never a
500, and writes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient

from shared.db import Database
from tests.conftest import TenantKeys
from tests.integration.conftest import (
    USDC_BASE,
    WALLET,
    assert_error,
    create_account,
    destination,
    outbox_events,
)

pytestmark = pytest.mark.integration

ACCOUNTS = "/v1/deposit-accounts"
POLICY = "/v1/destination-policy"
FEES = "/v1/fee-preview"
#: Filled in by the fixture: an account that exists, so PATCHes reach validation.
EXISTING = "existing-user"
PATCH = f"{ACCOUNTS}/{EXISTING}/destination"

JSON = "application/json"
DEST = json.dumps(destination())


def _raw_dest(chain_id: str) -> str:
    return f'{{"chainId": {chain_id}, "address": "{WALLET}", "tokenAddress": "{USDC_BASE}"}}'


# (method, path, raw body, content type, status, code)
RAW_CASES: list[tuple[str, str, str | bytes | None, str | None, int, str]] = [
    # Bodies that are not JSON objects
    ("POST", ACCOUNTS, "{bad", JSON, 400, "invalid_json"),
    ("POST", ACCOUNTS, b"\xff\xfe\x00", JSON, 400, "invalid_json"),
    ("POST", ACCOUNTS, "", JSON, 400, "invalid_request"),
    ("POST", ACCOUNTS, "null", JSON, 400, "invalid_request"),
    ("POST", ACCOUNTS, "[]", JSON, 400, "invalid_request"),
    ("POST", ACCOUNTS, '[{"externalUserId": "a"}]', JSON, 400, "invalid_request"),
    ("POST", ACCOUNTS, '"text"', JSON, 400, "invalid_request"),
    ("POST", ACCOUNTS, "42", JSON, 400, "invalid_request"),
    ("PUT", POLICY, "{bad", JSON, 400, "invalid_json"),
    ("PATCH", PATCH, "[1]", JSON, 400, "invalid_request"),
    ("POST", FEES, "{", JSON, 400, "invalid_json"),
    # A body sent without a JSON content type is refused, asking for application/json
    ("POST", ACCOUNTS, '{"externalUserId": "a"}', "text/plain", 415, "unsupported_media_type"),
    ("POST", ACCOUNTS, '{"externalUserId": "a"}', None, 415, "unsupported_media_type"),
    (
        "POST",
        ACCOUNTS,
        "externalUserId=a",
        "application/x-www-form-urlencoded",
        415,
        "unsupported_media_type",
    ),
    # Numbers Python's JSON reader refuses or turns into non-finite floats
    (
        "POST",
        ACCOUNTS,
        '{"externalUserId": "a", "destination": ' + _raw_dest("1" * 5000) + "}",
        JSON,
        400,
        "invalid_json",
    ),
    (
        "POST",
        ACCOUNTS,
        '{"externalUserId": "a", "metadata": {"x": NaN}}',
        JSON,
        400,
        "invalid_request",
    ),
    (
        "POST",
        ACCOUNTS,
        '{"externalUserId": "a", "metadata": {"x": Infinity}}',
        JSON,
        400,
        "invalid_request",
    ),
    (
        "POST",
        ACCOUNTS,
        '{"externalUserId": "a", "metadata": {"x": 1e400}}',
        JSON,
        400,
        "invalid_request",
    ),
    # Text PostgreSQL cannot store
    ("POST", ACCOUNTS, '{"externalUserId": "a\\u0000b"}', JSON, 400, "invalid_request"),
    ("POST", ACCOUNTS, '{"externalUserId": "\\ud800"}', JSON, 400, "invalid_request"),
    (
        "POST",
        ACCOUNTS,
        '{"externalUserId": "a", "metadata": {"x": "\\u0000"}}',
        JSON,
        400,
        "invalid_request",
    ),
    (
        "POST",
        ACCOUNTS,
        '{"externalUserId": "a", "metadata": {"x": "\\udc00"}}',
        JSON,
        400,
        "invalid_request",
    ),
    (
        "POST",
        ACCOUNTS,
        '{"externalUserId": "a", "metadata": {"\\ud800": 1}}',
        JSON,
        400,
        "invalid_request",
    ),
    (
        "PUT",
        POLICY,
        '{"destination": ' + DEST + ', "venue": "a\\u0000"}',
        JSON,
        400,
        "invalid_request",
    ),
    (
        "PUT",
        POLICY,
        '{"destination": ' + DEST + ', "venue": "\\ud800"}',
        JSON,
        400,
        "invalid_request",
    ),
    # Over 256 KiB
    (
        "POST",
        ACCOUNTS,
        '{"externalUserId": "' + "a" * 270_000 + '"}',
        JSON,
        413,
        "payload_too_large",
    ),
    ("PUT", POLICY, '{"venue": "' + "a" * 270_000 + '"}', JSON, 413, "payload_too_large"),
    ("POST", FEES, '{"amount": "' + "1" * 270_000 + '"}', JSON, 413, "payload_too_large"),
    # Methods the routes do not have
    ("DELETE", ACCOUNTS, None, None, 405, "method_not_allowed"),
    ("PUT", f"{ACCOUNTS}/{EXISTING}", "{}", JSON, 405, "method_not_allowed"),
    ("POST", POLICY, "{}", JSON, 405, "method_not_allowed"),
    ("GET", FEES, None, None, 405, "method_not_allowed"),
]


# (method, path, JSON body, status, code, field named in details)
JSON_CASES: list[tuple[str, str, Any, int, str, str]] = [
    # externalUserId
    ("POST", ACCOUNTS, {}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": ""}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": "   "}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": "x" * 256}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": "tab\there"}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": "line\nbreak"}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": None}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": 42}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": ["a"]}, 400, "invalid_request", "externalUserId"),
    ("POST", ACCOUNTS, {"externalUserId": {"a": 1}}, 400, "invalid_request", "externalUserId"),
    # Unknown fields (a typo must not fall back to the policy)
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destinaton": destination()},
        400,
        "invalid_request",
        "destinaton",
    ),
    ("PUT", POLICY, {"destination": destination(), "venu": "x"}, 400, "invalid_request", "venu"),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": {**destination(), "memo": 1}},
        400,
        "invalid_request",
        "destination.memo",
    ),
    # destination: wrong types, nulls, missing parts
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": None},
        400,
        "invalid_request",
        "destination",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": "8453"},
        400,
        "invalid_request",
        "destination",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": []},
        400,
        "invalid_request",
        "destination",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": {}},
        400,
        "invalid_request",
        "destination.chainId",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": {"chainId": 8453}},
        400,
        "invalid_request",
        "destination.address",
    ),
    ("PUT", POLICY, {}, 400, "invalid_request", "destination"),
    ("PUT", POLICY, {"destination": None}, 400, "invalid_request", "destination"),
    ("PATCH", PATCH, {}, 400, "invalid_request", "destination"),
    ("PATCH", PATCH, {"destination": None}, 400, "invalid_request", "destination"),
    # chainId: booleans, floats, strings, null
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(True)},
        400,
        "invalid_request",
        "destination.chainId",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453.0)},
        400,
        "invalid_request",
        "destination.chainId",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453.5)},
        400,
        "invalid_request",
        "destination.chainId",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination("8453")},
        400,
        "invalid_request",
        "destination.chainId",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(None)},
        400,
        "invalid_request",
        "destination.chainId",
    ),
    (
        "PUT",
        POLICY,
        {"destination": destination(False)},
        400,
        "invalid_request",
        "destination.chainId",
    ),
    (
        "PATCH",
        PATCH,
        {"destination": destination("1")},
        400,
        "invalid_request",
        "destination.chainId",
    ),
    # Huge, negative and zero chain ids are simply not active chains
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(2**70)},
        400,
        "unsupported_chain",
        "",
    ),
    ("PUT", POLICY, {"destination": destination(-1)}, 400, "unsupported_chain", ""),
    ("PATCH", PATCH, {"destination": destination(0)}, 400, "unsupported_chain", ""),
    ("POST", FEES, {"chainId": 10**30, "amount": "1"}, 400, "unsupported_chain", ""),
    # Addresses
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453, "")},
        400,
        "invalid_request",
        "destination.address",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453, WALLET[2:])},
        400,
        "invalid_request",
        "destination.address",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453, WALLET + "00")},
        400,
        "invalid_request",
        "destination.address",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453, "0x" + "zz" * 20)},
        400,
        "invalid_request",
        "destination.address",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453, 12345)},
        400,
        "invalid_request",
        "destination.address",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453, "0x" + "0" * 40)},
        400,
        "invalid_request",
        "destination.address",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "destination": destination(8453, "\uff10x" + "1" * 40)},
        400,
        "invalid_request",
        "destination.address",
    ),
    (
        "PUT",
        POLICY,
        {"destination": destination(8453, WALLET, None)},
        400,
        "invalid_request",
        "destination.tokenAddress",
    ),
    (
        "PUT",
        POLICY,
        {"destination": destination(8453, WALLET, WALLET)},
        400,
        "invalid_request",
        "destination.tokenAddress",
    ),
    (
        "PATCH",
        PATCH,
        {"destination": destination(8453, WALLET, USDC_BASE.lower().replace("0x8", "0X8"))},
        400,
        "invalid_request",
        "destination.tokenAddress",
    ),
    # metadata
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "metadata": None},
        400,
        "invalid_request",
        "metadata",
    ),
    ("POST", ACCOUNTS, {"externalUserId": "a", "metadata": []}, 400, "invalid_request", "metadata"),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "metadata": "tier=gold"},
        400,
        "invalid_request",
        "metadata",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "metadata": {"nested": {"a": 1}}},
        400,
        "invalid_request",
        "metadata.nested",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "metadata": {"list": [1, 2]}},
        400,
        "invalid_request",
        "metadata.list",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "metadata": {f"k{i}": i for i in range(51)}},
        400,
        "invalid_request",
        "metadata",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "metadata": {"k" * 41: 1}},
        400,
        "invalid_request",
        "metadata." + "k" * 41,
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "metadata": {"": 1}},
        400,
        "invalid_request",
        "metadata.",
    ),
    (
        "POST",
        ACCOUNTS,
        {"externalUserId": "a", "metadata": {"s": "x" * 501}},
        400,
        "invalid_request",
        "metadata.s",
    ),
    # venue
    ("PUT", POLICY, {"destination": destination(), "venue": 5}, 400, "invalid_request", "venue"),
    (
        "PUT",
        POLICY,
        {"destination": destination(), "venue": {"a": 1}},
        400,
        "invalid_request",
        "venue",
    ),
    (
        "PUT",
        POLICY,
        {"destination": destination(), "venue": "é" * 121},
        400,
        "invalid_request",
        "venue",
    ),
    (
        "PUT",
        POLICY,
        {"destination": destination(), "venue": "new\nline"},
        400,
        "invalid_request",
        "venue",
    ),
    # fee preview
    ("POST", FEES, {"amount": ""}, 400, "invalid_request", "amount"),
    ("POST", FEES, {"amount": "1,5"}, 400, "invalid_request", "amount"),
    ("POST", FEES, {"amount": "NaN"}, 400, "invalid_request", "amount"),
    ("POST", FEES, {"amount": "Infinity"}, 400, "invalid_request", "amount"),
    ("POST", FEES, {"amount": "\uff15"}, 400, "invalid_request", "amount"),
    ("POST", FEES, {"amount": True}, 400, "invalid_request", "amount"),
    ("POST", FEES, {"amount": "1", "asset": 5}, 400, "invalid_request", "asset"),
    ("POST", FEES, {"amount": "1", "asset": "U" * 21}, 400, "invalid_request", "asset"),
]


@pytest.fixture
def target(client: FlaskClient, policy_tenant: TenantKeys) -> TenantKeys:
    """A tenant with a policy and one account, so any sloppy validation would write."""
    create_account(client, policy_tenant, EXISTING)
    return policy_tenant


def _assert_nothing_written(client: FlaskClient, tenant: TenantKeys, pg_db: Database) -> None:
    listed = client.get(ACCOUNTS, headers=tenant.headers).get_json()["depositAccounts"]
    assert [a["externalUserId"] for a in listed] == [EXISTING]
    assert listed[0]["destination"] == destination()
    policy = client.get(POLICY, headers=tenant.headers).get_json()["destinationPolicy"]
    assert policy["destination"] == destination() and policy["venue"] is None
    types = [e["type"] for e in outbox_events(pg_db, tenant.tenant_id)]
    assert types == ["deposit.account.created"]


@pytest.mark.parametrize(("method", "path", "data", "content_type", "status", "code"), RAW_CASES)
def test_raw_bodies(
    client: FlaskClient,
    target: TenantKeys,
    pg_db: Database,
    method: str,
    path: str,
    data: str | bytes | None,
    content_type: str | None,
    status: int,
    code: str,
) -> None:
    headers = dict(target.headers)
    if content_type is not None:
        headers["Content-Type"] = content_type
    assert_error(client.open(path, method=method, data=data, headers=headers), status, code)
    _assert_nothing_written(client, target, pg_db)


@pytest.mark.parametrize(("method", "path", "body", "status", "code", "field"), JSON_CASES)
def test_json_bodies(
    client: FlaskClient,
    target: TenantKeys,
    pg_db: Database,
    method: str,
    path: str,
    body: Any,
    status: int,
    code: str,
    field: str,
) -> None:
    response = client.open(path, method=method, json=body, headers=target.headers)
    error = assert_error(response, status, code)
    if field:
        assert field in error["details"]["fields"], error
    _assert_nothing_written(client, target, pg_db)


def test_bad_input_with_an_idempotency_key_is_remembered_but_writes_nothing(
    client: FlaskClient, target: TenantKeys, pg_db: Database
) -> None:
    headers = {**target.headers, "Idempotency-Key": "bad-once"}
    first = client.post(ACCOUNTS, json={"externalUserId": ""}, headers=headers)
    again = client.post(ACCOUNTS, json={"externalUserId": ""}, headers=headers)
    assert_error(first, 400, "invalid_request")
    assert again.get_data() == first.get_data()
    assert_error(
        client.post(
            ACCOUNTS,
            json={"externalUserId": "x" * 300},
            headers={**target.headers, "Idempotency-Key": "k" * 256},
        ),
        400,
        "invalid_request",
    )
    _assert_nothing_written(client, target, pg_db)


def test_unknown_paths_and_lookups_are_404_json(client: FlaskClient, target: TenantKeys) -> None:
    # (a NUL in the path is a 400 on every route: test_control_characters.py)
    assert_error(
        client.get("/v1/deposit-accounts/a%00b", headers=target.headers), 400, "invalid_request"
    )
    for path in (
        "/v1/deposit-accounts/" + "x" * 300,
        "/v1/deposit-accounts/%F0%9F%99%82",
        "/v1/nope",
        "/v1/deposit-accounts/x/destination/extra",
    ):
        assert_error(client.get(path, headers=target.headers), 404, "not_found")
