"""The chain watcher against a hostile network: the in-process EVM served over HTTP
(`EvmNode`), read through the fault-injecting proxy (`RpcProxy`), on PostgreSQL.

Each test is a way a real node or a real chain misleads a watcher: a reorg that re-mines
a transfer elsewhere, a logs backend behind the head or on a stale fork, a shorter new
branch, a reorg deeper than the kept checkpoints, spam. The chain's depth is 3.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from eth_account.signers.local import LocalAccount

from services.cli import main
from services.core.chains import ChainRegistry
from services.core.deposits import states
from services.core.deposits.metrics import ChainCollector
from services.core.deposits.models import ChainIncident, StrayTransfer
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import Settlement, SimulatedPayer
from services.core.deposits.watcher import ChainWatcher
from services.core.evm import TRANSFER_TOPIC, Web3ChainReader
from services.core.models import OutboxEvent
from shared.db import Database
from tests.conftest import TenantKeys
from tests.support.deposits import (
    AccountRef,
    DepositParts,
    deposit_event_types,
    deposit_parts,
    deposits_of,
    make_account,
    small_registry,
    unique_chain_id,
)
from tests.support.evm_chain import EvmChain
from tests.support.evm_node import EvmNode
from tests.support.rpc_proxy import WHOLE_NODE, RpcProxy

pytestmark = pytest.mark.integration

USDC = 10**6
DEPTH = 3


@dataclass
class Rig:
    evm: EvmChain
    proxy: RpcProxy
    token: str
    registry: ChainRegistry
    parts: DepositParts
    account: AccountRef
    customer: LocalAccount
    other: LocalAccount
    chain_id: int
    start_block: int

    @property
    def address(self) -> str:
        return self.account.address(self.chain_id)

    def reader(self) -> Web3ChainReader:
        return Web3ChainReader.from_url(self.proxy.url, 2.0)

    def watcher(self, **options: int) -> ChainWatcher:
        chain = self.registry.get(self.chain_id)
        assert chain is not None
        options.setdefault("lag_blocks", 0)
        options.setdefault("start_block", self.start_block)
        return ChainWatcher(self.parts.detection, chain, self.reader(), **options)

    def send(self, amount_raw: int, *, to: str | None = None, token: str | None = None) -> str:
        """A transfer from the customer, queued for the next mined block."""
        return self.evm.transfer(token or self.token, self.customer, to or self.address, amount_raw)

    def aside(self, amount_raw: int = 1) -> str:
        """A transfer of the same token between strangers (it takes a log position)."""
        return self.evm.transfer(self.token, self.other, self.other.address, amount_raw)


@pytest.fixture(scope="module")
def evm() -> EvmChain:
    return EvmChain()


@pytest.fixture(scope="module")
def node(evm: EvmChain) -> Iterator[EvmNode]:
    with EvmNode(evm) as served:
        yield served


def build_rig(
    evm: EvmChain, node_url: str, db: Database, tenant: TenantKeys, **chain_options: Any
) -> Iterator[Rig]:
    token = evm.deploy_token("USDC", 6)
    chain_id = unique_chain_id()
    registry = small_registry(
        chain_id=chain_id, depth=DEPTH, usdc=token, min_deposit_usd=1.0, **chain_options
    )
    settlement = Settlement(registry, payers={chain_id: SimulatedPayer()})
    parts = deposit_parts(
        db,
        registry,
        settlement=settlement,
        settings=PipelineSettings(poll_s=0.0, ops_stuck_after_s=0.0),
    )
    customer, other = evm.new_account(), evm.new_account()
    evm.mint(token, customer.address, 10**6 * USDC)
    evm.mint(token, other.address, 10**6 * USDC)
    account = make_account(
        db, tenant.tenant_id, registry, dest_chain_id=chain_id, dest_token_address=token
    )
    with RpcProxy(node_url) as proxy:
        yield Rig(
            evm, proxy, token, registry, parts, account, customer, other, chain_id, evm.head() + 1
        )


@pytest.fixture
def rig(evm: EvmChain, node: EvmNode, pg_db: Database, tenant: TenantKeys) -> Iterator[Rig]:
    yield from build_rig(evm, node.url, pg_db, tenant)


def tick(watcher: ChainWatcher, rounds: int = 1) -> None:
    for _ in range(rounds):
        watcher.tick()


def failed_events(db: Database, tenant_id: str) -> int:
    with db.reader() as session:
        return int(
            session.scalar(
                sa.select(sa.func.count())
                .select_from(OutboxEvent)
                .where(
                    OutboxEvent.tenant_id == tenant_id, OutboxEvent.event_type == "deposit.failed"
                )
            )
            or 0
        )


def incidents(db: Database, chain_id: int) -> list[ChainIncident]:
    with db.reader() as session:
        rows = list(
            session.scalars(
                sa.select(ChainIncident)
                .where(ChainIncident.chain_id == chain_id, ChainIncident.resolved_at.is_(None))
                .order_by(ChainIncident.id)
            )
        )
        session.expunge_all()
        return rows


def pending_under_final_metric(db: Database, chain_id: int) -> float:
    for family in ChainCollector(db).collect():
        if family.name == "settle_deposits_pending_under_final":
            for sample in family.samples:
                if sample.labels == {"chain_id": str(chain_id)}:
                    return sample.value
    return 0.0


def open_incidents_metric(db: Database, chain_id: int) -> float:
    for family in ChainCollector(db).collect():
        if family.name == "settle_chain_incidents_open":
            for sample in family.samples:
                if sample.labels == {"chain_id": str(chain_id), "kind": "deep_reorg"}:
                    return sample.value
    return 0.0


# -- a transfer identity that survives reorgs -------------------------------------------------


def test_transfer_re_mined_at_another_log_index_moves_its_deposit(
    rig: Rig, pg_db: Database
) -> None:
    w = rig.watcher()
    w.tick()
    # Given 100 USDC seen alone in its block (log index 0)
    tx = rig.send(100 * USDC)
    rig.evm.mine()
    w.tick()
    (seen,) = deposits_of(pg_db, rig.account)
    assert (seen.status, seen.log_index) == (states.SOURCE_SEEN, 0)
    # When a reorg re-mines it in the same height behind another transfer (log index 1)
    rig.evm.rewind(1)
    rig.aside()
    rig.evm.replay(tx)
    rig.evm.mine()
    tick(w, 2)
    rig.evm.mine(DEPTH)
    tick(w, 2)
    # Then the one deposit moved and confirmed: no second deposit, no deposit.failed
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.id == seen.id and deposit.source_tx_hash == tx
    assert (deposit.status, deposit.log_index) == (states.SOURCE_CONFIRMED, 1)
    assert deposit.block_hash == rig.evm.block_hash(deposit.block_number or 0)
    assert deposit_event_types(pg_db, deposit.id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
    ]
    assert failed_events(pg_db, rig.account.tenant_id) == 0


def test_a_first_look_finds_a_deposit_mined_and_buried_before_it(rig: Rig, pg_db: Database) -> None:
    # Given 42 USDC mined and buried five blocks past the depth before any watcher
    # looked at the chain (a first deployment; the worker started late)
    rig.send(42 * USDC)
    rig.evm.mine(DEPTH + 5)
    # When the chain's watcher takes its first look (no start block, no cursor), its
    # reader asking the node's block times over HTTP
    rig.watcher(start_block=None).tick()
    # Then the deposit is found, and confirmed at once
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.SOURCE_CONFIRMED and deposit.amount_raw == str(42 * USDC)


def test_credited_transfer_re_mined_past_the_depth_is_never_a_second_deposit(
    rig: Rig, pg_db: Database
) -> None:
    # (a checkpoint per block, so the watcher finds the fork point)
    w = rig.watcher(max_range=1)
    rig.evm.mine()
    w.tick()
    # Given 100 USDC seen, confirmed at depth and credited
    tx = rig.send(100 * USDC)
    rig.evm.mine(DEPTH)
    tick(w, 2)
    (deposit,) = deposits_of(pg_db, rig.account)
    assert rig.parts.settling.settle(deposit.id) == states.CREDITED
    # When a reorg deeper than the depth re-mines the transfer at another log position
    rig.evm.rewind(DEPTH + 1)
    rig.aside()
    rig.evm.replay(tx)
    rig.evm.mine(DEPTH + 2)
    tick(w, 3)
    # Then it is still one deposit, credited once, now pointing at its new block
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.CREDITED and deposit.source_tx_hash == tx
    assert deposit_event_types(pg_db, deposit.id).count("deposit.credited") == 1
    assert deposit.block_hash == rig.evm.block_hash(deposit.block_number or 0)
    # And ops were told: an open incident and a metric to alert on
    (incident,) = incidents(pg_db, rig.chain_id)
    assert (incident.kind, incident.deposit_id) == ("deep_reorg", deposit.id)
    assert open_incidents_metric(pg_db, rig.chain_id) == 1


def test_confirmed_at_the_nodes_finalized_block_not_at_the_depth(
    evm: EvmChain, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a chain confirmed at the `finalized` tag, on a node finalizing 6 blocks deep
    with EvmNode(evm, finalized_depth=6) as node:
        for rig in build_rig(evm, node.url, pg_db, tenant, finality_tag="finalized"):
            w = rig.watcher()
            w.tick()
            # When 9 USDC are the depth deep (3 blocks), then 6 deep (not yet finalized:
            # the node's finalized block is the 6th under the head)
            rig.send(9 * USDC)
            rig.evm.mine(DEPTH)
            tick(w, 2)
            (deposit,) = deposits_of(pg_db, rig.account)
            assert (deposit.status, deposit.confirmations) == (states.SOURCE_SEEN, DEPTH)
            rig.evm.mine(3)
            tick(w, 2)
            assert deposits_of(pg_db, rig.account)[0].status == states.SOURCE_SEEN
            # Then only the node's finalized block confirms it
            rig.evm.mine()
            tick(w, 2)
            (deposit,) = deposits_of(pg_db, rig.account)
            assert (deposit.status, deposit.confirmations) == (states.SOURCE_CONFIRMED, 7)


def test_confirmed_unpaid_deposit_whose_block_leaves_the_chain_is_held_for_review(
    rig: Rig, pg_db: Database
) -> None:
    w = rig.watcher(max_range=1)
    rig.evm.mine()
    w.tick()
    # Given 80 USDC confirmed at depth, not paid yet
    rig.send(80 * USDC)
    rig.evm.mine(DEPTH)
    tick(w, 2)
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.SOURCE_CONFIRMED
    # When a reorg deeper than the depth replaces its block with one without it
    rig.evm.rewind(DEPTH + 1)
    rig.evm.mine(DEPTH + 2)
    tick(w, 3)
    # Then it goes to manual review (never paid on a transfer that may be gone), with an
    # incident for ops
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.MANUAL_REVIEW_REQUIRED
    assert (deposit.review_reason or "").startswith("source_reorged")
    assert rig.parts.settling.settle(deposit.id) is None
    assert [i.deposit_id for i in incidents(pg_db, rig.chain_id)] == [deposit.id]


def test_vanished_transfer_is_failed_only_after_its_absence_reaches_the_depth(
    rig: Rig, pg_db: Database
) -> None:
    w = rig.watcher()
    w.tick()
    tx = rig.send(40 * USDC)
    rig.evm.mine()
    w.tick()
    (seen,) = deposits_of(pg_db, rig.account)
    # When a reorg drops its block and the new branch does not have it (yet)
    rig.evm.rewind(1)
    rig.evm.mine()
    tick(w, 2)
    rig.evm.mine()
    tick(w, 2)
    # Then it waits: absent for two blocks is not yet gone
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.SOURCE_SEEN
    # When the transfer is mined again a block later
    rig.evm.replay(tx)
    rig.evm.mine()
    tick(w, 2)
    rig.evm.mine(DEPTH)
    tick(w, 2)
    # Then the same deposit follows it and confirms; the tenant never heard "failed"
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.id == seen.id and deposit.status == states.SOURCE_CONFIRMED
    assert deposit_event_types(pg_db, deposit.id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
    ]


def test_vanished_transfer_fails_reorged_once_absent_for_the_depth(
    rig: Rig, pg_db: Database
) -> None:
    w = rig.watcher()
    w.tick()
    rig.send(40 * USDC)
    rig.evm.mine()
    w.tick()
    rig.evm.rewind(1)
    for _ in range(DEPTH - 1):
        rig.evm.mine()
        tick(w, 2)
        assert deposits_of(pg_db, rig.account)[0].status == states.SOURCE_SEEN
    rig.evm.mine(2)
    tick(w, 2)
    (deposit,) = deposits_of(pg_db, rig.account)
    assert (deposit.status, deposit.failure_reason) == (states.FAILED, states.REASON_REORGED)
    assert deposit_event_types(pg_db, deposit.id) == ["deposit.source_seen", "deposit.failed"]


def test_a_vanished_transfer_fails_only_once_its_height_is_final(
    evm: EvmChain, node: EvmNode, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a chain confirmed 6 deep (reorg_depth; the node offers no finalized tag), and
    # 40 USDC seen in block N
    for rig in build_rig(evm, node.url, pg_db, tenant, reorg_depth=6):
        w = rig.watcher()
        w.tick()
        tx = rig.send(40 * USDC)
        rig.evm.mine()
        w.tick()
        (seen,) = deposits_of(pg_db, rig.account)
        # When a reorg drops it and the new branch is read for more than the depth of 3
        # blocks without it (N is not final yet)
        rig.evm.rewind(1)
        for _ in range(DEPTH + 1):
            rig.evm.mine()
            w.tick()
        # Then it is not failed: the transfer may still come back before N is final
        assert deposits_of(pg_db, rig.account)[0].status == states.SOURCE_SEEN
        # When it does, a block later, the same deposit follows it (never failed)
        rig.evm.replay(tx)
        rig.evm.mine(6)
        tick(w, 2)
        (deposit,) = deposits_of(pg_db, rig.account)
        assert deposit.id == seen.id and deposit.status == states.SOURCE_CONFIRMED
        assert failed_events(pg_db, rig.account.tenant_id) == 0


def test_absence_is_counted_in_blocks_read_not_blocks_mined(rig: Rig, pg_db: Database) -> None:
    # Given 40 USDC seen in block N, and a logs backend two blocks behind the node
    w = rig.watcher()
    w.tick()
    tx = rig.send(40 * USDC)
    rig.evm.mine()
    w.tick()
    (seen,) = deposits_of(pg_db, rig.account)
    rig.proxy.lag(2)
    # When a reorg re-mines the transfer in block N + 2, and the head is N + 2 (the depth
    # of blocks since N), though only block N of the new branch could be read yet
    rig.evm.rewind(1)
    rig.evm.mine(2)
    rig.evm.replay(tx)
    rig.evm.mine()
    w.tick()
    # Then the deposit waits (the blocks not read yet may hold its transfer)
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.SOURCE_SEEN
    # And once the backend catches up, the same deposit follows its transfer and confirms
    rig.proxy.lag(0)
    rig.evm.mine(DEPTH)
    tick(w, 2)
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.id == seen.id and deposit.status == states.SOURCE_CONFIRMED
    assert deposit.block_number == (seen.block_number or 0) + 2
    assert failed_events(pg_db, rig.account.tenant_id) == 0


def test_shorter_new_branch_does_not_fail_a_pending_deposit_before_a_rescan(
    rig: Rig, pg_db: Database
) -> None:
    w = rig.watcher()
    w.tick()
    # Given 25 USDC seen, one block under the head
    tx = rig.send(25 * USDC)
    rig.evm.mine(2)
    w.tick()
    (seen,) = deposits_of(pg_db, rig.account)
    # When both blocks are replaced by a branch one block long that still has the transfer
    rig.evm.reorg(2, reinclude=[tx], length=1)
    tick(w, 2)
    # Then the deposit was not failed; it follows the transfer and confirms at depth
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.id == seen.id and deposit.status == states.SOURCE_SEEN
    rig.evm.mine(DEPTH)
    tick(w, 2)
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.SOURCE_CONFIRMED
    assert deposit.block_hash == rig.evm.block_hash(deposit.block_number or 0)
    assert failed_events(pg_db, rig.account.tenant_id) == 0


def test_ops_failing_a_deposit_as_reorged_does_not_let_its_transfer_count_again(
    rig: Rig, pg_db: Database
) -> None:
    w = rig.watcher(max_range=50)
    rig.evm.mine()
    w.tick()
    # Given a deposit scanned in a range of two blocks
    rig.send(60 * USDC)
    rig.evm.mine(2)
    w.tick()
    (deposit,) = deposits_of(pg_db, rig.account)
    # When ops fail it with the reason "reorged" (settle deposits fail --reason reorged)
    rig.parts.ops.fail(deposit.id, "reorged", by="ops")
    # And a reorg of the range's last block makes the watcher read the range again
    rig.evm.rewind(1)
    rig.evm.mine(DEPTH + 1)
    tick(w, 3)
    # Then the transfer is not recorded a second time
    (deposit,) = deposits_of(pg_db, rig.account)
    assert (deposit.status, deposit.failure_reason) == (states.FAILED, "reorged")


# -- complete logs or none ---------------------------------------------------------------------


def test_logs_backend_two_blocks_behind_does_not_lose_the_deposit(
    rig: Rig, pg_db: Database
) -> None:
    # Given the default distance of one block, and a logs backend two blocks behind the
    # node that answers the head (it answers [] past its own head, without an error)
    rig.proxy.lag(2)
    w = rig.watcher(lag_blocks=1)
    w.tick()
    # When 500 USDC arrive and the chain moves on
    rig.send(500 * USDC)
    for _ in range(DEPTH + 3):
        rig.evm.mine()
        w.tick()
    # Then the deposit is recorded and confirmed all the same
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.amount_raw == str(500 * USDC)
    assert deposit.status == states.SOURCE_CONFIRMED
    assert rig.proxy.count("eth_getLogs", "lagged") > 0


def test_range_from_a_lagging_backend_with_the_probe_answered_by_a_fresh_one_loses_nothing(
    rig: Rig, pg_db: Database
) -> None:
    # Given a load-balanced provider: range queries reach a logs backend DEPTH + 2 blocks
    # behind ([] past its head, no error), the by-hash probe of a range's last block an
    # up-to-date one (so the probe of a quiet last block matches the lagging range)
    w = rig.watcher()
    w.tick()
    rig.proxy.lag(DEPTH + 2, by_hash=False)
    # When 500 USDC arrive in the middle of the ranges read, past the lagging backend's head
    rig.send(500 * USDC)
    rig.evm.mine()
    refused = 0
    for _ in range(DEPTH + 8):
        rig.evm.mine()
        refused += w.tick().refused
    # Then no range passed the deposit's block while that backend had not seen it: the
    # deposit is recorded (and confirmed) as soon as it has
    assert refused > 0
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.amount_raw == str(500 * USDC)
    assert deposit.status == states.SOURCE_CONFIRMED
    assert rig.proxy.count("eth_getLogs", "lagged") > 0


def test_seen_deposit_is_confirmed_though_the_final_reading_meets_a_lagging_backend(
    rig: Rig, pg_db: Database
) -> None:
    # Given 500 USDC seen at the tip
    w = rig.watcher()
    w.tick()
    rig.send(500 * USDC)
    rig.evm.mine()
    w.tick()
    (seen,) = deposits_of(pg_db, rig.account)
    assert seen.status == states.SOURCE_SEEN
    # When the reading at finality meets range queries from a backend further behind than
    # the finality depth, the by-hash probe answered by an up-to-date one
    rig.proxy.lag(DEPTH + 2, by_hash=False)
    for _ in range(DEPTH + 8):
        rig.evm.mine()
        w.tick()
    # Then the finality reading did not pass the deposit's block without it: confirmed
    # (once the lagging backend had that block)
    assert w.confirmed_block() > (seen.block_number or 0)
    (after,) = deposits_of(pg_db, rig.account)
    assert after.status == states.SOURCE_CONFIRMED


def test_a_pending_deposit_passed_by_the_finality_reading_is_reported(
    rig: Rig, pg_db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a node whose headers carry no logsBloom (nothing to check the ranges against)
    w = rig.watcher()
    headers = w.reader.block_headers
    w.reader.block_headers = lambda numbers: {  # type: ignore[method-assign]
        n: dataclasses.replace(h, logs_bloom=None) for n, h in headers(numbers).items()
    }
    w.tick()
    rig.send(500 * USDC)
    rig.evm.mine()
    w.tick()
    # When the reading at finality meets a lagging range backend and passes the deposit
    rig.proxy.lag(DEPTH + 2, by_hash=False)
    passed = 0
    for _ in range(DEPTH + 8):
        rig.evm.mine()
        passed += w.tick().passed_pending
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.SOURCE_SEEN
    assert w.confirmed_block() > (deposit.block_number or 0)
    # Then it is not silent: counted, logged, and in the ops gauge
    assert passed > 0
    assert "pending under the finality cursor" in caplog.text
    assert pending_under_final_metric(pg_db, rig.chain_id) == 1.0


def test_logs_from_a_stale_fork_are_refused_until_the_backend_agrees(
    rig: Rig, pg_db: Database
) -> None:
    # Given a transfer mined in block N, and the branch it is on captured
    rig.evm.mine()
    first = rig.evm.head() + 1
    tx = rig.send(70 * USDC)
    rig.evm.mine(2)
    fork = rig.proxy.capture_fork(first)
    # When a reorg re-mines it one block later, and the logs backend stays on the old branch
    rig.evm.reorg(2, reinclude=[tx], skip=1, length=3)
    rig.proxy.serve_fork(fork, methods=("eth_getLogs",))
    w = rig.watcher(start_block=first)
    tick(w, 2)
    # Then nothing is recorded from logs whose block hashes the headers contradict
    assert deposits_of(pg_db, rig.account) == []
    # When the backend catches up with the canonical chain
    rig.proxy.serve_fork(None)
    tick(w, 2)
    rig.evm.mine(DEPTH)
    tick(w, 2)
    # Then the transfer is one deposit in its canonical block, never failed
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.block_number == first + 1
    assert deposit.block_hash == rig.evm.block_hash(first + 1)
    assert deposit.status == states.SOURCE_CONFIRMED
    assert failed_events(pg_db, rig.account.tenant_id) == 0


def test_reorg_deeper_than_the_checkpoints_rescans_from_the_real_fork_point(
    rig: Rig, pg_db: Database
) -> None:
    # Given a watcher scanning one block per range (a checkpoint per block)
    w = rig.watcher(max_range=1)
    rig.evm.mine(40)
    tick(w, 3)
    kept = DEPTH + 16
    # When a reorg replaces more blocks than the checkpoints kept, and the new branch has
    # a transfer in its first block
    rig.evm.rewind(kept + 8)
    tx = rig.send(33 * USDC)
    rig.evm.mine(kept + 10)
    tick(w, 6)
    # Then the watcher found the real fork point and the transfer is recorded
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.source_tx_hash == tx


def test_reorg_below_every_checkpoint_reads_again_from_where_watching_began(
    rig: Rig, pg_db: Database
) -> None:
    # Given a watcher that read its first eight blocks at once, with a transfer in the
    # second one confirmed (its checkpoints: the ends of the two ranges it read)
    w = rig.watcher(max_range=50)
    rig.evm.mine()
    tx = rig.send(45 * USDC)
    rig.evm.mine(7)
    w.tick()
    (seen,) = deposits_of(pg_db, rig.account)
    assert seen.status == states.SOURCE_CONFIRMED
    # When a reorg replaces every block it read, re-mining the transfer two blocks later
    rig.evm.rewind(8)
    rig.evm.mine(3)
    rig.evm.replay(tx)
    rig.evm.mine(7)
    tick(w, 3)
    # Then the watcher read again from where it began: the deposit followed its transfer
    # to its new block, and ops were told (a confirmed deposit's block left the chain)
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.id == seen.id and deposit.block_number == rig.start_block + 3
    assert deposit.block_hash == rig.evm.block_hash(rig.start_block + 3)
    assert [i.deposit_id for i in incidents(pg_db, rig.chain_id)] == [deposit.id]


def test_a_node_far_behind_is_not_a_reorg_and_raises_no_incident(rig: Rig, pg_db: Database) -> None:
    # Given 30 USDC confirmed (a checkpoint per block, twelve blocks read before it)
    w = rig.watcher(max_range=1)
    rig.evm.mine(12)
    tick(w, 2)
    rig.send(30 * USDC)
    rig.evm.mine(DEPTH + 2)
    tick(w, 2)
    (seen,) = deposits_of(pg_db, rig.account)
    assert seen.status == states.SOURCE_CONFIRMED
    # When the node answering falls further behind than the depth (a load-balanced
    # provider's backend resyncing: its head, blocks and logs all from the past)
    rig.proxy.lag(DEPTH + 4, WHOLE_NODE)
    tick(w, 2)
    # Then blocks it has not got are not blocks that left the chain: no incident, and the
    # deposit is not held for review
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.status == states.SOURCE_CONFIRMED
    assert incidents(pg_db, rig.chain_id) == []
    # And when it is back, a new transfer is read as usual
    rig.proxy.lag(0)
    rig.send(7 * USDC)
    rig.evm.mine(DEPTH)
    tick(w, 3)
    assert [d.status for d in deposits_of(pg_db, rig.account)] == [states.SOURCE_CONFIRMED] * 2
    assert incidents(pg_db, rig.chain_id) == []


def settle(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pg_url: str, *argv: str
) -> tuple[int, Any, str]:
    """`settle <argv>` in-process, as ops run it; (exit code, stdout JSON, stderr)."""
    monkeypatch.setenv("SETTLE_DATABASE_URL", pg_url)
    monkeypatch.setenv("SETTLE_ENV", "dev")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code = main(["--json", *argv])
    captured = capsys.readouterr()
    out = captured.out.strip()
    return code, (json.loads(out) if out else None), captured.err


def test_ops_list_and_resolve_chain_incidents_from_the_command_line(
    rig: Rig,
    pg_db: Database,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a confirmed deposit whose block a reorg deeper than the depth replaced
    w = rig.watcher(max_range=1)
    rig.evm.mine()
    w.tick()
    rig.send(80 * USDC)
    rig.evm.mine(DEPTH)
    tick(w, 2)
    rig.evm.rewind(DEPTH + 1)
    rig.evm.mine(DEPTH + 2)
    tick(w, 3)
    (deposit,) = deposits_of(pg_db, rig.account)
    chain = str(rig.chain_id)
    # When ops list the open incidents of the chain
    code, listed, _ = settle(monkeypatch, capsys, pg_url, "incidents", "list", "--chain", chain)
    # Then they see it: which deposit, which block, what happened
    assert code == 0
    (incident,) = listed["chainIncidents"]
    assert incident["kind"] == "deep_reorg" and incident["chainId"] == rig.chain_id
    assert incident["depositId"] == deposit.id
    assert incident["blockNumber"] == deposit.block_number
    assert deposit.id in incident["detail"] and incident["resolvedAt"] is None
    assert open_incidents_metric(pg_db, rig.chain_id) == 1
    # When they resolve it, saying who and why
    code, resolved, _ = settle(
        monkeypatch,
        capsys,
        pg_url,
        "incidents",
        "resolve",
        str(incident["id"]),
        "--reason",
        "transfer checked on the explorer",
        "--by",
        "alice",
    )
    # Then it is closed, with who and why kept, and the metric drops
    assert code == 0
    assert resolved["chainIncident"]["id"] == incident["id"]
    assert resolved["chainIncident"]["resolvedAt"] is not None
    assert resolved["chainIncident"]["detail"].endswith(
        "\nresolved by alice: transfer checked on the explorer"
    )
    assert open_incidents_metric(pg_db, rig.chain_id) == 0
    code, listed, _ = settle(monkeypatch, capsys, pg_url, "incidents", "list", "--chain", chain)
    assert (code, listed["chainIncidents"]) == (0, [])
    code, listed, _ = settle(
        monkeypatch, capsys, pg_url, "incidents", "list", "--chain", chain, "--all"
    )
    assert [i["id"] for i in listed["chainIncidents"]] == [incident["id"]]
    # And resolving it again, an unknown incident or a malformed id is a clear refusal
    for target, reason, error in (
        (str(incident["id"]), "again", "error: conflict: "),
        ("999999999999", "x", "error: not_found: "),
        ("inc_1", "x", "error: not_found: "),
        (str(incident["id"]), "  ", "error: invalid_request: "),
    ):
        code, out, err = settle(
            monkeypatch, capsys, pg_url, "incidents", "resolve", target, "--reason", reason
        )
        assert (code, out) == (2, None) and err.startswith(error), err


def test_a_logs_backend_answering_each_log_twice_makes_one_deposit(
    rig: Rig, pg_db: Database
) -> None:
    # Given a logs backend that answers every log of a block range twice
    rig.proxy.duplicate_logs()
    w = rig.watcher()
    w.tick()
    # When 12 USDC arrive, and the range read also covers the empty blocks after them
    rig.send(12 * USDC)
    rig.evm.mine(DEPTH + 1)
    tick(w, 2)
    # Then it is one deposit of 12 USDC, not a second transfer of the same transaction
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.amount_raw == str(12 * USDC) and deposit.transfer_seq == 0
    assert deposit.status == states.SOURCE_CONFIRMED
    assert rig.proxy.count("eth_getLogs", "duplicated") > 0


# -- only real deposits --------------------------------------------------------------------


def test_spam_zero_value_and_unknown_tokens_are_not_tenant_deposits(
    rig: Rig, pg_db: Database
) -> None:
    junk = rig.evm.deploy_token("JUNK", 18)
    rig.evm.mint(junk, rig.other.address, 10**30)
    w = rig.watcher()
    w.tick()
    # Given one block with 12 transfers of an unknown token, a zero-value USDC transfer
    # and one real deposit, all to the deposit address
    for i in range(12):
        rig.evm.transfer(junk, rig.other, rig.address, 10**18 + i)
    rig.send(0)
    real = rig.send(15 * USDC)
    rig.evm.mine(DEPTH)
    tick(w, 2)
    # Then the tenant sees one deposit and one source_seen, and no manual review
    (deposit,) = deposits_of(pg_db, rig.account)
    assert deposit.source_tx_hash == real
    with pg_db.reader() as session:
        types = list(
            session.scalars(
                sa.select(OutboxEvent.event_type).where(
                    OutboxEvent.tenant_id == rig.account.tenant_id,
                    OutboxEvent.event_type.like("deposit.%"),
                )
            )
        )
    assert sorted(types) == ["deposit.source_confirmed", "deposit.source_seen"]
    # And the unknown token's transfers are kept quietly for ops
    with pg_db.reader() as session:
        strays = list(
            session.scalars(sa.select(StrayTransfer).where(StrayTransfer.chain_id == rig.chain_id))
        )
    assert len(strays) == 12
    assert {s.token_address for s in strays} == {junk}
    assert {s.to_address for s in strays} == {rig.address}


def test_logs_are_asked_for_the_supported_tokens_and_matched_in_memory(
    rig: Rig, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given several accounts
    for _ in range(3):
        make_account(
            pg_db,
            tenant.tenant_id,
            rig.registry,
            dest_chain_id=rig.chain_id,
            dest_token_address=rig.token,
        )
    w = rig.watcher()
    rig.send(5 * USDC)
    rig.evm.mine()
    w.tick()
    # Then each eth_getLogs names the supported token contracts and only the Transfer
    # topic: no list of recipients, so the call count does not grow with the accounts
    calls = [c for c in rig.proxy.calls if c.method == "eth_getLogs"]
    assert calls
    for call in calls:
        spec = call.params[0]
        assert [a.lower() for a in spec["address"]] == [rig.token.lower()]
        assert spec["topics"] == [TRANSFER_TOPIC]
    assert len(deposits_of(pg_db, rig.account)) == 1


# -- rules a probe broke without a test noticing (issue 22) -----------------------------------


def test_a_log_from_a_block_off_the_canonical_chain_mid_range_is_never_recorded(
    rig: Rig, pg_db: Database
) -> None:
    # Given a transfer mined in the middle of a range (an empty block before it and after)
    rig.evm.mine()
    first = rig.evm.head() + 1
    rig.evm.mine()
    rig.send(70 * USDC)
    rig.evm.mine(2)
    stale = rig.proxy.capture_fork(first)
    # And a reorg that drops it: a longer branch of empty blocks replaces its block
    rig.evm.reorg(2, length=4)
    # When the range's logs come from a backend left on the old branch, while its last
    # block (canonical, empty) is confirmed by the probe asked by its hash
    rig.proxy.serve_fork(stale, methods=("eth_getLogs",))
    w = rig.watcher(start_block=first)
    tick(w, 3)
    rig.evm.mine(DEPTH)
    tick(w, 3)
    # Then nothing is recorded from a block the headers contradict
    assert deposits_of(pg_db, rig.account) == []
    # Nor later, once the backend agrees with the canonical chain (it has no transfer)
    rig.proxy.serve_fork(None)
    tick(w, 3)
    assert deposits_of(pg_db, rig.account) == []


def test_a_finalized_block_shallower_than_the_depth_does_not_confirm_early(
    evm: EvmChain, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a chain confirmed at the `finalized` tag, on a node finalizing 1 block deep
    with EvmNode(evm, finalized_depth=1) as node:
        for rig in build_rig(evm, node.url, pg_db, tenant, finality_tag="finalized"):
            w = rig.watcher()
            w.tick()
            # When 9 USDC are under the node's finalized block but one block short of the
            # chain's depth (3)
            rig.send(9 * USDC)
            rig.evm.mine(DEPTH - 1)
            tick(w, 2)
            # Then the depth still applies: seen, not confirmed
            (deposit,) = deposits_of(pg_db, rig.account)
            assert (deposit.status, deposit.confirmations) == (states.SOURCE_SEEN, DEPTH - 1)
            # And the depth's block confirms it
            rig.evm.mine()
            tick(w, 2)
            (deposit,) = deposits_of(pg_db, rig.account)
            assert (deposit.status, deposit.confirmations) == (states.SOURCE_CONFIRMED, DEPTH)
