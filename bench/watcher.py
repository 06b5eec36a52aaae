"""Chain watcher cost per block: a million deposit addresses, 500 matching transfers a block.

    .venv/bin/python bench/watcher.py [--quick] [--addresses N] [--per-block N] [--blocks N]

The node is an InMemoryChain served as JSON-RPC over HTTP on 127.0.0.1
(tests/support/memory_node.py, in a thread of this process). What is measured is the
watcher thread's own CPU (`time.thread_time`): the HTTP client, decoding the wire JSON,
matching recipients in memory, the checks on every range, and its PostgreSQL client
work. The node's CPU is not in it (another thread); PostgreSQL's server processes for
the bench database are measured apart (from /proc) and printed beside, with the sum:
"on one core" means the watcher and its database work together. Wall time is printed
too (it depends on the machine's other load; the CPU figures much less).

1. Addresses: N accounts with one deposit address each on the bench chain, written by
   one INSERT ... SELECT (setup); then the watcher's first load of them (time, memory).
2. Busy blocks: B blocks, each with P transfers to random deposit addresses and 100
   transfers of the same token between strangers. The watcher follows block by block
   (one block mined, one round), recording each transfer at the tip and confirming it
   when read again at depth (3 blocks): CPU per block, and matching logs recorded and
   confirmed per CPU second (goal: >= 2,000 on one core).
3. Quiet blocks: 300 transfers of the token a block, none to a deposit address: CPU per
   block (goal: < 50 ms).
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from bench.harness import PG_ADMIN_URL, drop_database, fresh_database, machine
from services.core.chains import ChainRegistry, parse_chains
from services.core.deposits import states
from services.core.deposits.addressbook import AddressBook
from services.core.deposits.detection import Detection
from services.core.deposits.models import Deposit
from services.core.deposits.pricing import StaticPrices
from services.core.deposits.watcher import ChainWatcher
from services.core.evm import InMemoryChain, Web3ChainReader
from shared.db import Database
from shared.identity import service as identity
from tests.support.memory_node import MemoryNode

CHAIN_ID = 31339
TOKEN = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
WALLET = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
DEPTH = 3
#: Transfers of the token between strangers in every block (not deposits).
NOISE_PER_BUSY_BLOCK = 100
NOISE_PER_QUIET_BLOCK = 300


def bench_registry() -> ChainRegistry:
    return parse_chains(
        f'[default_settlement_venue]\nchain_id = {CHAIN_ID}\nasset = "USDC"\n'
        f'[[chains]]\nchain_id = {CHAIN_ID}\nname = "Bench"\nstatus = "active"\n'
        'native_symbol = "ETH"\nnative_usd = 3000.0\ngas_price_gwei = 1.0\n'
        f"settlement_gas_units = 65000\nconfirmations = {DEPTH}\nmin_deposit_usd = 1.0\n"
        f'[[chains.assets]]\nsymbol = "USDC"\ntoken_address = "{TOKEN}"\ndecimals = 6\n'
    )


def address_of(pk: int) -> str:
    """The bench's deposit address of account `pk`: decimal digits only, so it is its own
    EIP-55 form (checksumming changes only letters)."""
    return "0x" + str(pk).zfill(40)


def add_accounts(db: Database, count: int) -> list[int]:
    """`count` accounts of a new tenant, one address each on the bench chain; their pks."""
    with db.transaction() as session:
        tenant, _ = identity.create_tenant(session, f"bench-watcher-{uuid.uuid4().hex[:8]}")
        tenant_id = tenant.id
    with db.autocommit() as conn:
        low = conn.scalar(sa.text("SELECT coalesce(max(pk), 0) FROM deposit_accounts"))
        conn.execute(
            sa.text(
                """
                INSERT INTO deposit_accounts (id, tenant_id, external_user_id, status,
                    dest_chain_id, dest_address, dest_token_address, metadata,
                    created_at, updated_at)
                SELECT 'acc_bench' || i, :tenant, 'user-' || i, 'active', :chain, :wallet,
                       :token, '{}', now(), now()
                FROM generate_series(1, :count) AS i
                """
            ),
            {
                "tenant": tenant_id,
                "chain": CHAIN_ID,
                "wallet": WALLET,
                "token": TOKEN,
                "count": count,
            },
        )
        conn.execute(
            sa.text(
                """
                INSERT INTO deposit_addresses (account_pk, chain_id, address, position)
                SELECT pk, :chain, '0x' || lpad(pk::text, 40, '0'), 0
                FROM deposit_accounts WHERE tenant_id = :tenant
                """
            ),
            {"tenant": tenant_id, "chain": CHAIN_ID},
        )
        conn.execute(sa.text("ANALYZE deposit_accounts; ANALYZE deposit_addresses"))
        return list(
            conn.scalars(
                sa.text("SELECT pk FROM deposit_accounts WHERE tenant_id = :t AND pk > :low"),
                {"t": tenant_id, "low": low},
            )
        )


def stranger(rng: random.Random) -> str:
    return "0x" + "ab" + rng.randbytes(19).hex()


def backend_cpu(database: str) -> dict[int, float]:
    """CPU seconds used so far by each PostgreSQL server process of `database`."""
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        pids = [
            int(row[0])
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,)
            ).fetchall()
        ]
    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[pid] = (int(fields[11]) + int(fields[12])) / ticks
    return used


def follow(
    watcher: ChainWatcher,
    chain: InMemoryChain,
    blocks: list[list[tuple[str, int]]],
    database: str,
) -> tuple[list[float], float]:
    """Mine each block (transfers: (to, amount)) and run one round: the watcher's CPU
    seconds per round, and PostgreSQL's for the bench database over all of them."""
    rng = random.Random(7)
    cpu = []
    pg_before = backend_cpu(database)
    for transfers in blocks:
        for to, amount in transfers:
            chain.transfer(TOKEN, stranger(rng), to, amount)
        chain.mine()
        started = time.thread_time()
        watcher.tick()
        cpu.append(time.thread_time() - started)
    pg_after = backend_cpu(database)
    pg = sum(used - pg_before.get(pid, 0.0) for pid, used in pg_after.items())
    return cpu, pg


def count(db: Database, status: str) -> int:
    with db.reader() as session:
        return int(
            session.scalar(
                sa.select(sa.func.count()).where(
                    Deposit.chain_id == CHAIN_ID, Deposit.status == status
                )
            )
            or 0
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small runs (a smoke test)")
    parser.add_argument("--addresses", type=int, help="deposit addresses (1,000,000; quick 20,000)")
    parser.add_argument("--per-block", type=int, default=500, help="matching transfers a block")
    parser.add_argument("--blocks", type=int, help="busy blocks (20; quick 4)")
    args = parser.parse_args()
    addresses = args.addresses or (20_000 if args.quick else 1_000_000)
    busy = args.blocks or (4 if args.quick else 20)
    quiet = 10 if args.quick else 50
    per_block = args.per_block

    # A database of this run's own, dropped at exit: two runs at once (a shared machine)
    # must not drop each other's mid-run, as a fixed name did.
    name = f"settle_bench_watcher_{os.getpid()}"
    url = fresh_database(name)
    atexit.register(drop_database, name)
    db = Database(url, pool_size=4)
    started = time.perf_counter()
    pks = add_accounts(db, addresses)
    setup_s = time.perf_counter() - started

    registry = bench_registry()
    chain = registry.get(CHAIN_ID)
    assert chain is not None
    node_chain = InMemoryChain(CHAIN_ID)
    node_chain.mine(5)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    book = AddressBook(db, CHAIN_ID)
    started = time.perf_counter()
    book.refresh()
    load_s = time.perf_counter() - started
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert len(book) == addresses, (len(book), addresses)

    rng = random.Random(1)
    with MemoryNode(node_chain) as node:
        reader = Web3ChainReader.from_url(node.url, 30.0, CHAIN_ID)
        watcher = ChainWatcher(
            Detection(db, registry, StaticPrices()),
            chain,
            reader,
            lag_blocks=0,
            start_block=node_chain.head() + 1,
            addresses=book,
        )
        watcher.tick()
        busy_blocks = [
            [(address_of(rng.choice(pks)), 1_000_000 + i) for i in range(per_block)]
            + [(stranger(rng), 5) for _ in range(NOISE_PER_BUSY_BLOCK)]
            for _ in range(busy)
        ]
        wall = time.perf_counter()
        # The busy blocks, then DEPTH - 1 quiet ones so the last busy block reaches depth.
        settle: list[list[tuple[str, int]]] = [[] for _ in range(DEPTH - 1)]
        database = url.rsplit("/", 1)[1]
        busy_cpu, busy_pg = follow(watcher, node_chain, busy_blocks + settle, database)
        busy_wall = time.perf_counter() - wall
        recorded = count(db, states.SOURCE_CONFIRMED)
        matching = busy * per_block
        if recorded != matching:
            raise RuntimeError(f"{matching} transfers, {recorded} confirmed deposits")
        quiet_blocks = [
            [(stranger(rng), 5) for _ in range(NOISE_PER_QUIET_BLOCK)] for _ in range(quiet)
        ]
        quiet_cpu, quiet_pg = follow(watcher, node_chain, quiet_blocks, database)
    db.dispose()

    total = sum(busy_cpu)
    p50 = 1000 * statistics.median(busy_cpu)
    print(f"machine: {machine()}")
    print(
        f"addresses: {addresses:,} deposit addresses (setup {setup_s:.1f} s); watcher's first "
        f"load {load_s:.2f} s, +{(rss_after - rss_before) / 1024:.0f} MiB resident"
    )
    print(
        f"busy blocks: {busy} x ({per_block} deposits + {NOISE_PER_BUSY_BLOCK} other transfers), "
        f"recorded at the tip and confirmed at depth {DEPTH}: watcher CPU "
        f"{1000 * total / busy:.0f} ms per block (p50 round {p50:.0f} ms, "
        f"max {1000 * max(busy_cpu):.0f} ms); {matching / total:,.0f} matching logs/s "
        f"recorded and confirmed per CPU second (wall {matching / busy_wall:,.0f}/s)"
    )
    print(
        f"  with PostgreSQL's server CPU for the bench database (+{1000 * busy_pg / busy:.0f} ms "
        f"per block): {1000 * (total + busy_pg) / busy:.0f} ms per block, "
        f"{matching / (total + busy_pg):,.0f} matching logs/s per CPU second "
        f"(goal >= 2,000 on one core)"
    )
    print(
        f"quiet blocks: {quiet} x {NOISE_PER_QUIET_BLOCK} transfers, none to a deposit address: "
        f"watcher CPU {1000 * statistics.mean(quiet_cpu):.1f} ms per block "
        f"(p50 {1000 * statistics.median(quiet_cpu):.1f} ms, max {1000 * max(quiet_cpu):.1f} ms); "
        f"with PostgreSQL's {1000 * (sum(quiet_cpu) + quiet_pg) / quiet:.1f} ms (goal < 50 ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
