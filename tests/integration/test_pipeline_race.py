"""Pipeline steps racing each other on the real PostgreSQL: durable events stay at most once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from services.core.chains import ChainRegistry
from services.core.deposits import states, transitions
from services.core.deposits.models import Deposit
from services.core.deposits.outcomes import CreditOrder, Outcome
from services.core.deposits.sandbox import SandboxChain, SandboxConfirmer
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import Settlement, SimulatedPayer
from services.core.deposits.watcher import ChainWatcher
from services.core.deposits.worker import Pipeline
from services.core.evm import InMemoryChain
from services.core.models import OutboxEvent
from shared.db import Database
from tests.conftest import TenantKeys
from tests.support.deposits import (
    SENDER,
    TEST_USDC,
    AccountRef,
    DepositParts,
    deposit_event_types,
    deposit_parts,
    deposits_of,
    make_account,
    set_fee,
    small_registry,
    unique_chain_id,
)

pytestmark = pytest.mark.integration


class SlowPayer(SimulatedPayer):
    """Pays after a pause (outside the transaction, like a real payer), so a second
    worker arrives while the first is paying."""

    instant = False

    def pay(self, order: CreditOrder) -> Outcome:
        time.sleep(0.2)
        return super().pay(order)


@pytest.fixture
def registry() -> ChainRegistry:
    # A chain of this test's own: its cursor, fee and transfers meet no other test's.
    return small_registry(chain_id=unique_chain_id(), depth=3)


@pytest.fixture
def account(pg_db: Database, tenant: TenantKeys, registry: ChainRegistry) -> AccountRef:
    return make_account(pg_db, tenant.tenant_id, registry, dest_chain_id=chain_of(registry))


def chain_of(registry: ChainRegistry) -> int:
    return registry.default_venue_chain_id


def new_parts(db: Database, registry: ChainRegistry) -> DepositParts:
    settlement = Settlement(registry, payers={chain_of(registry): SlowPayer()})
    return deposit_parts(db, registry, settlement=settlement, settings=PipelineSettings(poll_s=0.0))


def race(*steps: Callable[[], Any]) -> list[Any]:
    """Run the steps in threads released at the same moment; their results."""
    barrier = threading.Barrier(len(steps))
    results: list[Any] = [None] * len(steps)
    errors: list[BaseException] = []

    def runner(i: int, step: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[i] = step()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(i, s)) for i, s in enumerate(steps)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return results


def seen_deposit(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> str:
    chain.transfer(TEST_USDC, SENDER, account.address(chain.chain_id), 42 * 10**6)
    chain.mine()
    registry_chain = parts.registry.get(chain.chain_id)
    assert registry_chain is not None
    ChainWatcher(parts.detection, registry_chain, chain, lag_blocks=0, start_block=0).tick()
    (deposit,) = deposits_of(db, account)
    return deposit.id


def test_the_same_step_twice_at_once_emits_each_durable_event_once(
    pg_db: Database, registry: ChainRegistry, account: AccountRef
) -> None:
    set_fee(pg_db, chain_of(registry), "0.50")
    chain = InMemoryChain(chain_of(registry))
    one, two = new_parts(pg_db, registry), new_parts(pg_db, registry)
    deposit_id = seen_deposit(pg_db, one, chain, account)
    # When two workers confirm the same deposit at the same moment (blocking locks)
    results = race(
        lambda: one.detection.confirm(deposit_id, 3), lambda: two.detection.confirm(deposit_id, 3)
    )
    # Then exactly one of them moved it
    assert sum(r is not None for r in results) == 1
    # When two workers settle it at the same moment
    results = race(
        lambda: one.settling.settle(deposit_id, skip_locked=False),
        lambda: two.settling.settle(deposit_id, skip_locked=False),
    )
    assert results.count(states.CREDITED) == 1 and results.count(None) == 1
    assert deposit_event_types(pg_db, deposit_id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.credited",
    ]


def test_the_database_refuses_a_second_durable_event_even_without_the_row_lock(
    pg_db: Database, registry: ChainRegistry, account: AccountRef
) -> None:
    chain = InMemoryChain(chain_of(registry))
    parts = new_parts(pg_db, registry)
    deposit_id = seen_deposit(pg_db, parts, chain, account)

    def emit_credited(delay_before: float, delay_after: float) -> bool:
        with pg_db.transaction() as session:
            deposit = session.get(Deposit, deposit_id)
            assert deposit is not None
            time.sleep(delay_before)
            written = transitions.emit(session, deposit, states.CREDITED, parts.clock())
            time.sleep(delay_after)  # the second writer blocks on the unique key meanwhile
            return written

    # When two transactions both write deposit.credited (the second while the first is open)
    results = race(lambda: emit_credited(0.0, 0.3), lambda: emit_credited(0.1, 0.0))
    # Then both commit, and only one event exists
    assert sorted(results) == [False, True]
    with pg_db.reader() as session:
        count = session.scalar(
            sa.select(sa.func.count()).where(
                OutboxEvent.event_id == f"evt_dep_{deposit_id}_credited"
            )
        )
    assert count == 1


def test_two_workers_through_the_whole_pipeline(
    pg_db: Database, tenant: TenantKeys, core_context: Any
) -> None:
    # Given twenty sandbox deposits
    registry = core_context.registry
    account = make_account(pg_db, tenant.tenant_id, registry, dest_chain_id=8453)
    settings = PipelineSettings(sandbox_block_s=0, poll_s=0.0, batch_size=1000)
    creator = deposit_parts(pg_db, registry, settings=settings).sandbox
    ids = [
        creator.create(
            tenant.tenant_id,
            chain_id=8453,
            deposit_address=account.address(8453),
            asset="USDC",
            amount=Decimal(10 + n),
        ).id
        for n in range(20)
    ]

    def worker() -> None:
        parts = deposit_parts(pg_db, registry, settings=settings)
        pipeline = Pipeline(
            settling=parts.settling,
            sandbox=SandboxConfirmer(parts.detection, SandboxChain(0), batch_size=1000),
            settings=settings,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pipeline.settle_round()
            with pg_db.reader() as session:
                open_ = session.scalar(
                    sa.select(sa.func.count()).where(
                        Deposit.id.in_(ids), Deposit.status != states.CREDITED
                    )
                )
            if open_ == 0:
                return

    # When two workers (as two processes would) run the pipeline at once
    race(worker, worker)
    # Then every deposit is credited with each durable event exactly once
    for deposit_id in ids:
        assert deposit_event_types(pg_db, deposit_id) == [
            "deposit.source_seen",
            "deposit.source_confirmed",
            "deposit.credited",
        ]


def test_two_watchers_on_one_chain_never_double_count(
    pg_db: Database, registry: ChainRegistry, account: AccountRef
) -> None:
    chain = InMemoryChain(chain_of(registry))
    registry_chain = registry.get(chain.chain_id)
    assert registry_chain is not None
    watchers = [
        ChainWatcher(new_parts(pg_db, registry).detection, registry_chain, chain, lag_blocks=0)
        for _ in range(2)
    ]

    def mine_and_watch(w: ChainWatcher) -> None:
        for n in range(10):
            if w is watchers[0]:
                chain.transfer(TEST_USDC, SENDER, account.address(chain.chain_id), (n + 1) * 10**6)
                chain.mine()
            w.tick()

    race(*(lambda w=w: mine_and_watch(w) for w in watchers))
    for w in watchers:
        w.tick()
    deposits = deposits_of(pg_db, account)
    assert sorted(int(d.amount_raw) for d in deposits) == [(n + 1) * 10**6 for n in range(10)]
    for deposit in deposits:
        assert deposit_event_types(pg_db, deposit.id).count("deposit.source_seen") == 1
