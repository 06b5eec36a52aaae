"""POST /v1/sandbox/deposits and sandbox deposits through the real pipeline (PostgreSQL)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from flask.testing import FlaskClient

from services import cli
from services.core.app import create_app
from services.core.context import CoreContext
from services.core.deposits import cli as deposits_cli
from services.core.deposits.sandbox import SandboxChain, SandboxConfirmer
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.worker import Pipeline
from shared.db import Database
from shared.errors import Conflict
from shared.timefmt import parse_iso, utcnow
from tests.conftest import TenantKeys, make_tenant
from tests.support.deposits import (
    AccountRef,
    deposit_event_types,
    deposit_parts,
    deposit_row,
    events_of,
    make_account,
)

pytestmark = pytest.mark.integration

USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
SETTINGS = PipelineSettings(sandbox_block_s=0.01, batch_size=1000, poll_s=0.0)


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


def submit(client: FlaskClient, headers: dict[str, str], **body: Any) -> Any:
    return client.post("/v1/sandbox/deposits", json=body, headers=headers)


def later(minutes: float = 10) -> Any:
    """A clock ahead of real time: every simulated block has been mined."""
    return lambda: utcnow() + timedelta(minutes=minutes)


def pipeline(core_context: CoreContext, clock: Any) -> Pipeline:
    """The worker's settlement loop over the test database, on the given clock."""
    parts = deposit_parts(core_context.db, core_context.registry, settings=SETTINGS, clock=clock)
    return Pipeline(
        settling=parts.settling,
        sandbox=SandboxConfirmer(
            parts.detection, SandboxChain(SETTINGS.sandbox_block_s), batch_size=1000
        ),
        settings=SETTINGS,
    )


def run_until_settled(p: Pipeline, deposit_id: str, rounds: int = 10) -> str:
    """Settlement rounds until the deposit stops moving (bounded); its last status."""
    status = ""
    for _ in range(rounds):
        p.settle_round()
        status = deposit_row(p.settling.db, deposit_id).status
        if status in ("credited", "failed", "manual_review_required"):
            break
    return status


def test_sandbox_deposit_starts_seen_and_is_credited_with_fee_and_net(
    client: FlaskClient, core_context: CoreContext, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    # Given a sandbox tenant's account on Base
    # When it simulates a 125.50 USDC deposit
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=account.address(8453).lower(),
        chainId=8453,
        asset="USDC",
        amount="125.50",
    )
    # Then the deposit is in source_seen with the amount as given
    assert response.status_code == 200, response.get_json()
    deposit = response.get_json()["deposit"]
    assert deposit["status"] == "source_seen"
    assert deposit["id"].startswith("dep_") and deposit["sandbox"] is True
    assert deposit["amount"] == "125.50" and deposit["amountUsd"] == 125.5
    assert deposit["depositAddress"] == account.address(8453)
    assert deposit["accountId"] == account.id
    assert deposit["externalUserId"] == account.external_user_id
    assert deposit["destination"] == {
        "chainId": 8453,
        "address": "0x1111111111111111111111111111111111111111",
        "tokenAddress": USDC_BASE,
    }
    assert deposit["confirmations"] == 1 and deposit["requiredConfirmations"] == 20
    # When the pipeline runs past the chain's depth in simulated blocks
    p = pipeline(core_context, later())
    run_until_settled(p, deposit["id"])
    # Then it is credited directly, the fee skimmed and the net recorded
    final = client.get(f"/v1/deposits/{deposit['id']}", headers=sandbox_tenant.headers)
    credited = final.get_json()["deposit"]
    assert credited["status"] == "credited" and credited["route"] == "direct"
    fee = Decimal(str(credited["settlementGasFeeUsd"]))
    assert Decimal(str(credited["netAmountUsd"])) == Decimal("125.5") - fee
    assert credited["creditTxHash"].startswith("0x") and len(credited["creditTxHash"]) == 66
    assert credited["confirmations"] == 20
    assert deposit_event_types(core_context.db, deposit["id"]) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.credited",
    ]
    # And the credited event is the receipt: the same object the API serves
    events = {e["type"]: e for e in events_of(core_context.db, sandbox_tenant.tenant_id)}
    receipt = events["deposit.credited"]
    assert receipt["id"] == f"evt_dep_{deposit['id']}_credited"
    # Simulated money: every event of the sandbox tenant says livemode false (issue 23)
    assert {e["livemode"] for e in events.values()} == {False}
    assert receipt["data"] == {"deposit": credited}
    assert events["deposit.source_seen"]["id"] == f"evt_dep_{deposit['id']}_source_seen"


def test_cross_chain_sandbox_deposit_is_routed_with_credit_submitted(
    client: FlaskClient, core_context: CoreContext, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=account.address(1),
        chainId=1,
        asset="USDT",
        amount="40",
    )
    assert response.status_code == 200
    deposit_id = response.get_json()["deposit"]["id"]
    run_until_settled(pipeline(core_context, later()), deposit_id)
    assert deposit_event_types(core_context.db, deposit_id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.credit_submitted",
        "deposit.credited",
    ]
    final = client.get(f"/v1/deposits/{deposit_id}", headers=sandbox_tenant.headers).get_json()
    assert final["deposit"]["route"] == "routed" and final["deposit"]["amount"] == "40.00"


def test_sandbox_outcome_failed(
    client: FlaskClient, core_context: CoreContext, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=account.address(8453),
        chainId=8453,
        asset="USDC",
        amount="10",
        outcome="failed",
    )
    deposit_id = response.get_json()["deposit"]["id"]
    run_until_settled(pipeline(core_context, later()), deposit_id)
    final = client.get(f"/v1/deposits/{deposit_id}", headers=sandbox_tenant.headers).get_json()
    assert final["deposit"]["status"] == "failed"
    assert final["deposit"]["failureReason"] == "sandbox_outcome"
    assert final["deposit"]["creditTxHash"] is None
    assert deposit_event_types(core_context.db, deposit_id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.failed",
    ]


def test_below_the_floor_fails_below_minimum(
    client: FlaskClient, core_context: CoreContext, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=account.address(8453),
        chainId=8453,
        asset="USDC",
        amount="0.99",
    )
    deposit_id = response.get_json()["deposit"]["id"]
    run_until_settled(pipeline(core_context, later()), deposit_id)
    final = client.get(f"/v1/deposits/{deposit_id}", headers=sandbox_tenant.headers).get_json()
    assert final["deposit"]["status"] == "failed"
    assert final["deposit"]["failureReason"] == "below_minimum"
    assert final["deposit"]["creditTxHash"] is None


def test_fee_preview_and_the_deposit_round_alike_and_dust_shows_no_net(
    client: FlaskClient, core_context: CoreContext, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    # Given 9.9999995 DAI on Ethereum, whose floor is 10 USD
    body = {"chainId": 1, "asset": "DAI", "amount": "9.9999995"}
    (quote,) = client.post("/v1/fee-preview", json=body, headers=sandbox_tenant.headers).get_json()[
        "quotes"
    ]
    response = submit(client, sandbox_tenant.headers, depositAddress=account.address(1), **body)
    deposit_id = response.get_json()["deposit"]["id"]
    run_until_settled(pipeline(core_context, later()), deposit_id)
    final = client.get(f"/v1/deposits/{deposit_id}", headers=sandbox_tenant.headers).get_json()
    # Then the preview and the deposit value it alike (rounded down: 9.999999) and agree
    # that it is dust
    assert quote["amountUsd"] == final["deposit"]["amountUsd"] == 9.999999
    assert quote["belowMinimum"] is True
    assert (final["deposit"]["status"], final["deposit"]["failureReason"]) == (
        "failed",
        "below_minimum",
    )
    # And a dust deposit, never paid, shows no net amount
    assert final["deposit"]["netAmountUsd"] is None


def test_manual_review_then_ops_credit_days_later_emits_credited_once(
    client: FlaskClient, core_context: CoreContext, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    # Given a deposit rehearsing manual review
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=account.address(8453),
        chainId=8453,
        asset="USDC",
        amount="300",
        outcome="manual_review",
    )
    deposit_id = response.get_json()["deposit"]["id"]
    run_until_settled(pipeline(core_context, later()), deposit_id)
    review = client.get(f"/v1/deposits/{deposit_id}", headers=sandbox_tenant.headers).get_json()
    assert review["deposit"]["status"] == "manual_review_required"
    # When ops credit it by hand three days later
    three_days_later = utcnow() + timedelta(days=3)
    ops = deposit_parts(
        core_context.db, core_context.registry, settings=SETTINGS, clock=lambda: three_days_later
    ).ops
    tx = "0x" + "ab" * 32
    args = argparse.Namespace(deposit_id=deposit_id, tx=tx, by="alice", reason="checked by hand")
    assert deposits_cli.credit(args, ops=ops) == 0
    # Then the late transition is delivered as its durable event, once
    final = client.get(f"/v1/deposits/{deposit_id}", headers=sandbox_tenant.headers).get_json()
    assert final["deposit"]["status"] == "credited"
    assert final["deposit"]["creditTxHash"] == tx and final["deposit"]["route"] == "manual"
    credited = [
        e
        for e in events_of(core_context.db, sandbox_tenant.tenant_id)
        if e["type"] == "deposit.credited"
    ]
    assert len(credited) == 1
    assert credited[0]["id"] == f"evt_dep_{deposit_id}_credited"
    assert parse_iso(credited[0]["createdAt"]) == three_days_later
    # And doing it again is refused and emits nothing
    with pytest.raises(Conflict):
        ops.credit(deposit_id, tx, by="bob", reason=None)
    assert deposit_event_types(core_context.db, deposit_id).count("deposit.credited") == 1


def assert_error(response: Any, status: int, code: str) -> None:
    body = response.get_json()
    assert response.status_code == status, body
    assert body["code"] == code and body["error"].startswith(f"{code}: ")


def test_only_sandbox_tenants_unless_the_service_runs_in_sandbox_mode(
    pg_db: Database, core_context: CoreContext, tenant: TenantKeys
) -> None:
    # Given a service with SETTLE_SANDBOX off
    strict = dataclasses.replace(
        core_context, config=dataclasses.replace(core_context.config, sandbox=False)
    )
    app = create_app(context=strict)
    client = app.test_client()
    live = make_account(pg_db, tenant.tenant_id, core_context.registry, dest_chain_id=8453)
    sandboxed = make_tenant(pg_db, sandbox=True)
    own = make_account(pg_db, sandboxed.tenant_id, core_context.registry, dest_chain_id=8453)
    body = {"chainId": 8453, "asset": "USDC", "amount": "5"}
    # When a live tenant asks for a sandbox deposit, it is forbidden, and nothing is written
    response = submit(client, tenant.headers, depositAddress=live.address(8453), **body)
    assert_error(response, 403, "forbidden")
    assert events_of(pg_db, tenant.tenant_id) == []
    # While a sandbox tenant may
    response = submit(client, sandboxed.headers, depositAddress=own.address(8453), **body)
    assert response.status_code == 200


def test_bad_requests_are_clear_4xx(
    client: FlaskClient, pg_db: Database, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    address = account.address(8453)
    other = make_tenant(pg_db, sandbox=True)
    # A declared chain
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=address,
        chainId=42161,
        asset="USDC",
        amount="5",
    )
    assert_error(response, 400, "unsupported_chain")
    # An asset the chain does not accept
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=address,
        chainId=8453,
        asset="DOGE",
        amount="5",
    )
    assert_error(response, 400, "invalid_request")
    assert "asset" in response.get_json()["error"]
    # Amounts: more decimals than the token has, a float, zero, negative, exponent
    for amount in ("1.1234567", 12.5, "0", "-1", "1e3", ""):
        response = submit(
            client,
            sandbox_tenant.headers,
            depositAddress=address,
            chainId=8453,
            asset="USDC",
            amount=amount,
        )
        assert_error(response, 400, "invalid_request")
    # An unknown outcome, a missing field, a malformed address
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=address,
        chainId=8453,
        asset="USDC",
        amount="5",
        outcome="refund",
    )
    assert_error(response, 400, "invalid_request")
    response = submit(client, sandbox_tenant.headers, depositAddress=address, chainId=8453)
    assert_error(response, 400, "invalid_request")
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress="0x123",
        chainId=8453,
        asset="USDC",
        amount="5",
    )
    assert_error(response, 400, "invalid_request")
    # Someone else's deposit address, or one on another chain, is not found
    response = submit(
        client, other.headers, depositAddress=address, chainId=8453, asset="USDC", amount="5"
    )
    assert_error(response, 404, "not_found")
    response = submit(
        client, sandbox_tenant.headers, depositAddress=address, chainId=1, asset="USDC", amount="5"
    )
    assert_error(response, 404, "not_found")
    # And none of it wrote an event
    assert events_of(pg_db, sandbox_tenant.tenant_id) == []


def test_scope_and_idempotency(
    client: FlaskClient, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    body = {
        "depositAddress": account.address(8453),
        "chainId": 8453,
        "asset": "USDC",
        "amount": "7.25",
    }
    response = client.post(
        "/v1/sandbox/deposits", json=body, headers=sandbox_tenant.key_with("deposits:read")
    )
    assert_error(response, 403, "insufficient_scope")
    response = client.post("/v1/sandbox/deposits", json=body)
    assert_error(response, 401, "unauthorized")
    # The same Idempotency-Key and body replay the first deposit
    headers = {**sandbox_tenant.headers, "Idempotency-Key": "sbx-1"}
    first = client.post("/v1/sandbox/deposits", json=body, headers=headers)
    again = client.post("/v1/sandbox/deposits", json=body, headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.get_json()["deposit"]["id"] == again.get_json()["deposit"]["id"]


def test_ops_fail_through_the_command_line(
    client: FlaskClient,
    core_context: CoreContext,
    pg_url: str,
    sandbox_tenant: TenantKeys,
    account: AccountRef,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a deposit waiting in manual review
    response = submit(
        client,
        sandbox_tenant.headers,
        depositAddress=account.address(8453),
        chainId=8453,
        asset="USDC",
        amount="3",
        outcome="manual_review",
    )
    deposit_id = response.get_json()["deposit"]["id"]
    run_until_settled(pipeline(core_context, later()), deposit_id)
    monkeypatch.setenv("SETTLE_DATABASE_URL", pg_url)
    monkeypatch.setenv("SETTLE_ENV", "dev")
    command = ["deposits", "fail", deposit_id]
    # When ops fail it with a reason (`settle deposits fail ...`)
    code = cli.main([*command, "--reason", "sent back to the customer", "--by", "ops-bob"])
    out = capsys.readouterr()
    # Then it is failed with that reason, recorded as the durable event
    assert code == 0, out.err
    deposit = json.loads(out.out)["deposit"]
    assert deposit["status"] == "failed"
    assert deposit["failureReason"] == "sent back to the customer"
    assert deposit_event_types(core_context.db, deposit_id)[-1] == "deposit.failed"
    row = deposit_row(core_context.db, deposit_id)
    assert (row.ops_by, row.ops_reason) == ("ops-bob", "sent back to the customer")
    # And a second attempt is refused with a clear error
    assert cli.main([*command, "--reason", "again"]) == 2
    assert capsys.readouterr().err.startswith("error: conflict: ")
