"""Helpers of the core API integration tests: destinations, policies, members, outbox reads."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from services.core.models import OutboxEvent
from shared.db import Database
from shared.identity import service as identity
from shared.identity.auth import CSRF_HEADER
from tests.conftest import PASSWORD, TenantKeys, make_tenant
from tests.support.catalog import conforming

#: Canonical token contracts of chains.toml.
USDC_ETH = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"
USDT_ETH = "0xdAC17F958D2ee523a2206206994597C13D831ec7"
USDC_POLYGON = "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359"
USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
#: Arbitrum One's USDC: a real token on a declared chain.
USDC_ARBITRUM = "0xaf88d065e77c8cC2239327C5EDb3A432268e5831"
#: Plain wallets (EIP-55 test vectors).
WALLET = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
WALLET_2 = "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359"
WALLET_3 = "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB"

#: The millisecond UTC timestamp format of DESIGN.md.
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
#: Chains the interface names as declared-but-inactive and as unknown.
NOT_ACTIVE_CHAINS = (42161, 999_999)


def destination(
    chain_id: Any = 8453, address: Any = WALLET, token_address: Any = USDC_BASE
) -> dict[str, Any]:
    return {"chainId": chain_id, "address": address, "tokenAddress": token_address}


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The DESIGN.md error format with this status and code."""
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True))
    assert response.mimetype == "application/json"
    body: dict[str, Any] = response.get_json()
    assert body["code"] == code, body
    assert body["error"].startswith(f"{code}: "), body
    return body


def put_policy(client: FlaskClient, tenant: TenantKeys, **dest: Any) -> dict[str, Any]:
    response = client.put(
        "/v1/destination-policy", json={"destination": destination(**dest)}, headers=tenant.headers
    )
    assert response.status_code == 200, response.get_json()
    policy: dict[str, Any] = response.get_json()["destinationPolicy"]
    return policy


def create_account(
    client: FlaskClient, tenant: TenantKeys, external_user_id: str | None = None, **body: Any
) -> dict[str, Any]:
    payload = {"externalUserId": external_user_id or f"user-{uuid.uuid4().hex[:12]}", **body}
    response = client.post("/v1/deposit-accounts", json=payload, headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    account: dict[str, Any] = response.get_json()["depositAccount"]
    return account


def outbox_events(
    db: Database, tenant_id: str, event_type: str | None = None
) -> list[dict[str, Any]]:
    """The tenant's outbox envelopes, oldest first; each matches the event catalog."""
    query = sa.select(OutboxEvent.body).where(OutboxEvent.tenant_id == tenant_id)
    if event_type is not None:
        query = query.where(OutboxEvent.event_type == event_type)
    with db.reader() as session:
        bodies = session.scalars(query.order_by(OutboxEvent.id))
        return [conforming(json.loads(body)) for body in bodies]


@pytest.fixture
def policy_tenant(client: FlaskClient, tenant: TenantKeys) -> TenantKeys:
    """A tenant whose destination policy is USDC on Base to WALLET."""
    put_policy(client, tenant)
    return tenant


@dataclass
class Portal:
    """A tenant with one member per role used in tests (argon2 is slow: made once per module)."""

    tenant: TenantKeys
    emails: dict[str, str]

    def client(self, app: Flask, role: str) -> tuple[FlaskClient, str]:
        """A test client signed in as the member with `role`, and its CSRF token."""
        client = app.test_client()
        response = client.post(
            "/v1/sessions", json={"email": self.emails[role], "password": PASSWORD}
        )
        assert response.status_code == 200, response.get_json()
        csrf: str = response.get_json()["session"]["csrfToken"]
        return client, csrf


@pytest.fixture(scope="module")
def portal(pg_db: Database) -> Portal:
    tenant = make_tenant(pg_db)
    emails = {}
    with pg_db.transaction() as session:
        for role in ("viewer", "developer"):
            email = f"{role}-{uuid.uuid4().hex[:10]}@example.com"
            identity.add_member(session, tenant.tenant_id, email, role, PASSWORD)
            emails[role] = email
    return Portal(tenant, emails)


def csrf_headers(csrf: str) -> dict[str, str]:
    return {CSRF_HEADER: csrf}
