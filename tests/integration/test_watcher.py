"""The chain watcher on InMemoryChain, each test on a fresh migrated PostgreSQL database.

(The same watcher against a hostile node, on the EVM through the fault proxy:
test_chain_reading.py.)

Depth 3 on the test chain: a transfer is seen in its block (1 confirmation) and
confirmed when two more blocks are on top of it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from services.core.deposits import states
from services.core.deposits.addressbook import AddressBook
from services.core.deposits.models import ChainCheckpoint, StrayTransfer
from services.core.deposits.settlement import Settlement, SimulatedPayer
from services.core.deposits.watcher import ChainWatcher
from services.core.evm import InMemoryChain
from services.core.models import DepositAccount, DepositAddress
from shared import components, migrate
from shared.db import Database
from tests.support.deposits import (
    ODD_TOKEN,
    SENDER,
    TEST_CHAIN_ID,
    TEST_USDC,
    AccountRef,
    DepositParts,
    deposit_event_types,
    deposit_parts,
    deposits_of,
    events_of,
    make_account,
    set_fee,
    small_registry,
)
from tests.support.services import clone_database, create_database, drop_database

TENANT = "00000000-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def template_db() -> Iterator[str]:
    """A migrated database each test copies (the watcher's cursors are per chain, not tenant)."""
    name = f"settle_test_watcher_{os.getpid()}"
    url = create_database(name)
    for component in (components.IDENTITY, components.CORE):
        migrate.upgrade(component, url)
    yield name
    drop_database(name)


@pytest.fixture
def db(template_db: str) -> Iterator[Database]:
    name = f"{template_db}_{uuid.uuid4().hex[:8]}"
    database = Database(clone_database(template_db, name), pool_size=2)
    yield database
    database.dispose()
    drop_database(name)


@pytest.fixture
def chain() -> InMemoryChain:
    chain = InMemoryChain(TEST_CHAIN_ID)
    chain.mine(5)
    return chain


@pytest.fixture
def parts(db: Database) -> DepositParts:
    registry = small_registry(depth=3, min_deposit_usd=1.0)
    settlement = Settlement(registry, payers={TEST_CHAIN_ID: SimulatedPayer()})
    return deposit_parts(db, registry, settlement=settlement)


@pytest.fixture
def account(db: Database, parts: DepositParts) -> AccountRef:
    return make_account(db, TENANT, parts.registry)


def watcher(parts: DepositParts, chain: InMemoryChain, lag: int = 0) -> ChainWatcher:
    registry_chain = parts.registry.get(TEST_CHAIN_ID)
    assert registry_chain is not None
    return ChainWatcher(
        parts.detection, registry_chain, chain, lag_blocks=lag, max_range=50, start_block=1
    )


def test_transfer_is_seen_then_confirmed_exactly_at_depth_then_credited(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    # Given a watcher caught up with the chain
    w = watcher(parts, chain)
    w.tick()
    # When 125.50 USDC arrives at the account's deposit address
    chain.transfer(TEST_USDC, SENDER, account.address(), 125_500_000)
    chain.mine()
    w.tick()
    # Then it is seen with one confirmation
    (deposit,) = deposits_of(db, account)
    assert deposit.status == states.SOURCE_SEEN
    assert deposit.confirmations == 1 and deposit.required_confirmations == 3
    assert deposit.block_hash == chain.block(deposit.block_number or 0).hash  # type: ignore[union-attr]
    # And with two confirmations it is still only seen
    chain.mine()
    w.tick()
    (deposit,) = deposits_of(db, account)
    assert (deposit.status, deposit.confirmations) == (states.SOURCE_SEEN, 2)
    # When the third block lands, it is confirmed at exactly the depth
    chain.mine()
    w.tick()
    (deposit,) = deposits_of(db, account)
    assert (deposit.status, deposit.confirmations) == (states.SOURCE_CONFIRMED, 3)
    # And settling skims the chain's live fee
    set_fee(db, TEST_CHAIN_ID, "0.25")
    assert parts.settling.settle(deposit.id) == states.CREDITED
    (deposit,) = deposits_of(db, account)
    assert str(deposit.amount_usd) == "125.500000"
    assert str(deposit.fee_usd) == "0.250000" and str(deposit.net_usd) == "125.250000"
    assert deposit.credit_tx_hash and deposit.route == "direct"
    assert deposit_event_types(db, deposit.id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.credited",
    ]


def test_a_logs_bloom_false_positive_is_checked_by_hash_and_does_not_stall_the_watcher(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    # Given blocks whose logsBloom holds the Transfer topic and USDC's address with no
    # USDC Transfer among their logs (another token's Transfer and a USDC Approval, say),
    # in the middle of the ranges read
    w = watcher(parts, chain)
    w.tick()
    for _ in range(3):
        chain.transfer(ODD_TOKEN, SENDER, account.address(), 7)
        (block,) = chain.mine()
        chain.mark_bloom(block.number, bytes.fromhex(TEST_USDC[2:]))
    chain.transfer(TEST_USDC, SENDER, account.address(), 20_000_000)
    chain.mine(4)
    # When the watcher reads them
    result = w.tick()
    # Then the node asked by hash shows the blocks hold no USDC Transfer: nothing refused,
    # both readings move on, the USDC deposit counts
    assert result.refused == 0
    assert w.next_block() == chain.head() + 1
    (deposit,) = deposits_of(db, account)
    assert deposit.status == states.SOURCE_CONFIRMED


def test_reorg_before_confirmation_fails_the_deposit_and_never_credits_it(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    w = watcher(parts, chain)
    w.tick()
    # Given a seen deposit
    chain.transfer(TEST_USDC, SENDER, account.address(), 50_000_000)
    chain.mine()
    w.tick()
    (deposit,) = deposits_of(db, account)
    assert deposit.status == states.SOURCE_SEEN
    # When its block is replaced by one without it
    chain.reorg(1)
    chain.mine(3)
    result = w.tick()
    # Then the watcher rescanned from the fork and the deposit failed as reorged
    assert result.reorg_from == deposit.block_number
    (deposit,) = deposits_of(db, account)
    assert (deposit.status, deposit.failure_reason) == (states.FAILED, "reorged")
    # And nothing ever credits it
    for _ in range(3):
        chain.mine()
        w.tick()
        parts.settling.settle(deposit.id)
    assert deposit_event_types(db, deposit.id) == ["deposit.source_seen", "deposit.failed"]


def test_transfer_reincluded_by_a_reorg_moves_to_its_new_block(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    w = watcher(parts, chain)
    w.tick()
    chain.transfer(TEST_USDC, SENDER, account.address(), 20_000_000)
    (old_block,) = chain.mine()
    w.tick()
    # When a reorg drops the block but the transfer is mined again one block higher
    chain.reorg(1, reinclude=True)
    (new_block,) = chain.mine()
    w.tick()
    # Then the same deposit follows the transfer to its new block
    (deposit,) = deposits_of(db, account)
    assert deposit.status == states.SOURCE_SEEN
    assert (deposit.block_number, deposit.block_hash) == (new_block.number, new_block.hash)
    assert deposit.block_hash != old_block.hash
    # And confirms at depth counted from the new block
    chain.mine(2)
    w.tick()
    (deposit,) = deposits_of(db, account)
    assert (deposit.status, deposit.confirmations) == (states.SOURCE_CONFIRMED, 3)
    assert deposit_event_types(db, deposit.id) == [
        "deposit.source_seen",
        "deposit.source_confirmed",
    ]


def test_transfer_mined_again_after_it_vanished_for_the_depth_is_a_new_deposit(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    w = watcher(parts, chain)
    w.tick()
    tx = chain.transfer(TEST_USDC, SENDER, account.address(), 20_000_000)
    chain.mine()
    w.tick()
    # Given its block vanished and the transfer stayed away for the depth: failed
    chain.reorg(1)
    chain.mine(2)
    w.tick()
    (first,) = deposits_of(db, account)
    assert first.failure_reason == "reorged" and first.source_vanished_at is not None
    # When the transfer is mined later after all
    chain.replay(tx)
    chain.mine()
    w.tick()
    # Then it is a new deposit (the failed one stays failed)
    first_again, second = deposits_of(db, account)
    assert first_again.failure_reason == "reorged"
    assert second.source_tx_hash == tx and second.status == states.SOURCE_SEEN


def test_unknown_tokens_and_zero_value_are_kept_for_ops_never_deposits(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    registry_chain = parts.registry.get(TEST_CHAIN_ID)
    assert registry_chain is not None
    w = ChainWatcher(
        parts.detection,
        registry_chain,
        chain,
        lag_blocks=0,
        max_range=50,
        start_block=1,
        stray_cap=3,
    )
    w.tick()
    # When a token the chain does not support arrives five times, with a zero-value
    # transfer of the supported one
    for i in range(5):
        chain.transfer(ODD_TOKEN, SENDER, account.address(), 7 * 10**18 + i)
    chain.transfer(TEST_USDC, SENDER, account.address(), 0)
    chain.mine(3)
    w.tick()
    # Then no deposit, no event, and at most the cap of them kept for ops
    assert deposits_of(db, account) == []
    assert events_of(db, TENANT) == []
    with db.reader() as session:
        strays = list(session.scalars(sa.select(StrayTransfer).order_by(StrayTransfer.id)))
    assert len(strays) == 3
    assert {s.token_address for s in strays} == {ODD_TOKEN}
    assert strays[0].to_address == account.address() and strays[0].amount_raw == str(7 * 10**18)
    # And reading the range again keeps nothing twice
    chain.reorg(1)
    chain.mine()
    w.tick()
    with db.reader() as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(StrayTransfer)) == 3


def test_confirms_under_the_finalized_block_when_the_node_offers_it(
    db: Database, account: AccountRef
) -> None:
    # Given a chain confirmed at the `finalized` tag, on a node that finalizes 6 deep
    registry = small_registry(depth=3, min_deposit_usd=1.0, finality_tag="finalized")
    parts = deposit_parts(db, registry)
    chain = InMemoryChain(TEST_CHAIN_ID, finalized_depth=6)
    chain.mine(5)
    registry_chain = registry.get(TEST_CHAIN_ID)
    assert registry_chain is not None
    w = ChainWatcher(parts.detection, registry_chain, chain, lag_blocks=0, start_block=1)
    w.tick()
    chain.transfer(TEST_USDC, SENDER, account.address(), 5_000_000)
    chain.mine()
    # When it is 3 deep (the depth), then 6 deep
    chain.mine(2)
    w.tick()
    (deposit,) = deposits_of(db, account)
    assert (deposit.status, deposit.confirmations) == (states.SOURCE_SEEN, 3)
    chain.mine(3)
    w.tick()
    assert deposits_of(db, account)[0].status == states.SOURCE_SEEN
    chain.mine()
    w.tick()
    # Then only the finalized block confirms it
    (deposit,) = deposits_of(db, account)
    assert (deposit.status, deposit.confirmations) == (states.SOURCE_CONFIRMED, 7)


def test_without_the_tag_the_reorg_depth_stands_in(db: Database, account: AccountRef) -> None:
    registry = small_registry(depth=3, min_deposit_usd=1.0, finality_tag="finalized", reorg_depth=5)
    parts = deposit_parts(db, registry)
    chain = InMemoryChain(TEST_CHAIN_ID)  # offers no finalized tag
    chain.mine(5)
    registry_chain = registry.get(TEST_CHAIN_ID)
    assert registry_chain is not None
    w = ChainWatcher(parts.detection, registry_chain, chain, lag_blocks=0, start_block=1)
    chain.transfer(TEST_USDC, SENDER, account.address(), 5_000_000)
    chain.mine(4)
    w.tick()
    assert deposits_of(db, account)[0].status == states.SOURCE_SEEN
    chain.mine()
    w.tick()
    assert deposits_of(db, account)[0].status == states.SOURCE_CONFIRMED


def test_addresses_are_loaded_once_then_only_the_new_ones(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    for _ in range(20):
        make_account(db, TENANT, parts.registry)
    registry_chain = parts.registry.get(TEST_CHAIN_ID)
    assert registry_chain is not None
    # (re-reading 2 keys under the newest, for transactions that commit late)
    book = AddressBook(db, TEST_CHAIN_ID, overlap_keys=2)
    w = ChainWatcher(
        parts.detection, registry_chain, chain, lag_blocks=0, start_block=1, addresses=book
    )
    w.tick()
    assert len(book) == 21 and book.rows_read == 21
    # When one account is created, the next round reads only the newest rows
    late = make_account(db, TENANT, parts.registry)
    chain.transfer(TEST_USDC, SENDER, late.address(), 3_000_000)
    chain.mine()
    w.tick()
    assert len(book) == 22 and book.rows_read <= 3
    (deposit,) = deposits_of(db, late)
    assert deposit.status == states.SOURCE_SEEN


class CutAddressReads:
    """`Database.driver_autocommit` for an address set: while armed, its next read of
    address rows fails after two rows, as a failover cuts a read (PostgreSQL is real and
    runs the statement; only the rest of that one answer is lost)."""

    def __init__(self, db: Database) -> None:
        self.real = db.driver_autocommit
        self.armed = False

    @contextmanager
    def __call__(self, **kwargs: bool) -> Iterator[Any]:
        with self.real(**kwargs) as conn:
            yield _CuttingConnection(conn, self)


class _CuttingConnection:
    def __init__(self, conn: Any, cut: CutAddressReads) -> None:
        self._conn, self._cut = conn, cut

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    @contextmanager
    def cursor(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        with self._conn.cursor(*args, **kwargs) as cur:
            yield _CuttingCursor(cur, self._cut)


class _CuttingCursor:
    def __init__(self, cur: Any, cut: CutAddressReads) -> None:
        self._cur, self._cut = cur, cut
        self._rows_before_cut: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        if self._cut.armed and "account_pk >" in str(query):
            self._cut.armed = False
            self._rows_before_cut = 2
        return self._cur.execute(query, *args, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        for n, row in enumerate(self._cur):
            if n == self._rows_before_cut:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            yield row


def test_a_reload_cut_midway_keeps_the_addresses_it_had_and_counts_again(
    db: Database, parts: DepositParts, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an address set of four accounts' addresses, counted once a minute, re-reading
    # one key under the newest each round
    clock = StampClock(0.0)
    book = AddressBook(db, TEST_CHAIN_ID, overlap_keys=1, recount_s=60, monotonic=clock)
    oldest = make_account(db, TENANT, parts.registry)
    for _ in range(4):
        make_account(db, TENANT, parts.registry)
    with db.transaction() as session:
        row = session.scalar(
            sa.select(DepositAddress).where(
                DepositAddress.account_pk == oldest.pk, DepositAddress.chain_id == TEST_CHAIN_ID
            )
        )
        assert row is not None
        kept = {c.key: getattr(row, c.key) for c in sa.inspect(DepositAddress).column_attrs}
        session.delete(row)
    book.refresh()
    assert len(book) == 4
    # When the oldest account's address is added back (a backfill, under the re-read
    # keys), a minute later the count differs, and the reload is cut
    with db.transaction() as session:
        session.add(DepositAddress(**kept))
    cut = CutAddressReads(db)
    monkeypatch.setattr(db, "driver_autocommit", cut)
    clock.at = 61.0
    cut.armed = True
    with pytest.raises(psycopg.OperationalError):
        book.refresh()
    # Then the set keeps the four addresses it had, not a part of a reload
    assert len(book) == 4
    # And the next round counts again and reloads, rather than waiting a minute
    clock.at = 62.0
    book.refresh()
    assert len(book) == 5


def test_restart_resumes_from_the_cursor_without_missing_or_double_counting(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    # Given a watcher that saw two transfers, then stopped between blocks
    first = watcher(parts, chain)
    for amount in (1, 2):
        chain.transfer(TEST_USDC, SENDER, account.address(), amount * 10**6)
        chain.mine()
        first.tick()
    stopped_at = first.next_block()
    # While it is down, three more transfers land (two in one block)
    chain.transfer(TEST_USDC, SENDER, account.address(), 3 * 10**6)
    chain.mine()
    chain.transfer(TEST_USDC, SENDER, account.address(), 4 * 10**6)
    chain.transfer(TEST_USDC, SENDER, account.address(), 5 * 10**6)
    chain.mine()
    # When a new watcher process starts (no start block: it must use the cursor)
    registry_chain = parts.registry.get(TEST_CHAIN_ID)
    assert registry_chain is not None
    restarted = ChainWatcher(parts.detection, registry_chain, chain, lag_blocks=0)
    assert restarted.next_block() == stopped_at
    restarted.tick()
    restarted.tick()
    first.tick()  # and the old one running again alongside changes nothing
    # Then every transfer is one deposit, each seen once
    deposits = deposits_of(db, account)
    assert sorted(int(d.amount_raw) for d in deposits) == [n * 10**6 for n in (1, 2, 3, 4, 5)]
    for deposit in deposits:
        assert deposit_event_types(db, deposit.id)[:1] == ["deposit.source_seen"]
        assert deposit_event_types(db, deposit.id).count("deposit.source_seen") == 1


def test_watcher_stays_behind_the_head_and_survives_a_node_outage(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    w = watcher(parts, chain, lag=1)
    w.tick()
    chain.transfer(TEST_USDC, SENDER, account.address(), 10**6)
    chain.mine()
    # When the node fails, the round fails and nothing is lost
    chain.fail_next(ConnectionError("node down"))
    with pytest.raises(ConnectionError):
        w.tick()
    # The transfer is in the head block: one block of safe distance hides it
    w.tick()
    assert deposits_of(db, account) == []
    chain.mine()
    w.tick()
    (deposit,) = deposits_of(db, account)
    assert deposit.confirmations == 2


def test_dust_below_the_floor_fails_below_minimum(
    db: Database, parts: DepositParts, chain: InMemoryChain, account: AccountRef
) -> None:
    w = watcher(parts, chain)
    w.tick()
    chain.transfer(TEST_USDC, SENDER, account.address(), 990_000)  # 0.99 < 1.00 floor
    chain.mine(3)
    w.tick()
    (deposit,) = deposits_of(db, account)
    assert deposit.status == states.SOURCE_CONFIRMED
    assert parts.settling.settle(deposit.id) == states.FAILED
    (deposit,) = deposits_of(db, account)
    assert deposit.failure_reason == "below_minimum" and deposit.credit_tx_hash is None


# --- a chain's first watching -----------------------------------------------------------


def first_watcher(parts: DepositParts, chain: InMemoryChain) -> ChainWatcher:
    """A watcher as the worker builds it: no start block, no cursor yet."""
    registry_chain = parts.registry.get(TEST_CHAIN_ID)
    assert registry_chain is not None
    return ChainWatcher(parts.detection, registry_chain, chain, lag_blocks=0, max_range=50)


def floor_checkpoint(db: Database) -> int:
    """The block under the first one a chain's watching read."""
    with db.reader() as session:
        floor: int = session.scalar(
            sa.select(sa.func.min(ChainCheckpoint.number)).where(
                ChainCheckpoint.chain_id == TEST_CHAIN_ID
            )
        )
    return floor


def given_out(db: Database, account: AccountRef) -> datetime | None:
    with db.reader() as session:
        stamp: datetime | None = session.scalar(
            sa.select(DepositAddress.created_at)
            .join(DepositAccount, DepositAccount.pk == DepositAddress.account_pk)
            .where(DepositAccount.id == account.id, DepositAddress.chain_id == TEST_CHAIN_ID)
        )
    return stamp


def set_given_out(db: Database, account: AccountRef, **ago: float) -> None:
    """Say the account's address on the test chain was given out `ago` (timedelta's
    keywords) before now; nothing given: unknown (NULL, a row from before core_0016)."""
    with db.transaction() as session:
        pk = session.scalar(sa.select(DepositAccount.pk).where(DepositAccount.id == account.id))
        session.execute(
            sa.update(DepositAddress)
            .where(DepositAddress.account_pk == pk, DepositAddress.chain_id == TEST_CHAIN_ID)
            .values(created_at=sa.func.now() - timedelta(**ago) if ago else None)
        )


def set_account_made(db: Database, account: AccountRef, **ago: float) -> None:
    with db.transaction() as session:
        session.execute(
            sa.update(DepositAccount)
            .where(DepositAccount.id == account.id)
            .values(created_at=sa.func.now() - timedelta(**ago))
        )


class StampClock:
    """What InMemoryChain stamps the blocks it mines with; settable."""

    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def aged_chain(seconds_ago: float, blocks: int) -> tuple[InMemoryChain, StampClock]:
    """A chain whose first `blocks` blocks (genesis included) were stamped `seconds_ago`;
    set the clock's `at` to stamp the next ones otherwise."""
    stamps = StampClock(time.time() - seconds_ago)
    chain = InMemoryChain(TEST_CHAIN_ID, clock=stamps)
    if blocks > 1:
        chain.mine(blocks - 1)
    return chain, stamps


def test_a_chains_first_watching_finds_a_deposit_sent_before_any_worker_looked(
    db: Database, parts: DepositParts
) -> None:
    # Given a chain whose first 30 blocks are an hour old
    chain, stamps = aged_chain(3600, blocks=30)
    # And an account given its address now, sent 125.50 USDC in block 30, and ten blocks
    # on top, all before any worker watched the chain (a first deployment)
    stamps.at = time.time()
    account = make_account(db, TENANT, parts.registry)
    assert given_out(db, account) is not None  # the database stamped it
    chain.transfer(TEST_USDC, SENDER, account.address(), 125_500_000)
    chain.mine()
    chain.mine(10)
    # When the chain's watcher takes its first look
    w = first_watcher(parts, chain)
    w.tick()
    # Then the deposit is found and, ten blocks deep, confirmed
    (deposit,) = deposits_of(db, account)
    assert deposit.block_number == 30 and deposit.status == states.SOURCE_CONFIRMED
    # And the reading began at the first block stamped after the address was given out
    # (less the margin for clocks), not at the chain's genesis
    assert floor_checkpoint(db) == 29


def test_an_address_from_before_its_time_was_kept_counts_from_its_accounts_creation(
    db: Database, parts: DepositParts
) -> None:
    # Given an account made half an hour ago whose address has no time of its own (a
    # row from before core_0016), on a chain with blocks an hour and half an hour old
    chain, stamps = aged_chain(3600, blocks=20)
    account = make_account(db, TENANT, parts.registry)
    set_given_out(db, account)
    set_account_made(db, account, minutes=30)
    stamps.at = time.time() - 1700
    chain.transfer(TEST_USDC, SENDER, account.address(), 125_500_000)
    chain.mine()
    stamps.at = time.time()
    chain.mine(10)
    # When the chain's watcher takes its first look
    first_watcher(parts, chain).tick()
    # Then the deposit of half an hour ago is found, and nothing older was read
    (deposit,) = deposits_of(db, account)
    assert deposit.block_number == 20 and deposit.status == states.SOURCE_CONFIRMED
    assert floor_checkpoint(db) == 19


def test_a_chain_without_addresses_is_first_read_one_confirmation_depth_back(
    db: Database, parts: DepositParts
) -> None:
    # Given a chain of 40 blocks and no deposit address on it
    chain = InMemoryChain(TEST_CHAIN_ID)
    chain.mine(40)
    # When its watcher takes its first look
    first_watcher(parts, chain).tick()
    # Then it read from three blocks under the head (depth 3), not the chain's history
    assert floor_checkpoint(db) == 40 - 3


def test_the_earliest_address_on_the_chain_decides_and_only_this_chains(
    db: Database, parts: DepositParts
) -> None:
    # Given blocks two hours, an hour and half an hour old, then new ones
    chain, stamps = aged_chain(7200, blocks=10)
    stamps.at = time.time() - 3600
    chain.mine(10)  # blocks 10-19
    # And an address given out 61 minutes ago, sent 10 USDC 50 minutes ago (block 20)
    old = make_account(db, TENANT, parts.registry)
    set_given_out(db, old, minutes=61)
    stamps.at = time.time() - 3000
    chain.transfer(TEST_USDC, SENDER, old.address(), 10_000_000)
    chain.mine()
    # And one given out now, and another chain's address given out two hours ago
    new = make_account(db, TENANT, parts.registry)
    with db.transaction() as session:
        pk = session.scalar(sa.select(DepositAccount.pk).where(DepositAccount.id == new.id))
        session.add(
            DepositAddress(
                account_pk=pk,
                chain_id=TEST_CHAIN_ID + 1,
                address=new.address(),
                created_at=datetime.now(UTC) - timedelta(hours=2),
            )
        )
    stamps.at = time.time()
    chain.mine(10)
    # When the chain's watcher takes its first look
    first_watcher(parts, chain).tick()
    # Then the older address's deposit is found, read from the hour-old blocks on: the
    # other chain's address pulled nothing back
    (deposit,) = deposits_of(db, old)
    assert deposit.block_number == 20 and deposit.status == states.SOURCE_CONFIRMED
    assert floor_checkpoint(db) == 9


def test_an_address_given_out_after_its_account_counts_from_its_own_time(
    db: Database, parts: DepositParts
) -> None:
    # Given an account made a day ago whose address on this chain was given out now (a
    # chain activated later: the backfill), on a chain whose first 30 blocks are old
    chain, stamps = aged_chain(86_400, blocks=30)
    account = make_account(db, TENANT, parts.registry)
    set_account_made(db, account, days=1)
    stamps.at = time.time()
    chain.mine(40)
    # When the chain's watcher takes its first look
    first_watcher(parts, chain).tick()
    # Then it reads from the address's time, not the account's day of blocks
    assert floor_checkpoint(db) == 29


def test_a_long_look_back_does_not_hold_up_a_deposit_arriving_now(
    db: Database, parts: DepositParts
) -> None:
    # Given an address given out an hour ago, sent 10 USDC 1,500 blocks later, and 1,500
    # blocks since
    chain, stamps = aged_chain(3600, blocks=1501)
    account = make_account(db, TENANT, parts.registry)
    set_given_out(db, account, minutes=60)
    chain.transfer(TEST_USDC, SENDER, account.address(), 10_000_000)
    chain.mine()
    stamps.at = time.time()
    chain.mine(1500)
    # And 20 USDC arriving now
    chain.transfer(TEST_USDC, SENDER, account.address(), 20_000_000)
    chain.mine()
    # When the chain's watcher takes its first look (50 blocks a range, 20 ranges a round)
    w = first_watcher(parts, chain)
    w.tick()
    # Then the deposit arriving now is seen at once, while the look back goes on
    (now,) = deposits_of(db, account)
    assert now.amount_raw == "20000000" and now.status == states.SOURCE_SEEN
    assert w.confirmed_block() <= 1000
    # And the look back finds the hour-old deposit once it has read that far
    for _ in range(5):
        w.tick()
    old, now = sorted(deposits_of(db, account), key=lambda d: d.block_number or 0)
    assert old.amount_raw == "10000000" and old.status == states.SOURCE_CONFIRMED
