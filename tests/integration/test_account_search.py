"""GET /v1/deposit-accounts?depositAddress=...: which account an address belongs to.

Support staff hold an address from a block explorer or a user's screenshot, in
whatever case it was copied. The answer is the tenant's account owning it (a list of
at most one), never another tenant's, found through the address's unique index.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.conftest import TenantKeys
from tests.integration.conftest import assert_error, destination

pytestmark = pytest.mark.integration


def make(client: FlaskClient, tenant: TenantKeys, user: str) -> dict[str, Any]:
    response = client.post(
        "/v1/deposit-accounts",
        json={"externalUserId": user, "destination": destination()},
        headers=tenant.headers,
    )
    assert response.status_code == 200, response.get_json()
    account: dict[str, Any] = response.get_json()["depositAccount"]
    return account


def found(client: FlaskClient, tenant: TenantKeys, address: str) -> list[str]:
    response = client.get(f"/v1/deposit-accounts?depositAddress={address}", headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["nextCursor"] is None
    return [a["externalUserId"] for a in body["depositAccounts"]]


def test_each_address_in_any_case_finds_its_account_and_only_it(
    client: FlaskClient, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    # Given two accounts of a tenant, and one of another tenant
    mine, also_mine = make(client, tenant, "alice"), make(client, tenant, "bob")
    theirs = make(client, other_tenant, "carol")
    # When support searches by each of alice's addresses, as copied from anywhere
    for item in mine["depositAddresses"]:
        address = item["address"]
        for form in (address, address.lower(), "0x" + address[2:].upper()):
            # Then alice's account, alone
            assert found(client, tenant, form) == ["alice"], form
    assert found(client, tenant, also_mine["depositAddresses"][0]["address"]) == ["bob"]
    # And another tenant's address finds nothing (as one nobody owns)
    assert found(client, tenant, theirs["depositAddresses"][0]["address"]) == []
    assert found(client, tenant, "0x" + "1" * 40) == []
    # And without the filter the list is the tenant's accounts, as before
    listed = client.get("/v1/deposit-accounts", headers=tenant.headers).get_json()
    assert {a["externalUserId"] for a in listed["depositAccounts"]} == {"alice", "bob"}


@pytest.mark.parametrize(
    "value",
    [
        "0x123",
        "not-an-address",
        "0x" + "g" * 40,
        "0x5AAEB6053F3E94C9B9A09F33669435E7EF1BEAEd"[:-1] + "D" + "x",
        "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeD",  # mixed case, wrong checksum
        "%00",
        "0x" + "a" * 400,
    ],
)
def test_a_malformed_address_is_400_naming_the_field(
    client: FlaskClient, tenant: TenantKeys, value: str
) -> None:
    response = client.get(f"/v1/deposit-accounts?depositAddress={value}", headers=tenant.headers)
    body = assert_error(response, 400, "invalid_request")
    assert "depositAddress" in str(body), body
