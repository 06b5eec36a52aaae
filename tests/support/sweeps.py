"""Two anvil chains with a USDC each, the real deposit pipeline on them, and the sums a
sweep must add up to (tests/integration/test_sweeps.py, tests/e2e/test_sweep_commands.py).

    with sweep_chains(tmp_path) as rig:
        rig.write_chains_file()
        ...

Each chain is an anvil node mining a block every 0.2 s, with its own unique chain id (so
its watcher cursor and fees never meet another test's in the shared database). anvil's
development accounts play Settle's hot wallet (1) and the customers (2).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from eth_account import Account
from eth_account.signers.local import LocalAccount

from services.core.deposits.models import Deposit, HotWalletPayment
from services.core.sweeps.models import Sweep, SweepFunding
from shared.db import Database
from tests.support.anvil import AnvilNode, anvil_nodes
from tests.support.deposits import unique_chain_id

USDC = 10**6
#: Blocks a deposit, a payout and a sweep wait for on these chains.
DEPTH = 3
BLOCK_S = 0.2


@dataclass
class SweepRig:
    nodes: dict[int, AnvilNode]
    tokens: dict[int, str]
    hot: LocalAccount
    customer: LocalAccount
    #: Where each chain's accounts settle (a tenant's wallet) and where sweeps go.
    wallets: dict[int, str] = field(default_factory=dict)
    treasury: str = field(default_factory=lambda: Account.create().address)
    #: Native balance of the hot wallet on each chain before anything ran.
    hot_native_start: dict[int, int] = field(default_factory=dict)
    hot_token_start: dict[int, int] = field(default_factory=dict)

    @property
    def chain_ids(self) -> list[int]:
        return list(self.nodes)

    def chains_toml(self) -> str:
        chains = []
        for chain_id, token in self.tokens.items():
            chains.append(
                f"""
[[chains]]
chain_id = {chain_id}
name = "Anvil {chain_id}"
status = "active"
native_symbol = "ETH"
native_usd = 3000.0
gas_price_gwei = 1.0
settlement_gas_units = 65000
confirmations = {DEPTH}
min_deposit_usd = 1.0

  [[chains.assets]]
  symbol = "USDC"
  token_address = "{token}"
  decimals = 6
"""
            )
        first = self.chain_ids[0]
        venue = f'[default_settlement_venue]\nchain_id = {first}\nasset = "USDC"\n'
        return venue + "".join(chains)

    def write_chains_file(self, folder: Path) -> Path:
        path = folder / "sweep-chains.toml"
        path.write_text(self.chains_toml())
        return path

    def rpc_urls(self) -> dict[int, str]:
        return {chain_id: node.url for chain_id, node in self.nodes.items()}


@contextmanager
def sweep_chains(count: int = 2) -> Iterator[SweepRig]:
    """`count` anvil chains, each with a USDC, the hot wallet and a customer funded."""
    with anvil_nodes(*(unique_chain_id() for _ in range(count)), block_time_s=BLOCK_S) as nodes:
        first = nodes[0]
        rig = SweepRig(
            nodes={n.chain_id: n for n in nodes},
            tokens={},
            hot=first.accounts[1],
            customer=first.accounts[2],
        )
        for node in nodes:
            token = node.deploy_token("USDC", 6)
            rig.tokens[node.chain_id] = token
            node.mint(token, rig.hot.address, 1_000_000 * USDC)
            node.mint(token, rig.customer.address, 1_000_000 * USDC)
            rig.wallets[node.chain_id] = Account.create().address
            rig.hot_native_start[node.chain_id] = node.balance(rig.hot.address)
            rig.hot_token_start[node.chain_id] = node.balance_of(token, rig.hot.address)
        yield rig


def gas_paid(node: AnvilNode, tx_hash: str) -> int:
    """Wei a mined transaction's sender paid for its gas."""
    receipt = node.receipt(tx_hash)
    assert receipt is not None, tx_hash
    return int(receipt["gasUsed"], 16) * int(receipt["effectiveGasPrice"], 16)


def deposits_on(db: Database, chain_id: int) -> list[Deposit]:
    with db.reader() as session:
        return list(
            session.scalars(
                sa.select(Deposit).where(Deposit.chain_id == chain_id).order_by(Deposit.id)
            )
        )


def payout_hashes(db: Database, chain_id: int) -> list[str]:
    """Every transaction the hot wallet signed for credits on the chain that was mined."""
    with db.reader() as session:
        rows = session.scalars(
            sa.select(HotWalletPayment).where(HotWalletPayment.chain_id == chain_id)
        )
        return [h for row in rows for h in row.tx_hashes]


def sweeps_on(db: Database, chain_id: int) -> list[Sweep]:
    with db.reader() as session:
        return list(
            session.scalars(sa.select(Sweep).where(Sweep.chain_id == chain_id).order_by(Sweep.id))
        )


def fundings_on(db: Database, chain_id: int) -> list[SweepFunding]:
    with db.reader() as session:
        return list(
            session.scalars(
                sa.select(SweepFunding)
                .where(SweepFunding.chain_id == chain_id)
                .order_by(SweepFunding.id)
            )
        )
