"""Deposit accounts over HTTP on real PostgreSQL: creation, reads, lists, destination changes,
their outbox events, idempotency and tenant isolation."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import sqlalchemy as sa
from eth_account import Account
from flask import Flask
from flask.testing import FlaskClient

from services.core import account_store, accounts, deposit_keys
from services.core.addresses import private_key_for
from services.core.context import CoreContext
from services.core.destinations import Destination
from services.core.models import DepositAccount, DepositAddress
from shared.db import Database
from shared.errors import AccountExists
from tests.conftest import TenantKeys
from tests.integration.conftest import (
    NOT_ACTIVE_CHAINS,
    TIMESTAMP,
    USDC_ARBITRUM,
    USDC_BASE,
    USDC_ETH,
    USDC_POLYGON,
    USDT_ETH,
    WALLET,
    WALLET_2,
    WALLET_3,
    assert_error,
    create_account,
    destination,
    outbox_events,
    put_policy,
)
from tests.support import keys

pytestmark = pytest.mark.integration

PATH = "/v1/deposit-accounts"
CREATED = "deposit.account.created"
UPDATED = "deposit.account.destination_updated"


def _uid() -> str:
    return f"user-{uuid.uuid4().hex[:12]}"


def _account_row(db: Database, account_id: str) -> DepositAccount:
    with db.reader() as session:
        row = session.scalars(
            sa.select(DepositAccount).where(DepositAccount.id == account_id)
        ).one()
        session.expunge(row)
        return row


def _count_accounts(db: Database, tenant_id: str) -> int:
    with db.reader() as session:
        return (
            session.scalar(sa.select(sa.func.count()).where(DepositAccount.tenant_id == tenant_id))
            or 0
        )


def test_created_account_has_one_address_per_active_chain(
    client: FlaskClient, tenant: TenantKeys, core_context: CoreContext, pg_db: Database
) -> None:
    # When an account is created with an explicit destination (addresses in lower case)
    uid = _uid()
    response = client.post(
        PATH,
        json={
            "externalUserId": uid,
            "destination": destination(1, WALLET.lower(), USDC_ETH.lower()),
        },
        headers=tenant.headers,
    )

    # Then it is active, checksummed, with {} metadata and ms timestamps
    assert response.status_code == 200, response.get_json()
    account = response.get_json()["depositAccount"]
    assert list(account) == [
        "id",
        "externalUserId",
        "status",
        "destination",
        "depositAddresses",
        "metadata",
        "createdAt",
        "updatedAt",
    ]
    assert account["id"].startswith("acc_")
    assert account["externalUserId"] == uid
    assert account["status"] == "active"
    assert account["destination"] == destination(1, WALLET, USDC_ETH)
    assert account["metadata"] == {}
    assert TIMESTAMP.match(account["createdAt"]) and account["updatedAt"] == account["createdAt"]

    # And one deposit address per active chain, in chains-file order, with that chain's assets
    active = core_context.registry.active()
    assert [c.chain_id for c in active] == [1, 137, 8453]
    assert [a["chainId"] for a in account["depositAddresses"]] == [1, 137, 8453]
    for chain, entry in zip(active, account["depositAddresses"], strict=True):
        assert entry["assets"] == [asset.symbol for asset in chain.assets]
    assert account["depositAddresses"][0]["assets"] == ["USDC", "USDT", "DAI"]
    assert "USDT" not in account["depositAddresses"][2]["assets"]
    addresses = [entry["address"] for entry in account["depositAddresses"]]
    assert len(set(addresses)) == 3

    # And each address is the one the deposit xprv signs for at <chainId>/<address index>
    index = _account_row(pg_db, account["id"]).derivation_index
    for entry in account["depositAddresses"]:
        key = private_key_for(keys.test_xprv(), entry["chainId"], index)
        assert Account.from_key(key).address == entry["address"]

    # And GET answers the same document
    got = client.get(f"{PATH}/{uid}", headers=tenant.headers)
    assert got.status_code == 200 and got.get_json() == {"depositAccount": account}


def test_metadata_round_trips(client: FlaskClient, tenant: TenantKeys) -> None:
    metadata = {
        "tier": "gold",
        "score": 7,
        "ratio": 0.25,
        "vip": True,
        "note": None,
        "k" * 40: "x" * 500,
    }
    account = create_account(client, tenant, destination=destination(), metadata=metadata)
    assert account["metadata"] == metadata
    got = client.get(f"{PATH}/{account['externalUserId']}", headers=tenant.headers)
    assert got.get_json()["depositAccount"]["metadata"] == metadata


def test_no_destination_and_no_policy_is_422(
    client: FlaskClient, tenant: TenantKeys, pg_db: Database
) -> None:
    response = client.post(PATH, json={"externalUserId": _uid()}, headers=tenant.headers)
    assert_error(response, 422, "destination_policy_missing")
    assert _count_accounts(pg_db, tenant.tenant_id) == 0
    assert outbox_events(pg_db, tenant.tenant_id) == []


def test_policy_is_copied_at_creation_and_later_changes_leave_accounts_alone(
    client: FlaskClient, tenant: TenantKeys
) -> None:
    # Given a policy, an account created without a destination copies it
    put_policy(client, tenant, chain_id=8453, address=WALLET, token_address=USDC_BASE)
    first = create_account(client, tenant)
    assert first["destination"] == destination(8453, WALLET, USDC_BASE)

    # When the policy changes
    put_policy(client, tenant, chain_id=137, address=WALLET_2, token_address=USDC_POLYGON)

    # Then the existing account keeps its destination; a new one takes the new policy
    got = client.get(f"{PATH}/{first['externalUserId']}", headers=tenant.headers)
    assert got.get_json()["depositAccount"]["destination"] == destination(8453, WALLET, USDC_BASE)
    second = create_account(client, tenant)
    assert second["destination"] == destination(137, WALLET_2, USDC_POLYGON)
    # And an explicit destination wins over the policy
    third = create_account(client, tenant, destination=destination(1, WALLET_3, USDT_ETH))
    assert third["destination"] == destination(1, WALLET_3, USDT_ETH)


@pytest.mark.parametrize("chain_id", NOT_ACTIVE_CHAINS)
def test_chains_that_are_not_active_are_unsupported_on_create_and_patch(
    client: FlaskClient, policy_tenant: TenantKeys, pg_db: Database, chain_id: int
) -> None:
    tenant = policy_tenant
    bad = destination(chain_id, WALLET, USDC_ARBITRUM)
    assert_error(
        client.post(
            PATH, json={"externalUserId": _uid(), "destination": bad}, headers=tenant.headers
        ),
        400,
        "unsupported_chain",
    )
    assert _count_accounts(pg_db, tenant.tenant_id) == 0
    account = create_account(client, tenant)
    assert_error(
        client.patch(
            f"{PATH}/{account['externalUserId']}/destination",
            json={"destination": bad},
            headers=tenant.headers,
        ),
        400,
        "unsupported_chain",
    )
    assert outbox_events(pg_db, tenant.tenant_id, UPDATED) == []


def test_token_of_another_chain_and_bad_checksums_are_refused(
    client: FlaskClient, policy_tenant: TenantKeys
) -> None:
    tenant = policy_tenant
    cases = {
        "destination.tokenAddress": destination(137, WALLET, USDC_ETH),
        "destination.address": destination(8453, WALLET.replace("aAeb", "AAeb"), USDC_BASE),
    }
    for field, bad in cases.items():
        body = assert_error(
            client.post(
                PATH, json={"externalUserId": _uid(), "destination": bad}, headers=tenant.headers
            ),
            400,
            "invalid_request",
        )
        assert field in body["details"]["fields"]


def test_external_user_id_is_unique_per_tenant(
    client: FlaskClient, policy_tenant: TenantKeys, other_tenant: TenantKeys, pg_db: Database
) -> None:
    uid = _uid()
    create_account(client, policy_tenant, uid)
    assert_error(
        client.post(PATH, json={"externalUserId": uid}, headers=policy_tenant.headers),
        409,
        "account_exists",
    )
    assert len(outbox_events(pg_db, policy_tenant.tenant_id, CREATED)) == 1
    # Another tenant may use the same id
    create_account(client, other_tenant, uid, destination=destination())


def test_tenant_isolation(
    client: FlaskClient, policy_tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    # Given an account of one tenant
    mine = create_account(client, policy_tenant)
    uid = mine["externalUserId"]

    # Then another tenant can neither read, change nor list it
    assert_error(client.get(f"{PATH}/{uid}", headers=other_tenant.headers), 404, "not_found")
    assert_error(
        client.patch(
            f"{PATH}/{uid}/destination",
            json={"destination": destination(1, WALLET_2, USDC_ETH)},
            headers=other_tenant.headers,
        ),
        404,
        "not_found",
    )
    listed = client.get(PATH, headers=other_tenant.headers).get_json()
    assert listed == {"depositAccounts": [], "nextCursor": None}
    # And the owner still sees it unchanged
    got = client.get(f"{PATH}/{uid}", headers=policy_tenant.headers).get_json()
    assert got == {"depositAccount": mine}
    assert_error(
        client.get(f"{PATH}/no-such-user", headers=policy_tenant.headers), 404, "not_found"
    )


def test_odd_external_user_ids_work_in_paths(
    client: FlaskClient, policy_tenant: TenantKeys
) -> None:
    for uid in ("alice@example.com", "ünïcødé-用户-🙂", "team/42", "with space", "x" * 255):
        account = create_account(client, policy_tenant, uid)
        path = f"{PATH}/{quote(uid, safe='')}"
        assert client.get(path, headers=policy_tenant.headers).get_json() == {
            "depositAccount": account
        }
        patched = client.patch(
            f"{path}/destination",
            json={"destination": destination(1, WALLET_2, USDC_ETH)},
            headers=policy_tenant.headers,
        )
        assert patched.status_code == 200, (uid, patched.get_json())
        assert patched.get_json()["depositAccount"]["externalUserId"] == uid


def test_default_limit_is_50_and_pages_cover_everything_once(
    client: FlaskClient, tenant: TenantKeys, core_context: CoreContext
) -> None:
    # Given 53 accounts (made through the same use case as the API)
    made = []
    for i in range(53):
        doc = accounts.create_account(
            core_context.db,
            core_context.registry,
            core_context.deriver,
            tenant.tenant_id,
            accounts.NewAccount(f"bulk-{i:02d}", Destination(8453, WALLET, USDC_BASE)),
            api_key_id=tenant.api_key_id,
        )
        made.append(doc["id"])

    # When listing without a limit, then 50 come back, newest first, with a cursor
    first = client.get(PATH, headers=tenant.headers).get_json()
    assert len(first["depositAccounts"]) == 50
    assert first["nextCursor"]
    assert [a["externalUserId"] for a in first["depositAccounts"][:2]] == ["bulk-52", "bulk-51"]

    # And the next page holds the rest
    second = client.get(
        PATH, query_string={"cursor": first["nextCursor"]}, headers=tenant.headers
    ).get_json()
    assert len(second["depositAccounts"]) == 3 and second["nextCursor"] is None
    seen = [a["id"] for a in first["depositAccounts"] + second["depositAccounts"]]
    assert sorted(seen) == sorted(made) and len(set(seen)) == 53

    # And small pages walk the same set without duplicates
    walked: list[str] = []
    cursor = None
    for _ in range(20):
        query: dict[str, Any] = {"limit": 7}
        if cursor:
            query["cursor"] = cursor
        page = client.get(PATH, query_string=query, headers=tenant.headers).get_json()
        walked += [a["id"] for a in page["depositAccounts"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert walked == seen
    # And limit 200 is the maximum
    assert (
        len(client.get(f"{PATH}?limit=200", headers=tenant.headers).get_json()["depositAccounts"])
        == 53
    )


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=201",
        "limit=abc",
        "limit=-1",
        "limit=1.5",
        "cursor=%%%",
        "cursor=eyJwayI6IngifQ",
        "cursor=bnVsbA",
    ],
)
def test_bad_list_parameters_are_400(client: FlaskClient, tenant: TenantKeys, query: str) -> None:
    body = assert_error(
        client.get(f"{PATH}?{query}", headers=tenant.headers), 400, "invalid_request"
    )
    assert query.split("=")[0] in body["error"]


def test_idempotent_creation(
    client: FlaskClient, policy_tenant: TenantKeys, pg_db: Database
) -> None:
    tenant = policy_tenant
    uid = _uid()
    headers = {**tenant.headers, "Idempotency-Key": f"create-{uid}"}
    body = {"externalUserId": uid, "metadata": {"a": 1}}

    # When the same request is sent twice with one key
    first = client.post(PATH, json=body, headers=headers)
    again = client.post(PATH, json=body, headers=headers)

    # Then the second answers the first's response, and one account exists
    assert first.status_code == again.status_code == 200
    assert again.get_data() == first.get_data()
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert _count_accounts(pg_db, tenant.tenant_id) == 1
    assert len(outbox_events(pg_db, tenant.tenant_id, CREATED)) == 1

    # And the key with another body is refused
    assert_error(
        client.post(PATH, json={**body, "externalUserId": _uid()}, headers=headers),
        409,
        "idempotency_key_reused",
    )
    assert _count_accounts(pg_db, tenant.tenant_id) == 1


def test_one_created_event_per_account_carries_the_account(
    client: FlaskClient, policy_tenant: TenantKeys, pg_db: Database
) -> None:
    tenant = policy_tenant
    made = [create_account(client, tenant) for _ in range(2)]
    events = outbox_events(pg_db, tenant.tenant_id, CREATED)
    assert [e["data"] for e in events] == [{"depositAccount": a} for a in made]
    for event in events:
        assert event["type"] == CREATED and event["tenantId"] == tenant.tenant_id
        assert event["id"].startswith("evt_") and TIMESTAMP.match(event["createdAt"])


def test_destination_change_emits_prior_destination_and_key(
    client: FlaskClient, policy_tenant: TenantKeys, pg_db: Database
) -> None:
    tenant = policy_tenant
    account = create_account(client, tenant)
    path = f"{PATH}/{account['externalUserId']}/destination"

    # When the destination changes (token in lower case)
    response = client.patch(
        path,
        json={"destination": destination(1, WALLET_2, USDC_ETH.lower())},
        headers=tenant.headers,
    )

    # Then the account shows it, checksummed, with updatedAt moved
    assert response.status_code == 200, response.get_json()
    updated = response.get_json()["depositAccount"]
    assert updated["destination"] == destination(1, WALLET_2, USDC_ETH)
    assert updated["depositAddresses"] == account["depositAddresses"]
    assert updated["createdAt"] == account["createdAt"]
    assert updated["updatedAt"] >= account["updatedAt"] and TIMESTAMP.match(updated["updatedAt"])
    assert client.get(f"{PATH}/{account['externalUserId']}", headers=tenant.headers).get_json() == {
        "depositAccount": updated
    }

    # And exactly one event carries the account, the prior destination and the key id
    events = outbox_events(pg_db, tenant.tenant_id, UPDATED)
    assert len(events) == 1
    assert events[0]["data"] == {
        "depositAccount": updated,
        "priorDestination": account["destination"],
        "apiKeyId": tenant.api_key_id,
    }
    assert list(events[0]["data"]) == ["depositAccount", "priorDestination", "apiKeyId"]
    # And the key is recorded on the account
    assert _account_row(pg_db, account["id"]).dest_set_by_key_id == tenant.api_key_id


def test_a_members_change_names_the_member_not_a_key(
    core_app: Flask, policy_tenant: TenantKeys, pg_db: Database
) -> None:
    # Given an account, and a developer of its tenant signed in to the portal
    tenant = policy_tenant
    account = create_account(core_app.test_client(), tenant)
    member = tenant.signed_in("developer")
    client = member.client(core_app)

    # When the member changes the destination with the session (no API key)
    response = client.patch(
        f"{PATH}/{account['externalUserId']}/destination",
        json={"destination": destination(1, WALLET_2, USDC_ETH)},
        headers=member.headers,
    )

    # Then the event says no key made it and which member did
    assert response.status_code == 200, response.get_json()
    events = outbox_events(pg_db, tenant.tenant_id, UPDATED)
    assert [e["data"]["apiKeyId"] for e in events] == [None]
    assert events[0]["data"]["memberId"] == member.member_id
    assert events[0]["data"]["priorDestination"] == account["destination"]
    assert _account_row(pg_db, account["id"]).dest_set_by_key_id is None


def test_concurrent_changes_report_each_others_prior_destination(
    core_app: Flask, policy_tenant: TenantKeys, pg_db: Database
) -> None:
    tenant = policy_tenant
    account = create_account(core_app.test_client(), tenant)
    path = f"{PATH}/{account['externalUserId']}/destination"
    targets = [destination(1, WALLET_2, USDC_ETH), destination(137, WALLET_3, USDC_POLYGON)]
    statuses: list[int] = []
    start = threading.Barrier(len(targets))

    def change(target: dict[str, Any]) -> None:
        client = core_app.test_client()
        start.wait(timeout=10)
        statuses.append(
            client.patch(path, json={"destination": target}, headers=tenant.headers).status_code
        )

    threads = [threading.Thread(target=change, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert statuses == [200, 200]

    # Then the two events form a chain: original -> first -> second
    events = [e["data"] for e in outbox_events(pg_db, tenant.tenant_id, UPDATED)]
    assert len(events) == 2
    assert events[0]["priorDestination"] == account["destination"]
    assert events[1]["priorDestination"] == events[0]["depositAccount"]["destination"]
    final = events[1]["depositAccount"]["destination"]
    got = core_app.test_client().get(f"{PATH}/{account['externalUserId']}", headers=tenant.headers)
    assert got.get_json()["depositAccount"]["destination"] == final


def test_destination_change_needs_a_destination(
    client: FlaskClient, policy_tenant: TenantKeys
) -> None:
    account = create_account(client, policy_tenant)
    path = f"{PATH}/{account['externalUserId']}/destination"
    for body in ({}, {"destination": None}, {"destination": {"chainId": 1}}):
        assert_error(
            client.patch(path, json=body, headers=policy_tenant.headers), 400, "invalid_request"
        )
    assert_error(
        client.patch(
            f"{PATH}/nobody/destination",
            json={"destination": destination()},
            headers=policy_tenant.headers,
        ),
        404,
        "not_found",
    )


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("get", PATH, "deposit_accounts:read"),
        ("post", PATH, "deposit_accounts:write"),
        ("get", f"{PATH}/someone", "deposit_accounts:read"),
        ("patch", f"{PATH}/someone/destination", "deposit_accounts:write"),
    ],
)
def test_scopes(
    client: FlaskClient, tenant: TenantKeys, method: str, path: str, scope: str
) -> None:
    body = {"externalUserId": "someone", "destination": destination()}
    send = getattr(client, method)
    assert_error(send(path, json=body), 401, "unauthorized")
    assert_error(
        send(path, json=body, headers={"Authorization": "Bearer sk_nope"}), 401, "unauthorized"
    )
    others = [
        s for s in ("deposit_accounts:read", "deposit_accounts:write", "fees:read") if s != scope
    ]
    assert_error(send(path, json=body, headers=tenant.key_with(*others)), 403, "insufficient_scope")


def test_a_failed_creation_writes_nothing_and_only_the_user_key_is_a_conflict(
    tenant: TenantKeys, core_context: CoreContext, pg_db: Database
) -> None:
    registry = core_context.registry

    def create(uid: str, deriver: accounts.Deriver) -> dict[str, Any]:
        new = accounts.NewAccount(uid, Destination(8453, WALLET, USDC_BASE))
        return accounts.create_account(
            pg_db, registry, deriver, tenant.tenant_id, new, api_key_id=None
        )

    # Given an account whose deposit address a second account will collide with
    first = create(_uid(), core_context.deriver)
    taken = first["depositAddresses"][0]["address"]

    class CollidingDeriver:
        xpub = core_context.deriver.xpub
        scheme = core_context.deriver.scheme

        def derive(self, chain_id: int, index: int) -> str:
            return taken

        def addresses(self, index: int, chain_ids: Iterable[int]) -> list[tuple[int, str]]:
            return [(chain_id, taken) for chain_id in chain_ids]

    # When the second creation fails at its address insert (after its account row),
    # on another unique key than the user's: an error, not account_exists
    uid = _uid()
    with pytest.raises(psycopg.errors.UniqueViolation):
        create(uid, CollidingDeriver())

    # Then neither its account, its addresses nor its event exist
    with pg_db.reader() as session:
        assert (
            session.scalar(sa.select(sa.func.count()).where(DepositAccount.external_user_id == uid))
            == 0
        )
        assert (
            session.scalar(sa.select(sa.func.count()).where(DepositAddress.address == taken)) == 1
        )
    assert len(outbox_events(pg_db, tenant.tenant_id, CREATED)) == 1

    # And a taken externalUserId is account_exists, also with nothing written
    with pytest.raises(AccountExists):
        create(first["externalUserId"], core_context.deriver)
    assert _count_accounts(pg_db, tenant.tenant_id) == 1
    assert len(outbox_events(pg_db, tenant.tenant_id, CREATED)) == 1


@pytest.mark.parametrize("given", [False, True], ids=["inherited", "given"])
def test_the_stored_rows_and_the_event_are_the_document(
    given: bool, policy_tenant: TenantKeys, core_context: CoreContext, pg_db: Database
) -> None:
    # Given a creation with a given destination, or inheriting the policy
    now = accounts.utcnow()
    dest = Destination(1, WALLET_2, USDT_ETH) if given else None
    metadata = {"tier": "gold", "n": 3, "ok": True, "none": None}
    registry, deriver = core_context.registry, core_context.deriver
    document = accounts.create_account(
        pg_db,
        registry,
        deriver,
        policy_tenant.tenant_id,
        accounts.NewAccount(_uid(), dest, metadata),
        api_key_id="key_x",
        now=now,
    )

    # Then the stored account row says what the document says
    row = _account_row(pg_db, document["id"])
    expected_dest = dest or Destination(8453, WALLET, USDC_BASE)
    assert (row.dest_chain_id, row.dest_address, row.dest_token_address) == (
        expected_dest.chain_id,
        expected_dest.address,
        expected_dest.token_address,
    )
    assert document["destination"] == expected_dest.document()
    assert (row.status, row.dest_set_by_key_id, row.metadata_, row.tenant_id) == (
        "active",
        "key_x",
        metadata,
        policy_tenant.tenant_id,
    )
    assert row.created_at == row.updated_at == now
    # And the stored addresses are the derived ones, one per active chain, in order
    with pg_db.reader() as session:
        stored = session.execute(
            sa.select(DepositAddress.chain_id, DepositAddress.address, DepositAddress.position)
            .where(DepositAddress.account_pk == row.pk)
            .order_by(DepositAddress.chain_id)
        ).all()
    assert [tuple(r) for r in stored] == sorted(
        (
            c.chain_id,
            deriver.derive(c.chain_id, row.derivation_index),
            registry.position(c.chain_id),
        )
        for c in registry.active()
    )
    # And the event carries exactly the document
    events = outbox_events(pg_db, policy_tenant.tenant_id, CREATED)
    assert events[-1]["data"] == {"depositAccount": document}


# --- creation's two round trips: a process's policy copies and blocks of indices -----


def _policy_row(db: Database, tenant_id: str, statement: str, **values: Any) -> None:
    """Change a tenant's policy row as another process would (behind this one's back)."""
    with db.transaction() as session:
        session.execute(sa.text(statement), {"tenant_id": tenant_id, **values})


def test_a_policy_changed_by_another_process_reaches_the_very_next_creation(
    client: FlaskClient, tenant: TenantKeys, pg_db: Database
) -> None:
    # Given a policy this process has copied by creating an account with it
    put_policy(client, tenant, chain_id=8453, address=WALLET, token_address=USDC_BASE)
    first = create_account(client, tenant)
    assert first["destination"] == destination(8453, WALLET, USDC_BASE)

    # When another process changes the policy (only the row changes, not this process's copy)
    _policy_row(
        pg_db,
        tenant.tenant_id,
        "UPDATE destination_policies SET chain_id = 137, address = :address, "
        "token_address = :token WHERE tenant_id = :tenant_id",
        address=WALLET_2,
        token=USDC_POLYGON,
    )

    # Then the next account takes the policy as it is now, in its answer, row and event
    second = create_account(client, tenant)
    assert second["destination"] == destination(137, WALLET_2, USDC_POLYGON)
    row = _account_row(pg_db, second["id"])
    assert (row.dest_chain_id, row.dest_address, row.dest_token_address) == (
        137,
        WALLET_2,
        USDC_POLYGON,
    )
    created = outbox_events(pg_db, tenant.tenant_id, CREATED)
    assert [e["data"]["depositAccount"] for e in created] == [first, second]
    # And the attempt its stale copy held back wrote nothing (one row per account)
    assert _count_accounts(pg_db, tenant.tenant_id) == 2

    # And a change back is seen as well (the copy is not trusted, only checked)
    _policy_row(
        pg_db,
        tenant.tenant_id,
        "UPDATE destination_policies SET chain_id = 8453, address = :address, "
        "token_address = :token WHERE tenant_id = :tenant_id",
        address=WALLET,
        token=USDC_BASE,
    )
    assert create_account(client, tenant)["destination"] == destination(8453, WALLET, USDC_BASE)


def test_a_policy_deleted_by_another_process_is_422_and_writes_nothing(
    client: FlaskClient, tenant: TenantKeys, pg_db: Database
) -> None:
    # Given a policy this process has copied
    put_policy(client, tenant, chain_id=8453, address=WALLET, token_address=USDC_BASE)
    create_account(client, tenant)

    # When another process deletes it
    _policy_row(
        pg_db, tenant.tenant_id, "DELETE FROM destination_policies WHERE tenant_id = :tenant_id"
    )

    # Then a creation without a destination is 422 and writes nothing
    response = client.post(PATH, json={"externalUserId": _uid()}, headers=tenant.headers)
    assert_error(response, 422, "destination_policy_missing")
    assert _count_accounts(pg_db, tenant.tenant_id) == 1
    assert len(outbox_events(pg_db, tenant.tenant_id, CREATED)) == 1
    # And a new policy is taken at once
    put_policy(client, tenant, chain_id=1, address=WALLET_3, token_address=USDT_ETH)
    assert create_account(client, tenant)["destination"] == destination(1, WALLET_3, USDT_ETH)


def _key_id(db: Database, ctx: CoreContext) -> int:
    return deposit_keys.recorded(db, ctx.deriver.xpub, ctx.deriver.scheme).id


def test_indices_come_from_blocks_while_accounts_list_in_creation_order(
    client: FlaskClient, policy_tenant: TenantKeys, pg_db: Database, core_context: CoreContext
) -> None:
    # Given accounts created while another process's block (drawn earlier) is unused
    creation = account_store._creation(
        pg_db, core_context.registry.active_positions, _key_id(pg_db, core_context)
    )
    with pg_db.driver_autocommit() as conn:
        other_process = account_store._IndexBlock(creation.indices._sql)
        held = other_process.take(conn)
    made = [create_account(client, policy_tenant) for _ in range(3)]
    # (the other process's next index is still the next of its block)
    with pg_db.driver_autocommit() as conn:
        last_index = other_process.take(conn)
    assert last_index == held + 1

    # Then the list is newest first by creation (pk at insert), not by index
    rows = [_account_row(pg_db, a["id"]) for a in made]
    assert [r.pk for r in rows] == sorted(r.pk for r in rows)
    listed = client.get(PATH, headers=policy_tenant.headers).get_json()["depositAccounts"]
    assert [a["id"] for a in listed[:3]] == [a["id"] for a in reversed(made)]
    # And no index repeats a pk or an index handed out before, the other block's included
    indices = [r.address_index for r in rows]
    assert len(set(indices)) == 3 and not {held, last_index} & set(indices)
    with pg_db.reader() as session:
        taken = session.execute(
            sa.select(sa.func.count()).where(
                DepositAccount.address_index.in_([held, last_index, *indices])
            )
        ).scalar_one()
    assert taken == 3


def test_a_forked_process_draws_its_own_block(pg_db: Database, core_context: CoreContext) -> None:
    # Given a process holding a block of indices
    creation = account_store._creation(
        pg_db, core_context.registry.active_positions, _key_id(pg_db, core_context)
    )
    block = account_store._IndexBlock(creation.indices._sql)
    with pg_db.driver_autocommit() as conn:
        parent_first = block.take(conn)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a connection of its own, never the parent's
        try:
            with psycopg.connect(pg_db.libpq_url, autocommit=True) as conn:
                os.write(write, str(block.take(conn)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_first = int(pipe.read())
    os.waitpid(pid, 0)
    # Then the child's index is from a block of its own, and the parent's block goes on
    with pg_db.driver_autocommit() as conn:
        parent_next = block.take(conn)
    assert parent_next == parent_first + 1
    assert not parent_first <= child_first < parent_first + account_store.INDEX_BLOCK


def test_a_process_forked_while_a_thread_draws_a_block_draws_its_own(
    pg_db: Database, core_context: CoreContext
) -> None:
    # Given a block whose refill lock a thread holds at the moment of a fork
    creation = account_store._creation(
        pg_db, core_context.registry.active_positions, _key_id(pg_db, core_context)
    )
    block = account_store._IndexBlock(creation.indices._sql)
    block._lock.acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no thread of the parent's lives here to release that lock
        try:
            signal.alarm(5)  # a deadlock ends the child, and the test fails below
            with psycopg.connect(pg_db.libpq_url, autocommit=True) as conn:
                os.write(write, str(block.take(conn)).encode())
        finally:
            os._exit(0)
    block._lock.release()
    os.close(write)
    with os.fdopen(read) as pipe:
        child_index = pipe.read()
    _, status = os.waitpid(pid, 0)
    # Then the child draws a block of its own and does not hang
    assert not os.WIFSIGNALED(status) and child_index.isdigit()
