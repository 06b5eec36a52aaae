"""The pipeline on the in-process EVM (eth-tester + py-evm, a vyper ERC-20), on PostgreSQL.

The eth-tester chain plays the test chain of a small-depth registry (depth 3). The
credit is a real ERC-20 transfer from a hot wallet by Erc20TransferExecutor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import pytest
from eth_account.signers.local import LocalAccount

from services.core.chains import ChainRegistry
from services.core.deposits import states
from services.core.deposits.sandbox import SandboxChain, SandboxConfirmer
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import EvmPayer, Settlement
from services.core.deposits.watcher import ChainWatcher
from services.core.deposits.worker import Pipeline, run
from services.core.hot_wallet import Erc20TransferExecutor
from shared.db import Database
from tests.conftest import TenantKeys
from tests.support.deposits import (
    AccountRef,
    DepositParts,
    deposit_event_types,
    deposit_parts,
    deposits_of,
    events_of,
    make_account,
    set_fee,
    small_registry,
    unique_chain_id,
)
from tests.support.evm_chain import EvmChain
from tests.support.evm_node import EvmNode

pytestmark = pytest.mark.integration

USDC = 10**6


@dataclass
class Rig:
    evm: EvmChain
    token: str
    registry: ChainRegistry
    parts: DepositParts
    watcher: ChainWatcher
    hot: LocalAccount
    customer: LocalAccount
    account: AccountRef
    wallet: str
    chain_id: int


@pytest.fixture(scope="module")
def evm() -> EvmChain:
    return EvmChain()


@pytest.fixture
def node(evm: EvmChain) -> Iterator[EvmNode]:
    # The hot wallet talks to the chain over HTTP, as to a real node: the node holds the
    # chain's lock, so the test may mine while a worker thread pays.
    with EvmNode(evm) as node:
        yield node


@pytest.fixture
def rig(evm: EvmChain, node: EvmNode, pg_db: Database, tenant: TenantKeys) -> Rig:
    # A fresh token per test: each test's registry (and deposits) stand alone.
    token = evm.deploy_token("USDC", 6)
    chain_id = unique_chain_id()  # this test's own cursor and fee
    registry = small_registry(chain_id=chain_id, depth=3, usdc=token, min_deposit_usd=1.0)
    hot = evm.new_account()
    evm.mint(token, hot.address, 1_000_000 * USDC)
    customer = evm.new_account()
    evm.mint(token, customer.address, 10_000 * USDC)
    executor = Erc20TransferExecutor.from_url(node.url, hot.key, 5.0, chain_id=evm.chain_id)
    settlement = Settlement(registry, payers={chain_id: EvmPayer(executor)})
    parts = deposit_parts(
        pg_db, registry, settlement=settlement, settings=PipelineSettings(poll_s=0.0)
    )
    wallet = evm.new_account(0).address
    account = make_account(
        pg_db,
        tenant.tenant_id,
        registry,
        dest_chain_id=chain_id,
        dest_address=wallet,
        dest_token_address=token,
    )
    chain = registry.get(chain_id)
    assert chain is not None
    watcher = ChainWatcher(
        parts.detection, chain, evm.reader(), lag_blocks=0, start_block=evm.head() + 1
    )
    return Rig(evm, token, registry, parts, watcher, hot, customer, account, wallet, chain_id)


def send(rig: Rig, amount_raw: int) -> str:
    tx = rig.evm.transfer(rig.token, rig.customer, rig.account.address(rig.chain_id), amount_raw)
    rig.evm.mine()
    return tx


def test_transfer_to_credit_on_chain_with_fee_and_net(rig: Rig, pg_db: Database) -> None:
    rig.watcher.tick()
    # Given 125.50 USDC sent to the deposit address
    tx = send(rig, 125_500_000)
    rig.watcher.tick()
    (deposit,) = deposits_of(pg_db, rig.account)
    assert (deposit.status, deposit.confirmations) == (states.SOURCE_SEEN, 1)
    assert deposit.source_tx_hash == tx and deposit.amount_raw == "125500000"
    assert deposit.block_hash == rig.evm.block_hash(deposit.block_number or 0)
    assert deposit.from_address == rig.customer.address
    # When blocks pile up on it, it is confirmed exactly at depth 3
    rig.evm.mine()
    rig.watcher.tick()
    assert deposits_of(pg_db, rig.account)[0].status == states.SOURCE_SEEN
    rig.evm.mine()
    rig.watcher.tick()
    (deposit,) = deposits_of(pg_db, rig.account)
    assert (deposit.status, deposit.confirmations) == (states.SOURCE_CONFIRMED, 3)
    # And settlement pays the net from the hot wallet, skimming the live fee
    set_fee(pg_db, rig.chain_id, "0.25")
    assert rig.parts.settling.settle(deposit.id) == states.SOURCE_CONFIRMED  # paying
    assert rig.evm.balance_of(rig.token, rig.wallet) == 125_250_000
    # And credits it once the payout is as deep as the destination chain's depth (3)
    assert rig.parts.settling.poll(deposit.id) is None  # in flight: 1 confirmation of 3
    rig.evm.mine(2)
    assert rig.parts.settling.poll(deposit.id) == states.CREDITED
    (deposit,) = deposits_of(pg_db, rig.account)
    assert str(deposit.fee_usd) == "0.250000" and str(deposit.net_usd) == "125.250000"
    assert deposit.route == "direct" and deposit.credit_amount == "125.250000"
    assert rig.evm.balance_of(rig.token, rig.wallet) == 125_250_000
    assert rig.evm.w3.eth.get_transaction_receipt(deposit.credit_tx_hash)["status"] == 1
    assert deposit_event_types(pg_db, deposit.id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.credited",
    ]
    events = events_of(pg_db, rig.account.tenant_id)
    # A real deposit's events are money: livemode true on each (issue 23)
    assert events and all(e["livemode"] is True for e in events)
    receipt = next(e for e in events if e["type"] == "deposit.credited")["data"]["deposit"]
    assert receipt["amount"] == "125.50" and receipt["netAmountUsd"] == 125.25
    assert (
        receipt["settlementGasFeeUsd"] == 0.25 and receipt["creditTxHash"] == deposit.credit_tx_hash
    )
    assert receipt["destination"]["address"] == rig.wallet


def test_reorg_before_confirmation_fails_and_never_credits(rig: Rig, pg_db: Database) -> None:
    rig.watcher.tick()
    snapshot = rig.evm.snapshot()
    send(rig, 30 * USDC)
    rig.watcher.tick()
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.SOURCE_SEEN
    # When the chain reverts past the transfer and grows a different branch
    rig.evm.revert(snapshot)
    rig.evm.mine(3)
    rig.watcher.tick()
    # Then the deposit failed as reorged, and settling it does nothing
    (deposit,) = deposits_of(pg_db, rig.account)
    assert (deposit.status, deposit.failure_reason) == (states.FAILED, "reorged")
    assert rig.parts.settling.settle(deposit.id) is None
    rig.evm.mine(3)
    rig.watcher.tick()
    assert deposit_event_types(pg_db, deposit.id) == ["deposit.source_seen", "deposit.failed"]
    assert rig.evm.balance_of(rig.token, rig.wallet) == 0


def test_worker_restart_between_blocks_misses_nothing_and_counts_nothing_twice(
    rig: Rig, pg_db: Database
) -> None:
    settings = PipelineSettings(watcher_poll_s=0.01, poll_s=0.01, sandbox_block_s=0)
    set_fee(pg_db, rig.chain_id, "0.10")

    def pipeline(start_block: int | None = None) -> Pipeline:
        # A new watcher object each time, as a new process would have: only the
        # persisted cursor connects the two runs.
        chain = rig.registry.get(rig.chain_id)
        assert chain is not None
        watcher = ChainWatcher(
            rig.parts.detection, chain, rig.evm.reader(), lag_blocks=0, start_block=start_block
        )
        return Pipeline(
            settling=rig.parts.settling,
            sandbox=SandboxConfirmer(rig.parts.detection, SandboxChain(0)),
            watchers=[watcher],
            settings=settings,
        )

    @dataclass
    class Worker:
        stop: threading.Event
        thread: threading.Thread

    def start(start_block: int | None = None) -> Worker:
        stop = threading.Event()
        thread = threading.Thread(target=run, args=(pipeline(start_block), stop), daemon=True)
        thread.start()
        return Worker(stop, thread)

    def wait_for(count: int, status: str) -> None:
        for n in range(500):
            if [d.status for d in deposits_of(pg_db, rig.account)].count(status) == count:
                return
            threading.Event().wait(0.02)
            if n % 5 == 4:
                rig.evm.mine()  # payouts count at the destination chain's depth
        raise AssertionError([d.status for d in deposits_of(pg_db, rig.account)])

    # Given a running worker that credits two deposits (the first run watches from the
    # next block: a thread slow to start would otherwise begin at a head already past
    # the transfers, as a fresh deployment does)
    worker = start(rig.evm.head() + 1)
    try:
        send(rig, 5 * USDC)
        send(rig, 6 * USDC)
        rig.evm.mine(3)
        wait_for(2, states.CREDITED)
    finally:
        # When it stops between blocks, and three transfers land while it is down
        worker.stop.set()
        worker.thread.join(10)
    assert not worker.thread.is_alive()
    send(rig, 7 * USDC)
    send(rig, 8 * USDC)
    rig.evm.mine()
    send(rig, 9 * USDC)
    rig.evm.mine(3)
    # Then a restarted worker resumes from the cursor and credits exactly those
    worker = start()
    try:
        wait_for(5, states.CREDITED)
    finally:
        worker.stop.set()
        worker.thread.join(10)
    deposits = deposits_of(pg_db, rig.account)
    assert sorted(int(d.amount_raw) // USDC for d in deposits) == [5, 6, 7, 8, 9]
    for deposit in deposits:
        assert deposit_event_types(pg_db, deposit.id).count("deposit.credited") == 1
    assert rig.evm.balance_of(rig.token, rig.wallet) == (35 - 5 * Decimal("0.10")) * USDC
