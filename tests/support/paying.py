"""The deposit pipeline paying from a hot wallet on a real node (anvil), for the tests of
what a hostile world does to a payout (tests/integration/test_paying_hostile.py).

    with anvil_rig(pg_db, tenant.tenant_id) as rig:
        deposit_id = rig.deposit(50 * USDC)            # sent, mined, confirmed at depth
        pipeline = rig.pipeline(rig.parts())
        rig.rounds(pipeline, 5)                         # a settlement round, a block, ...
        assert rig.paid() == 49_500_000                 # what reached the destination

Automine is off: nothing is mined unless the test (or `rounds`) mines, so a payout
sits in the node's pool as long as the test wants. The hot wallet is one of anvil's
funded accounts; the destination a fresh address holding nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from eth_account import Account
from eth_account.signers.local import LocalAccount

from services.core.chains import ChainRegistry
from services.core.deposits import states
from services.core.deposits.chain_check import ChainCheck
from services.core.deposits.models import ChainIncident, Deposit
from services.core.deposits.sandbox import SandboxChain, SandboxConfirmer
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import EvmPayer, Settlement
from services.core.deposits.watcher import ChainWatcher
from services.core.deposits.worker import Pipeline
from services.core.evm import Web3ChainReader
from services.core.hot_wallet import Erc20TransferExecutor
from shared.db import Database
from tests.support.anvil import AnvilNode
from tests.support.deposits import (
    AccountRef,
    DepositParts,
    deposit_event_types,
    deposit_parts,
    make_account,
    set_fee,
    small_registry,
    unique_chain_id,
)

USDC = 10**6
#: The test chain's confirmations (it pays its own deposits: direct credits).
DEPTH = 3
#: The fee every deposit skims (USD, a stablecoin at 1).
FEE_RAW = 500_000
SETTINGS = PipelineSettings(
    poll_s=0.0, retry_base_s=0.0, sandbox_block_s=0, payment_replace_blocks=3, wait_retry_s=0.0
)


@dataclass
class PayingRig:
    node: AnvilNode
    db: Database
    registry: ChainRegistry
    chain_id: int
    token: str
    hot: LocalAccount
    customer: LocalAccount
    wallet: str
    account: AccountRef
    watcher: ChainWatcher

    def executor(self, url: str | None = None, timeout_s: float = 5.0) -> Erc20TransferExecutor:
        return Erc20TransferExecutor.from_url(
            url or self.node.url, self.hot.key, timeout_s, chain_id=self.chain_id
        )

    def payer(self, url: str | None = None) -> EvmPayer:
        """The hot wallet, waiting for the chain's check as the worker's does."""
        return EvmPayer(self.executor(url), check=self.watcher.check)

    def parts(self, settings: PipelineSettings = SETTINGS, url: str | None = None) -> DepositParts:
        """The deposit use cases with a hot-wallet payer of their own (one per worker)."""
        settlement = Settlement(self.registry, payers={self.chain_id: self.payer(url)})
        return deposit_parts(self.db, self.registry, settlement=settlement, settings=settings)

    def pipeline(self, parts: DepositParts) -> Pipeline:
        return Pipeline(
            settling=parts.settling,
            sandbox=SandboxConfirmer(parts.detection, SandboxChain(0)),
            settings=parts.settings,
        )

    def send_deposit(self, amount_raw: int) -> str:
        """The customer's transfer to the account's deposit address, in the pool; its hash."""
        to = self.account.address(self.chain_id)
        return self.node.transfer(self.token, self.customer, to, amount_raw, wait=False)

    def deposit(self, amount_raw: int) -> str:
        """A deposit of `amount_raw` sent, mined, confirmed at depth; its id."""
        before = {d.id for d in self.deposits()}
        self.send_deposit(amount_raw)
        self.node.mine(DEPTH)
        self.watcher.tick()
        (new,) = [d for d in self.deposits() if d.id not in before]
        assert new.status == states.SOURCE_CONFIRMED, new.status
        return new.id

    def deposits(self) -> list[Deposit]:
        with self.db.reader() as session:
            rows = list(
                session.scalars(
                    sa.select(Deposit)
                    .where(Deposit.account_id == self.account.id)
                    .order_by(Deposit.id)
                )
            )
            session.expunge_all()
            return rows

    def row(self, deposit_id: str) -> Deposit:
        return next(d for d in self.deposits() if d.id == deposit_id)

    def status(self, deposit_id: str) -> str:
        return self.row(deposit_id).status

    def paid(self) -> int:
        """The destination's token balance: what every payout together brought."""
        return self.node.balance_of(self.token, self.wallet)

    def hot_nonce(self) -> int:
        return self.node.nonce(self.hot.address)

    def credited_events(self, deposit_id: str) -> int:
        return deposit_event_types(self.db, deposit_id).count("deposit.credited")

    def rounds(self, pipeline: Pipeline, n: int, *, mine: bool = True) -> None:
        """`n` settlement rounds, a block mined after each."""
        for _ in range(n):
            pipeline.settle_round()
            if mine:
                self.node.mine()

    def run_until(self, pipeline: Pipeline, deposit_id: str, status: str, rounds: int = 15) -> int:
        """Rounds (a block mined after each) until the deposit is in `status`; rounds used."""
        for n in range(1, rounds + 1):
            pipeline.settle_round()
            if self.status(deposit_id) == status:
                return n
            self.node.mine()
        raise AssertionError(f"not {status} after {rounds} rounds: {self.status(deposit_id)}")

    def incidents(self, kind: str | None = None, *, open_only: bool = True) -> list[ChainIncident]:
        with self.db.reader() as session:
            stmt = sa.select(ChainIncident).where(ChainIncident.chain_id == self.chain_id)
            if kind is not None:
                stmt = stmt.where(ChainIncident.kind == kind)
            if open_only:
                stmt = stmt.where(ChainIncident.resolved_at.is_(None))
            rows = list(session.scalars(stmt.order_by(ChainIncident.id)))
            session.expunge_all()
            return rows

    def payments(self, deposit_id: str) -> list[dict[str, Any]]:
        with self.db.reader() as session:
            rows = session.execute(
                sa.text("SELECT * FROM hot_wallet_payments WHERE deposit_id = :d ORDER BY id"),
                {"d": deposit_id},
            )
            return [dict(r._mapping) for r in rows]


def new_watcher(
    rig_db: Database, registry: ChainRegistry, chain_id: int, url: str, start_block: int
) -> ChainWatcher:
    """The chain's watcher over the node at `url`, checking it as the worker does (the
    chain id, and each token's decimals against the chains file)."""
    chain = registry.get(chain_id)
    assert chain is not None
    parts = deposit_parts(rig_db, registry, settings=SETTINGS)
    reader = Web3ChainReader.from_url(url, 5.0, chain_id)
    check = ChainCheck(rig_db, chain, Web3ChainReader.from_url(url, 5.0, chain_id))
    return ChainWatcher(
        parts.detection, chain, reader, lag_blocks=0, start_block=start_block, check=check
    )


@contextmanager
def anvil_rig(
    db: Database,
    tenant_id: str,
    *,
    hot_tokens: int = 1_000_000 * USDC,
    token_decimals: int = 6,
    token_contract: str = "TestToken",  # noqa: S107 (a contract's name, not a password)
    **chain_options: Any,
) -> Iterator[PayingRig]:
    """A node with a token, a funded hot wallet, a customer, an account paying itself.

    `chain_options` go to the chains file (`tests.support.deposits.chains_toml`).
    """
    chain_id = unique_chain_id()
    with AnvilNode(chain_id=chain_id) as node:
        token = node.deploy_token("USDC", token_decimals, contract=token_contract)
        hot, customer = node.accounts[1], node.accounts[2]
        if hot_tokens:
            node.mint(token, hot.address, hot_tokens)
        node.mint(token, customer.address, 10_000 * USDC)
        node.set_automine(False)
        options = {"depth": DEPTH, "min_deposit_usd": 1.0, **chain_options}
        registry = small_registry(chain_id=chain_id, usdc=token, **options)
        wallet = Account.create().address
        account = make_account(
            db,
            tenant_id,
            registry,
            dest_chain_id=chain_id,
            dest_address=wallet,
            dest_token_address=token,
        )
        set_fee(db, chain_id, "0.50")
        watcher = new_watcher(db, registry, chain_id, node.url, node.head() + 1)
        yield PayingRig(
            node, db, registry, chain_id, token, hot, customer, wallet, account, watcher
        )


def with_settings(**changes: Any) -> PipelineSettings:
    return replace(SETTINGS, **changes)
