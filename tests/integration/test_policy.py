"""The tenant destination policy, by API key and by portal session, on real PostgreSQL."""

from __future__ import annotations

import time
import uuid

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import TenantKeys
from tests.integration.conftest import (
    NOT_ACTIVE_CHAINS,
    TIMESTAMP,
    USDC_ARBITRUM,
    USDC_BASE,
    USDC_ETH,
    USDT_ETH,
    WALLET,
    WALLET_2,
    Portal,
    assert_error,
    csrf_headers,
    destination,
)

pytestmark = pytest.mark.integration

PATH = "/v1/destination-policy"


def test_no_policy_reads_as_null(client: FlaskClient, tenant: TenantKeys) -> None:
    # Given a new tenant, when it reads its policy, then it is null
    response = client.get(PATH, headers=tenant.headers)
    assert response.status_code == 200
    assert response.get_json() == {"destinationPolicy": None}


def test_put_creates_then_replaces_keeping_created_at(
    client: FlaskClient, tenant: TenantKeys
) -> None:
    # Given a policy created with a lower-case address and a venue
    first = client.put(
        PATH,
        json={"destination": destination(8453, WALLET.lower(), USDC_BASE), "venue": "Treasury"},
        headers=tenant.headers,
    )
    assert first.status_code == 200
    created = first.get_json()["destinationPolicy"]
    assert created == {
        "tenantId": tenant.tenant_id,
        "destination": destination(8453, WALLET, USDC_BASE),
        "venue": "Treasury",
        "createdAt": created["createdAt"],
        "updatedAt": created["createdAt"],
    }
    assert TIMESTAMP.match(created["createdAt"])
    time.sleep(0.002)

    # When it is replaced without a venue
    second = client.put(
        PATH, json={"destination": destination(1, WALLET_2, USDT_ETH)}, headers=tenant.headers
    )

    # Then the destination and venue are replaced, createdAt kept, updatedAt moved
    replaced = second.get_json()["destinationPolicy"]
    assert replaced["destination"] == destination(1, WALLET_2, USDT_ETH)
    assert replaced["venue"] is None
    assert replaced["createdAt"] == created["createdAt"]
    assert replaced["updatedAt"] > created["updatedAt"]
    assert TIMESTAMP.match(replaced["updatedAt"])
    assert client.get(PATH, headers=tenant.headers).get_json() == {"destinationPolicy": replaced}


def test_venue_may_have_120_characters_not_121(client: FlaskClient, tenant: TenantKeys) -> None:
    ok = client.put(
        PATH, json={"destination": destination(), "venue": "v" * 120}, headers=tenant.headers
    )
    assert ok.status_code == 200 and ok.get_json()["destinationPolicy"]["venue"] == "v" * 120
    body = assert_error(
        client.put(
            PATH, json={"destination": destination(), "venue": "v" * 121}, headers=tenant.headers
        ),
        400,
        "invalid_request",
    )
    assert "venue" in body["error"]
    # The refused write changed nothing.
    assert client.get(PATH, headers=tenant.headers).get_json()["destinationPolicy"]["venue"] == (
        "v" * 120
    )


@pytest.mark.parametrize("chain_id", NOT_ACTIVE_CHAINS)
def test_put_with_a_chain_that_is_not_active_is_unsupported_chain(
    client: FlaskClient, tenant: TenantKeys, chain_id: int
) -> None:
    response = client.put(
        PATH,
        json={"destination": destination(chain_id, WALLET, USDC_ARBITRUM)},
        headers=tenant.headers,
    )
    assert_error(response, 400, "unsupported_chain")
    assert client.get(PATH, headers=tenant.headers).get_json() == {"destinationPolicy": None}


@pytest.mark.parametrize(
    ("dest", "field"),
    [
        (destination(8453, WALLET, USDC_ETH), "destination.tokenAddress"),  # Ethereum's USDC
        (destination(8453, "0x" + "0" * 40, USDC_BASE), "destination.address"),
        (destination(8453, USDC_BASE, USDC_BASE), "destination.address"),
        (destination(8453, WALLET.replace("aAeb", "AAeb"), USDC_BASE), "destination.address"),
        (destination(8453, WALLET, "0x123"), "destination.tokenAddress"),
        ({"chainId": 8453, "address": WALLET}, "destination.tokenAddress"),
    ],
)
def test_bad_destinations_name_the_field(
    client: FlaskClient, tenant: TenantKeys, dest: dict[str, object], field: str
) -> None:
    body = assert_error(
        client.put(PATH, json={"destination": dest}, headers=tenant.headers),
        400,
        "invalid_request",
    )
    assert field in body["details"]["fields"], body


def test_scopes(client: FlaskClient, tenant: TenantKeys) -> None:
    # Without a key: 401; with a key lacking the scope: 403 insufficient_scope
    body = {"destination": destination()}
    assert_error(client.get(PATH), 401, "unauthorized")
    assert_error(client.put(PATH, json=body), 401, "unauthorized")
    reader = tenant.key_with("destination_policy:read")
    writer = tenant.key_with("destination_policy:write")
    assert_error(client.get(PATH, headers=writer), 403, "insufficient_scope")
    assert_error(client.put(PATH, json=body, headers=reader), 403, "insufficient_scope")
    assert client.put(PATH, json=body, headers=writer).status_code == 200
    assert client.get(PATH, headers=reader).status_code == 200


def _tenant_path(tenant_id: str) -> str:
    return f"/v1/tenants/{tenant_id}/destination-policy"


def test_members_read_and_developers_write_the_same_policy(
    core_app: Flask, client: FlaskClient, portal: Portal
) -> None:
    tenant = portal.tenant
    path = _tenant_path(tenant.tenant_id)
    viewer, viewer_csrf = portal.client(core_app, "viewer")
    developer, developer_csrf = portal.client(core_app, "developer")

    # Given a developer writes the policy through the portal
    written = developer.put(
        path,
        json={
            "destination": destination(137, WALLET, "0x3c499c542cef5e3811e1192ce70d8cc03d5c3359")
        },
        headers=csrf_headers(developer_csrf),
    )
    assert written.status_code == 200, written.get_json()
    policy = written.get_json()["destinationPolicy"]
    assert policy["destination"]["tokenAddress"] == "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359"

    # Then a viewer reads it, and the API key reads the same policy
    assert viewer.get(path).get_json() == {"destinationPolicy": policy}
    assert client.get(PATH, headers=tenant.headers).get_json() == {"destinationPolicy": policy}

    # But a viewer may not write it, even with the CSRF token
    assert_error(
        viewer.put(path, json={"destination": destination()}, headers=csrf_headers(viewer_csrf)),
        403,
        "forbidden",
    )
    # And a developer without the CSRF header is refused
    assert_error(developer.put(path, json={"destination": destination()}), 403, "forbidden")
    # And a declared chain is unsupported here too
    for chain_id in NOT_ACTIVE_CHAINS:
        assert_error(
            developer.put(
                path,
                json={"destination": destination(chain_id, WALLET, USDC_ARBITRUM)},
                headers=csrf_headers(developer_csrf),
            ),
            400,
            "unsupported_chain",
        )
    assert viewer.get(path).get_json() == {"destinationPolicy": policy}


def test_other_tenants_and_non_uuids_are_not_found(
    core_app: Flask, client: FlaskClient, portal: Portal, other_tenant: TenantKeys
) -> None:
    developer, csrf = portal.client(core_app, "developer")
    for tenant_id in (other_tenant.tenant_id, str(uuid.uuid4()), "not-a-uuid"):
        assert_error(developer.get(_tenant_path(tenant_id)), 404, "not_found")
        assert_error(
            developer.put(
                _tenant_path(tenant_id),
                json={"destination": destination()},
                headers=csrf_headers(csrf),
            ),
            404,
            "not_found",
        )
    # The other tenant's policy was not touched
    assert client.get(PATH, headers=other_tenant.headers).get_json() == {"destinationPolicy": None}


def test_tenant_policy_needs_a_session(client: FlaskClient, portal: Portal) -> None:
    path = _tenant_path(portal.tenant.tenant_id)
    assert_error(client.get(path), 401, "unauthorized")
    # An API key is not a session
    assert_error(client.get(path, headers=portal.tenant.headers), 401, "unauthorized")
