"""`sourceBlockNumber` and `sourceBlockHash`: the block of a deposit's incoming transfer, on
GET /v1/deposits, GET /v1/deposits/{id} and the `data.deposit` of every deposit event.

On a chain (the in-process EVM) they are the real block's; a sandbox deposit's are of
the simulated chain (a synthetic hash, docs/DEPOSITS.md).
"""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from services.core.context import CoreContext
from services.core.deposits import states
from services.core.deposits.sandbox import SandboxChain
from shared.db import Database
from tests.conftest import TenantKeys
from tests.integration import test_pipeline_chain as on_chain
from tests.integration import test_sandbox as sandbox
from tests.integration.test_pipeline_chain import Rig, send
from tests.integration.test_sandbox import later, pipeline, run_until_settled, submit
from tests.support.deposits import AccountRef, deposits_of, events_of, set_fee

pytestmark = pytest.mark.integration

# The fixtures of the pipeline's chain and sandbox suites, shared rather than copied.
evm, node, rig = on_chain.evm, on_chain.node, on_chain.rig
sandbox_tenant, account = sandbox.sandbox_tenant, sandbox.account


def served(client: FlaskClient, headers: dict[str, str], deposit_id: str) -> list[dict[str, Any]]:
    """The deposit as the list and the single read serve it, and as each of its events."""
    listed = client.get("/v1/deposits?limit=200", headers=headers).get_json()["deposits"]
    one = client.get(f"/v1/deposits/{deposit_id}", headers=headers).get_json()["deposit"]
    return [next(d for d in listed if d["id"] == deposit_id), one]


def event_deposits(db: Database, tenant_id: str, deposit_id: str) -> list[dict[str, Any]]:
    found = [
        e["data"]["deposit"]
        for e in events_of(db, tenant_id)
        if e["type"].startswith("deposit.") and "deposit" in e["data"]
    ]
    return [d for d in found if d["id"] == deposit_id]


def test_a_chain_deposit_carries_its_transfers_block_everywhere(
    rig: Rig, pg_db: Database, client: FlaskClient, tenant: TenantKeys
) -> None:
    # Given 40 USDC sent on chain, confirmed and credited
    rig.watcher.tick()
    tx = send(rig, 40_000_000)
    rig.evm.mine(3)
    rig.watcher.tick()
    (deposit,) = deposits_of(pg_db, rig.account)
    set_fee(pg_db, rig.chain_id, "0.25")
    rig.parts.settling.settle(deposit.id)
    rig.evm.mine(3)
    assert rig.parts.settling.poll(deposit.id) == states.CREDITED
    # The block the transfer is in, read from the node
    receipt = rig.evm.w3.eth.get_transaction_receipt(tx)
    number = receipt["blockNumber"]
    block_hash = rig.evm.block_hash(number)
    # Then the API's list, its single read and every deposit event name that block
    everywhere = served(client, tenant.headers, deposit.id)
    events = event_deposits(pg_db, tenant.tenant_id, deposit.id)
    assert [e["status"] for e in events] == ["source_seen", "source_confirmed", "credited"]
    for document in [*everywhere, *events]:
        assert document["sourceBlockNumber"] == number
        assert document["sourceBlockHash"] == block_hash
        assert document["sourceTxHash"] == tx


def credit_a_sandbox_deposit(
    client: FlaskClient,
    core_context: CoreContext,
    tenant: TenantKeys,
    account: AccountRef,
    *,
    minutes_ahead: float = 10,
) -> dict[str, Any]:
    """A 12.00 USDC sandbox deposit on Base, as POST /v1/sandbox/deposits answered it,
    credited by the pipeline on a clock `minutes_ahead` of now."""
    response = submit(
        client,
        tenant.headers,
        depositAddress=account.address(8453),
        chainId=8453,
        asset="USDC",
        amount="12.00",
    )
    assert response.status_code == 200, response.get_json()
    made: dict[str, Any] = response.get_json()["deposit"]
    clock = later(minutes=minutes_ahead)
    assert run_until_settled(pipeline(core_context, clock), made["id"]) == "credited"
    return made


def test_a_sandbox_deposit_carries_a_block_of_the_simulated_chain(
    client: FlaskClient, core_context: CoreContext, sandbox_tenant: TenantKeys, account: AccountRef
) -> None:
    # Given a sandbox deposit, credited by the pipeline
    made = credit_a_sandbox_deposit(client, core_context, sandbox_tenant, account)
    # Then its block is the simulated chain's: a number and its synthetic hash
    number = made["sourceBlockNumber"]
    assert isinstance(number, int) and number > 0
    synthetic = SandboxChain().block_hash(8453, number)
    everywhere = served(client, sandbox_tenant.headers, made["id"])
    events = event_deposits(core_context.db, sandbox_tenant.tenant_id, made["id"])
    assert len(events) == 3
    for document in [made, *everywhere, *events]:
        assert document["sourceBlockNumber"] == number
        assert document["sourceBlockHash"] == synthetic
        assert document["sandbox"] is True
