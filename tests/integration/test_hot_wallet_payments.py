"""Paying exactly once from the hot wallet, against an unreliable node.

The real pipeline (watcher, settling, `EvmPayer` over the real `Erc20TransferExecutor`)
on PostgreSQL; the payer talks to the in-process EVM served over HTTP (`EvmNode`)
through the fault-injecting proxy (`RpcProxy`); the watcher reads the node directly, so
only the paying side meets the faults. Every test counts what reached the chain: the
destination's token balance holds exactly one credit, and `deposit.credited` went out
once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from eth_account.signers.local import LocalAccount

from services import cli
from services.core.chains import ChainRegistry
from services.core.deposits import states
from services.core.deposits.metrics import ChainCollector
from services.core.deposits.sandbox import SandboxChain, SandboxConfirmer
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import EvmPayer, Settlement
from services.core.deposits.watcher import ChainWatcher
from services.core.deposits.worker import Pipeline
from services.core.hot_wallet import Erc20TransferExecutor
from shared.db import Database
from shared.errors import Conflict
from tests.conftest import TenantKeys
from tests.support.deposits import (
    AccountRef,
    DepositParts,
    chains_toml,
    deposit_event_types,
    deposit_parts,
    deposits_of,
    make_account,
    set_fee,
    small_registry,
    unique_chain_id,
)
from tests.support.evm_chain import EvmChain
from tests.support.evm_node import EvmNode
from tests.support.paying import anvil_rig
from tests.support.rpc_proxy import Fault, RpcProxy

pytestmark = pytest.mark.integration

USDC = 10**6
#: The destination chain's depth (the test chain pays its own deposits).
DEPTH = 3
#: The payer's client timeout where a test holds calls: short, so a held call fails fast.
TIMEOUT_S = 0.5
#: Elsewhere a patient client: those tests are about what the node answers, not about
#: timeouts a loaded machine makes (0.5 s failed calls to the in-process node at load 13).
PATIENT_S = 5.0
#: A hot-wallet credit in flight keeps its status: no `credit_submitted` for a direct or
#: inventory credit (DESIGN.md); its open payment marks it.
IN_FLIGHT = states.SOURCE_CONFIRMED
SETTINGS = PipelineSettings(
    poll_s=0.0, retry_base_s=0.0, sandbox_block_s=0, payment_replace_blocks=4
)


@pytest.fixture(scope="module")
def evm() -> EvmChain:
    return EvmChain()


@dataclass
class Rig:
    evm: EvmChain
    node: EvmNode
    proxy: RpcProxy
    token: str
    registry: ChainRegistry
    chain_id: int
    hot: LocalAccount
    customer: LocalAccount
    account: AccountRef
    wallet: str
    watcher: ChainWatcher
    db: Database

    def parts(
        self, settings: PipelineSettings = SETTINGS, timeout_s: float = PATIENT_S
    ) -> DepositParts:
        """The deposit use cases with a hot-wallet payer of their own (one per worker)."""
        executor = Erc20TransferExecutor.from_url(
            self.proxy.url, self.hot.key, timeout_s, chain_id=self.evm.chain_id
        )
        settlement = Settlement(self.registry, payers={self.chain_id: EvmPayer(executor)})
        return deposit_parts(self.db, self.registry, settlement=settlement, settings=settings)

    def pipeline(self, parts: DepositParts) -> Pipeline:
        return Pipeline(
            settling=parts.settling,
            sandbox=SandboxConfirmer(parts.detection, SandboxChain(0)),
            settings=parts.settings,
        )

    def deposit(self, amount_raw: int) -> str:
        """A deposit of `amount_raw` sent, confirmed at depth; its id."""
        before = {d.id for d in deposits_of(self.db, self.account)}
        to = self.account.address(self.chain_id)
        self.evm.transfer(self.token, self.customer, to, amount_raw)
        self.evm.mine(DEPTH)
        self.watcher.tick()
        (new,) = [d for d in deposits_of(self.db, self.account) if d.id not in before]
        assert new.status == states.SOURCE_CONFIRMED
        return new.id

    def status(self, deposit_id: str) -> str:
        return next(d for d in deposits_of(self.db, self.account) if d.id == deposit_id).status

    def paid(self) -> int:
        return self.evm.balance_of(self.token, self.wallet)

    def credited_events(self, deposit_id: str) -> int:
        return deposit_event_types(self.db, deposit_id).count("deposit.credited")


def _rig(evm: EvmChain, db: Database, tenant: TenantKeys, **node_options: Any) -> Iterator[Rig]:
    token = evm.deploy_token("USDC", 6)
    chain_id = unique_chain_id()
    registry = small_registry(chain_id=chain_id, depth=DEPTH, usdc=token, min_deposit_usd=1.0)
    hot = evm.new_account()
    evm.mint(token, hot.address, 1_000_000 * USDC)
    customer = evm.new_account()
    evm.mint(token, customer.address, 10_000 * USDC)
    wallet = evm.new_account(0).address
    account = make_account(
        db,
        tenant.tenant_id,
        registry,
        dest_chain_id=chain_id,
        dest_address=wallet,
        dest_token_address=token,
    )
    set_fee(db, chain_id, "0.50")
    chain = registry.get(chain_id)
    assert chain is not None
    watcher_parts = deposit_parts(db, registry, settings=SETTINGS)
    watcher = ChainWatcher(
        watcher_parts.detection, chain, evm.reader(), lag_blocks=0, start_block=evm.head() + 1
    )
    with (
        EvmNode(evm, **node_options) as node,
        RpcProxy(node.url, hold_s=TIMEOUT_S * 3) as proxy,
    ):
        yield Rig(
            evm, node, proxy, token, registry, chain_id, hot, customer, account, wallet, watcher, db
        )


@pytest.fixture
def rig(evm: EvmChain, pg_db: Database, tenant: TenantKeys) -> Iterator[Rig]:
    """A node that mines every broadcast at once."""
    yield from _rig(evm, pg_db, tenant)


@pytest.fixture
def pooled(evm: EvmChain, pg_db: Database, tenant: TenantKeys) -> Iterator[Rig]:
    """A node that keeps broadcasts in its pool until the test mines."""
    yield from _rig(evm, pg_db, tenant, mine_sends=False)


def run_until_credited(rig: Rig, pipeline: Pipeline, deposit_id: str, rounds: int = 12) -> int:
    """Settlement rounds, one block mined after each, until credited; rounds used."""
    for n in range(1, rounds + 1):
        pipeline.settle_round()
        if rig.status(deposit_id) == states.CREDITED:
            return n
        rig.evm.mine()
    raise AssertionError(f"not credited after {rounds} rounds: {rig.status(deposit_id)}")


def payment_rows(db: Database, deposit_id: str) -> list[dict[str, Any]]:
    with db.reader() as session:
        rows = session.execute(
            sa.text(
                "SELECT nonce, tx_hashes, outcome FROM hot_wallet_payments "
                "WHERE deposit_id = :d ORDER BY id"
            ),
            {"d": deposit_id},
        )
        return [dict(r._mapping) for r in rows]


def in_flight_metric(rig: Rig) -> float:
    """settle_hot_wallet_payments_in_flight of the rig's chain (0 when absent)."""
    for family in ChainCollector(rig.db).collect():
        if family.name == "settle_hot_wallet_payments_in_flight":
            for sample in family.samples:
                if sample.labels["chain_id"] == str(rig.chain_id):
                    return sample.value
    return 0


# -- 1. an error after the broadcast never makes a second payment ---------------------------


@pytest.mark.parametrize("fault", [Fault.TIMEOUT, Fault.RESET, Fault.HTTP_429])
def test_receipt_poll_failing_after_the_broadcast_pays_once(rig: Rig, fault: Fault) -> None:
    deposit_id = rig.deposit(100 * USDC)
    pipeline = rig.pipeline(rig.parts(timeout_s=TIMEOUT_S))
    # Given every receipt poll fails (the node has the transfer and mines it)
    rig.proxy.fail("eth_getTransactionReceipt", fault, times=None)
    for _ in range(3):
        pipeline.settle_round()
        rig.evm.mine()
    assert rig.status(deposit_id) != states.CREDITED
    # When the node answers again
    rig.proxy.clear()
    run_until_credited(rig, pipeline, deposit_id)
    # Then exactly one transfer reached the destination, and one receipt went out
    assert rig.paid() == 99_500_000
    assert rig.credited_events(deposit_id) == 1
    assert deposit_event_types(rig.db, deposit_id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.credited",
    ]
    (payment,) = payment_rows(rig.db, deposit_id)
    assert payment["outcome"] == "mined" and len(payment["tx_hashes"]) == 1


def test_broadcast_timing_out_after_the_node_took_it_pays_once(rig: Rig) -> None:
    deposit_id = rig.deposit(40 * USDC)
    pipeline = rig.pipeline(rig.parts(timeout_s=TIMEOUT_S))
    # Given the node takes the broadcast but the answer never comes back
    rig.proxy.fail("eth_sendRawTransaction", Fault.TIMEOUT, forward=True)
    run_until_credited(rig, pipeline, deposit_id)
    assert rig.paid() == 39_500_000
    assert rig.credited_events(deposit_id) == 1
    # Only our own logic sends: one broadcast (web3's own re-send is off)
    assert rig.proxy.count("eth_sendRawTransaction") == 1


def test_a_failed_poll_of_an_in_flight_credit_pays_once(pooled: Rig) -> None:
    rig = pooled
    deposit_id = rig.deposit(20 * USDC)
    pipeline = rig.pipeline(rig.parts())
    pipeline.settle_round()
    assert rig.status(deposit_id) == IN_FLIGHT
    assert len(rig.node.pooled()) == 1
    # When one poll of the in-flight credit fails
    rig.proxy.fail(None, Fault.RPC_ERROR, times=None, message="upstream busy")
    pipeline.settle_round()
    rig.proxy.clear()
    # Then nothing new was signed: the same transaction is mined and credited
    assert len(rig.node.pooled()) == 1
    run_until_credited(rig, pipeline, deposit_id)
    assert rig.paid() == 19_500_000
    assert rig.credited_events(deposit_id) == 1


# -- 3. dropped or underpriced: the same bytes again, or a replacement ------------------------


def test_a_dropped_broadcast_is_sent_again_as_the_same_transaction(pooled: Rig) -> None:
    rig = pooled
    deposit_id = rig.deposit(30 * USDC)
    pipeline = rig.pipeline(rig.parts())
    # Given the node answers the broadcast with its hash and drops it
    rig.proxy.drop_sends()
    pipeline.settle_round()
    (dropped,) = rig.proxy.dropped
    # Then its poll found the node did not know it and sent the same bytes again
    assert rig.node.pooled() == [dropped]
    assert rig.proxy.count("eth_sendRawTransaction") == 2
    run_until_credited(rig, pipeline, deposit_id)
    (payment,) = payment_rows(rig.db, deposit_id)
    assert payment["tx_hashes"] == [dropped]
    (deposit,) = [d for d in deposits_of(rig.db, rig.account) if d.id == deposit_id]
    assert deposit.credit_tx_hash == dropped
    assert rig.paid() == 29_500_000


def test_an_underpriced_payment_is_replaced_with_the_same_nonce(pooled: Rig) -> None:
    rig = pooled
    deposit_id = rig.deposit(50 * USDC)
    pipeline = rig.pipeline(rig.parts())
    pipeline.settle_round()
    (first,) = rig.node.pool.values()
    # Given the network's fees rose past what the payment offers: it stays in the pool
    rig.node.min_fee_wei = first.max_fee + 1
    for _ in range(SETTINGS.payment_replace_blocks):
        rig.evm.mine()
        pipeline.settle_round()
        assert rig.status(deposit_id) == IN_FLIGHT
    # (ops see it in flight, and how old it is)
    assert in_flight_metric(rig) == 1
    # Then it was replaced: same nonce, same calldata, higher fees; the replacement is mined
    run_until_credited(rig, pipeline, deposit_id)
    (payment,) = payment_rows(rig.db, deposit_id)
    assert len(payment["tx_hashes"]) == 2 and payment["nonce"] == first.nonce
    mined = rig.evm.receipt(payment["tx_hashes"][1])
    assert mined["status"] == 1
    assert rig.paid() == 49_500_000
    assert rig.credited_events(deposit_id) == 1
    assert in_flight_metric(rig) == 0


def cancel(rig: Rig, nonce: int, max_fee: int, priority_fee: int) -> None:
    """Another transaction from the hot wallet with `nonce` (a 0-value transfer to itself,
    fees 20 % higher): what ops do to make a pending payment unminable."""
    signed = rig.hot.sign_transaction(
        {
            "to": rig.hot.address,
            "value": 0,
            "gas": 21_000,
            "nonce": nonce,
            "chainId": rig.evm.chain_id,
            "type": 2,
            "maxFeePerGas": max_fee * 12 // 10,
            "maxPriorityFeePerGas": priority_fee * 12 // 10,
        }
    )
    answer = rig.node.answer(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "eth_sendRawTransaction",
            "params": [signed.raw_transaction.to_0x_hex()],
        }
    )
    assert "error" not in answer, answer


def test_a_payment_whose_nonce_was_used_elsewhere_fails_and_is_paid_anew_once(
    pooled: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig = pooled
    deposit_id = rig.deposit(90 * USDC)
    # (an in-flight payment is "old" at once here: the alert line shows)
    parts = rig.parts(replace(SETTINGS, payment_alert_s=0.0))
    pipeline = rig.pipeline(parts)
    pipeline.settle_round()
    (ours,) = rig.node.pool.values()
    # Given another transaction took its nonce and is mined
    cancel(rig, ours.nonce, ours.max_fee, ours.priority_fee)
    rig.evm.mine()
    # Then, once that is as deep as the depth, the payment failed (it can never be
    # mined) and a new one, with the next nonce, pays the credit exactly once
    run_until_credited(rig, pipeline, deposit_id)
    assert rig.paid() == 89_500_000
    assert rig.credited_events(deposit_id) == 1
    first, second = payment_rows(rig.db, deposit_id)
    assert (first["nonce"], first["outcome"]) == (ours.nonce, "failed")
    assert (second["nonce"], second["outcome"]) == (ours.nonce + 1, "mined")
    alerts = [r for r in caplog.records if r.getMessage().startswith("ALERT hot-wallet payment")]
    assert 1 <= len(alerts) <= 2  # once per payment


# -- 3. several workers, one wallet ------------------------------------------------------------


def test_two_workers_on_one_wallet_never_reuse_a_nonce(rig: Rig) -> None:
    ids = [rig.deposit((10 + n) * USDC) for n in range(6)]
    # Given two workers (each its own payer and node connection) and a slow broadcast,
    # so both hold a "pending nonce" before either transaction reaches the node
    rig.proxy.delay("eth_sendRawTransaction", 0.3, times=None)
    # (a patient client: this test is about nonces, not timeouts on a loaded machine)
    pipelines = [rig.pipeline(rig.parts(timeout_s=10)), rig.pipeline(rig.parts(timeout_s=10))]

    def work(pipeline: Pipeline) -> None:
        for _ in range(2):
            pipeline.settle_round()

    for _ in range(10):
        threads = [threading.Thread(target=work, args=(p,)) for p in pipelines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        rig.evm.mine()
        if all(rig.status(i) == states.CREDITED for i in ids):
            break
    assert [rig.status(i) for i in ids] == [states.CREDITED] * 6
    # Then each deposit was paid once, by its first attempt, with a nonce of its own
    assert rig.paid() == sum((10 + n) * USDC - 500_000 for n in range(6))
    for deposit in deposits_of(rig.db, rig.account):
        assert (deposit.settle_attempts, deposit.failed_providers) == (1, [])
        assert rig.credited_events(deposit.id) == 1
    nonces = [row["nonce"] for i in ids for row in payment_rows(rig.db, i)]
    assert len(nonces) == 6 and len(set(nonces)) == 6


# -- 8. a payout is final at the destination chain's depth -------------------------------------


def test_a_payout_counts_only_at_depth_and_a_reorged_out_payout_lands_again(rig: Rig) -> None:
    deposit_id = rig.deposit(60 * USDC)
    pipeline = rig.pipeline(rig.parts())
    snapshot = rig.evm.snapshot()
    # Given the payout is mined (at once) and has one more block on it
    pipeline.settle_round()
    assert rig.paid() == 59_500_000
    rig.evm.mine()
    pipeline.settle_round()
    # Then it is not credited yet: two confirmations of three
    assert rig.status(deposit_id) == IN_FLIGHT
    # When a reorg drops the block that held it
    rig.evm.revert(snapshot)
    rig.evm.mine(2)
    assert rig.paid() == 0
    # Then it goes on in flight, the same transaction lands again, and only then credits
    run_until_credited(rig, pipeline, deposit_id)
    assert rig.paid() == 59_500_000
    (payment,) = payment_rows(rig.db, deposit_id)
    assert len(payment["tx_hashes"]) == 1
    assert rig.credited_events(deposit_id) == 1


# -- 2. ops cannot pay what may still land ------------------------------------------------------

OPS_NOW = PipelineSettings(
    poll_s=0.0,
    retry_base_s=0.0,
    sandbox_block_s=0,
    payment_replace_blocks=4,
    ops_stuck_after_s=0.0,  # the pipeline's own "stuck" rule never stands in the way here
)
ELSEWHERE = "0x" + "ee" * 32


def test_ops_cannot_credit_or_fail_a_payment_that_may_still_be_mined(pooled: Rig) -> None:
    rig = pooled
    deposit_id = rig.deposit(70 * USDC)
    parts = rig.parts(OPS_NOW)
    rig.pipeline(parts).settle_round()
    (in_flight,) = rig.node.pooled()
    assert rig.status(deposit_id) == IN_FLIGHT
    # When ops credit it with a transaction of their own, or fail it
    with pytest.raises(Conflict) as credit:
        parts.ops.credit(deposit_id, ELSEWHERE, by="ops-ann", reason="paid by hand")
    with pytest.raises(Conflict) as fail:
        parts.ops.fail(deposit_id, "customer refunded", by="ops-ann")
    # Then both are refused, saying why and what to do
    for refusal in (credit.value.message, fail.value.message):
        assert "may still be mined" in refusal and in_flight in refusal
        assert f"--tx {in_flight}" in refusal or "--tx <" in refusal
        assert "nonce" in refusal
    assert rig.status(deposit_id) == IN_FLIGHT
    # And crediting it with the payment's own transaction is refused while that is only
    # in the node's pool (it could still be dropped or replaced)
    with pytest.raises(Conflict) as early:
        parts.ops.credit(deposit_id, in_flight, by="ops-ann", reason="seen in the pool")
    assert "not mined" in early.value.message and "Wait for the worker" in early.value.message
    # And allowed once it is mined as deep as the chain's confirmations: it is that payment
    rig.evm.mine(DEPTH + 1)
    deposit = parts.ops.credit(deposit_id, in_flight, by="ops-ann", reason="seen on chain")
    assert (deposit.status, deposit.credit_tx_hash) == (states.CREDITED, in_flight)
    rig.pipeline(parts).settle_round()
    assert rig.paid() == 69_500_000
    assert rig.credited_events(deposit_id) == 1
    assert [row["outcome"] for row in payment_rows(rig.db, deposit_id)] == ["ops"]


def test_ops_may_fail_a_payment_whose_nonce_another_transaction_used(pooled: Rig) -> None:
    rig = pooled
    deposit_id = rig.deposit(80 * USDC)
    parts = rig.parts(OPS_NOW)
    rig.pipeline(parts).settle_round()
    (ours,) = rig.node.pool.values()
    # Given ops cancel it: another transaction from the hot wallet with the same nonce
    cancel(rig, ours.nonce, ours.max_fee, ours.priority_fee)
    rig.evm.mine()
    # Then, until that is as deep as the chain's depth, failing is still refused
    with pytest.raises(Conflict):
        parts.ops.fail(deposit_id, "cancelled", by="ops-ann")
    rig.evm.mine(DEPTH)
    # And then allowed: our transaction can no longer be mined
    deposit = parts.ops.fail(deposit_id, "cancelled", by="ops-ann")
    assert (deposit.status, deposit.failure_reason) == (states.FAILED, "cancelled")
    assert rig.paid() == 0
    assert [row["outcome"] for row in payment_rows(rig.db, deposit_id)] == ["ops"]


def test_a_receipt_from_a_block_that_left_the_chain_is_not_taken_as_paid(rig: Rig) -> None:
    deposit_id = rig.deposit(65 * USDC)
    # (no replacement in this test: the same transaction is the only candidate)
    pipeline = rig.pipeline(rig.parts(replace(SETTINGS, payment_replace_blocks=50)))
    snapshot = rig.evm.snapshot()
    pipeline.settle_round()
    mined_at = rig.evm.head()
    stale = rig.proxy.capture_fork(from_block=mined_at)
    # Given a reorg drops the payout's block, and the new branch is already deep...
    rig.evm.revert(snapshot)
    rig.evm.mine(DEPTH + 1)
    assert rig.paid() == 0
    # ...while receipts come from a node still on the old branch (a load-balanced RPC)
    rig.proxy.serve_fork(stale, methods=("eth_getTransactionReceipt",))
    for _ in range(3):
        pipeline.settle_round()
        rig.evm.mine()
        # Then the stale receipt is not a payment: its block is not the canonical one
        assert rig.status(deposit_id) == IN_FLIGHT
    # (the node had lost the transaction: it was sent again, the same one, and landed)
    assert rig.paid() == 64_500_000
    # And once receipts come from the canonical chain, it is credited, once
    rig.proxy.serve_fork(None)
    run_until_credited(rig, pipeline, deposit_id)
    (deposit,) = [d for d in deposits_of(rig.db, rig.account) if d.id == deposit_id]
    receipt = rig.evm.receipt(deposit.credit_tx_hash or "")
    assert receipt["blockHash"] == bytes.fromhex(rig.evm.block_hash(receipt["blockNumber"])[2:])
    assert rig.paid() == 64_500_000
    assert rig.credited_events(deposit_id) == 1


def test_a_worker_dying_between_the_commit_and_the_broadcast_pays_once(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    deposit_id = rig.deposit(35 * USDC)
    dying = rig.parts()
    # Given a worker stored the signed payment and died before broadcasting it
    monkeypatch.setattr(EvmPayer, "broadcast", lambda self, raw: None)
    dying.settling.settle(deposit_id)
    monkeypatch.undo()
    assert rig.status(deposit_id) == IN_FLIGHT
    assert rig.paid() == 0 and rig.proxy.count("eth_sendRawTransaction") == 0
    # When another worker (a new process: its own payer) takes over
    run_until_credited(rig, rig.pipeline(rig.parts()), deposit_id)
    # Then it sent the stored transaction, not a new one: one payment, one transfer
    (payment,) = payment_rows(rig.db, deposit_id)
    assert len(payment["tx_hashes"]) == 1
    assert rig.proxy.count("eth_sendRawTransaction") == 1
    assert rig.paid() == 34_500_000
    assert rig.credited_events(deposit_id) == 1


def test_a_replacement_never_pays_more_than_the_fee_cap(pooled: Rig) -> None:
    rig = pooled
    deposit_id = rig.deposit(45 * USDC)
    pipeline = rig.pipeline(rig.parts())
    pipeline.settle_round()
    (first,) = rig.node.pool.values()
    rig.node.min_fee_wei = first.max_fee + 1  # stuck: underpriced
    # Given a cap at what the payment already offers
    cap = Decimal(first.max_fee) / 10**9
    capped = rig.pipeline(rig.parts(replace(SETTINGS, payment_max_fee_gwei={rig.chain_id: cap})))
    for _ in range(SETTINGS.payment_replace_blocks + 2):
        rig.evm.mine()
        capped.settle_round()
    # Then it was not replaced: it waits (and alerts) rather than outbid the cap
    (payment,) = payment_rows(rig.db, deposit_id)
    assert len(payment["tx_hashes"]) == 1 and rig.status(deposit_id) == IN_FLIGHT
    # And without the cap it is replaced and lands, once
    run_until_credited(rig, pipeline, deposit_id)
    assert rig.paid() == 44_500_000


def test_the_ops_command_line_checks_the_chain_and_says_what_to_do(
    pg_db: Database,
    pg_url: str,
    tenant: TenantKeys,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # (on anvil: the command line's hot wallet checks the node serves the chain it names,
    # which the in-process EVM, serving one chain id for every test's, does not)
    with anvil_rig(pg_db, tenant.tenant_id) as rig:
        deposit_id = rig.deposit(25 * USDC)
        rig.pipeline(rig.parts()).settle_round()
        (in_flight,) = rig.node.pending()
        chains = tmp_path / "chains.toml"
        chains.write_text(chains_toml(chain_id=rig.chain_id, depth=DEPTH, usdc=rig.token))
        for name, value in {
            "SETTLE_DATABASE_URL": pg_url,
            "SETTLE_ENV": "dev",
            "SETTLE_CHAINS_FILE": str(chains),
            f"SETTLE_RPC_URL_{rig.chain_id}": rig.node.url,
            "SETTLE_HOT_WALLET_KEY": rig.hot.key.hex(),
            "SETTLE_OPS_STUCK_AFTER_S": "0",
        }.items():
            monkeypatch.setenv(name, value)
        # When ops fail the deposit from the command line while its payment is pending
        code = cli.main(["deposits", "fail", deposit_id, "--reason", "refunded", "--by", "ops-ann"])
        err = capsys.readouterr().err
        # Then it is refused, naming the transaction and what to do
        assert code == 2
        assert err.startswith("error: conflict: ") and "may still be mined" in err
        assert in_flight in err and "--tx" in err and "not mined" in err
        assert rig.status(deposit_id) == IN_FLIGHT
        # And crediting it with that very transaction waits until the chain shows it paid
        code = cli.main(["deposits", "credit", deposit_id, "--tx", in_flight, "--by", "ops-ann"])
        assert code == 2 and "it is not mined" in capsys.readouterr().err
        rig.node.mine(DEPTH + 1)
        code = cli.main(["deposits", "credit", deposit_id, "--tx", in_flight, "--by", "ops-ann"])
        assert code == 0, capsys.readouterr().err
        assert rig.status(deposit_id) == states.CREDITED


def test_a_worker_without_the_payer_leaves_an_in_flight_payment_to_one_that_has_it(
    pooled: Rig,
) -> None:
    # Given a payment in flight whose broadcast the node dropped
    rig = pooled
    first = rig.deposit(10 * USDC)
    pipeline = rig.pipeline(rig.parts())
    rig.proxy.drop_sends(times=None)
    pipeline.settle_round()
    # When a worker without the hot wallet (no key or RPC URL, or the chain paused)
    # polls it
    bare = deposit_parts(
        rig.db, rig.registry, settlement=Settlement(rig.registry, payers={}), settings=SETTINGS
    )
    rig.pipeline(bare).settle_round()
    rig.proxy.clear()
    # Then the payment is not abandoned to review: the worker that has the wallet
    # re-sends it, and a later payment (the next nonce) is not blocked behind it
    assert rig.status(first) != states.MANUAL_REVIEW_REQUIRED
    second = rig.deposit(20 * USDC)
    for _ in range(12):
        pipeline.settle_round()
        rig.evm.mine()
    assert rig.status(first) == states.CREDITED
    assert rig.status(second) == states.CREDITED
