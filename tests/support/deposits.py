"""Deposit test helpers: a small-depth chain registry, accounts inserted directly, events.

Accounts are inserted as rows (not through the accounts API) with addresses derived
from the test xpub, so the deposit tests depend only on core's tables.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.core.addresses import AddressDeriver
from services.core.chains import ChainRegistry, parse_chains
from services.core.deposits.detection import Detection
from services.core.deposits.models import Deposit
from services.core.deposits.ops import Ops
from services.core.deposits.pricing import PriceSource, StaticPrices
from services.core.deposits.queries import DepositQueries
from services.core.deposits.sandbox import SandboxChain, SandboxDeposits
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import Settlement
from services.core.deposits.settling import Settling
from services.core.models import ChainFee, DepositAccount, DepositAddress, OutboxEvent
from shared.db import Database
from shared.timefmt import utcnow
from tests.support.catalog import conforming
from tests.support.keys import test_xpub

Clock = Callable[[], datetime]

#: A chain id of the tests' own (fees stored for it cannot clash with other suites').
TEST_CHAIN_ID = 31337
#: Canonical-looking token of the test chain when no real contract is deployed.
TEST_USDC = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
#: A token the test chain does not support.
ODD_TOKEN = "0x00000000000000000000000000000000DeaDBeef"
WALLET = "0x1111111111111111111111111111111111111111"
SENDER = "0x2222222222222222222222222222222222222222"


def chains_toml(
    *,
    chain_id: int = TEST_CHAIN_ID,
    depth: int = 3,
    min_deposit_usd: float = 1.0,
    usdc: str = TEST_USDC,
    decimals: int = 6,
    gas_price_gwei: float = 1.0,
    finality_tag: str = "",
    reorg_depth: int = 0,
    fee_cap_gwei: float | None = None,
) -> str:
    """A chains file: the test chain (small depth), Base, and a declared chain.

    Suites that watch a chain use their own `chain_id`, so their cursors and pending
    deposits never meet in the shared database.
    """
    return f"""
[default_settlement_venue]
chain_id = {chain_id}
asset = "USDC"

[[chains]]
chain_id = {chain_id}
name = "Test chain"
status = "active"
native_symbol = "ETH"
native_usd = 3000.0
gas_price_gwei = {gas_price_gwei}
settlement_gas_units = 65000
confirmations = {depth}
finality_tag = "{finality_tag}"
reorg_depth = {reorg_depth}
min_deposit_usd = {min_deposit_usd}
{"" if fee_cap_gwei is None else f"payment_max_fee_gwei = {fee_cap_gwei}"}

  [[chains.assets]]
  symbol = "USDC"
  token_address = "{usdc}"
  decimals = {decimals}

[[chains]]
chain_id = 8453
name = "Base"
status = "active"
native_symbol = "ETH"
native_usd = 3000.0
gas_price_gwei = 0.02
settlement_gas_units = 65000
confirmations = {depth}
min_deposit_usd = 1.0

  [[chains.assets]]
  symbol = "USDC"
  token_address = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
  decimals = 6

[[chains]]
chain_id = 42161
name = "Arbitrum One"
status = "declared"
native_symbol = "ETH"
native_usd = 3000.0
gas_price_gwei = 0.01
settlement_gas_units = 65000
confirmations = 20
"""


def unique_chain_id() -> int:
    """A chain id no other test uses (cursors, fees and fake tx hashes are per chain)."""
    return secrets.randbelow(2**31 - 100_000) + 100_000


def small_registry(**kwargs: Any) -> ChainRegistry:
    return parse_chains(chains_toml(**kwargs))


@dataclass(frozen=True)
class AccountRef:
    pk: int
    id: str
    tenant_id: str
    external_user_id: str
    addresses: dict[int, str]
    #: The BIP32 index its addresses are derived at.
    address_index: int = 0

    def address(self, chain_id: int = TEST_CHAIN_ID) -> str:
        return self.addresses[chain_id]


def make_account(
    db: Database,
    tenant_id: str,
    registry: ChainRegistry,
    *,
    external_user_id: str | None = None,
    dest_chain_id: int = TEST_CHAIN_ID,
    dest_address: str = WALLET,
    dest_token_address: str | None = None,
) -> AccountRef:
    """Insert an account with one derived deposit address per active chain."""
    with db.transaction() as session:
        return insert_account(
            session,
            registry,
            AddressDeriver(test_xpub()),
            tenant_id,
            external_user_id=external_user_id,
            dest_chain_id=dest_chain_id,
            dest_address=dest_address,
            dest_token_address=dest_token_address,
        )


def insert_account(
    session: Session,
    registry: ChainRegistry,
    deriver: AddressDeriver,
    tenant_id: str,
    *,
    external_user_id: str | None = None,
    dest_chain_id: int = TEST_CHAIN_ID,
    dest_address: str = WALLET,
    dest_token_address: str | None = None,
) -> AccountRef:
    """`make_account` in the caller's session (no event: fixtures, not the API)."""
    token = dest_token_address
    if token is None:
        dest_chain = registry.get(dest_chain_id)
        assert dest_chain is not None
        token = dest_chain.assets[0].token_address
    now = utcnow()
    account = DepositAccount(
        id=f"acc_{uuid.uuid4().hex[:26].upper()}",
        tenant_id=tenant_id,
        external_user_id=external_user_id or f"user-{uuid.uuid4().hex[:10]}",
        status="active",
        dest_chain_id=dest_chain_id,
        dest_address=dest_address,
        dest_token_address=token,
        metadata_={},
        created_at=now,
        updated_at=now,
    )
    session.add(account)
    session.flush()
    addresses = {}
    for position, chain in enumerate(registry.active()):
        address = deriver.derive(chain.chain_id, account.derivation_index)
        session.add(
            DepositAddress(
                account_pk=account.pk, chain_id=chain.chain_id, address=address, position=position
            )
        )
        addresses[chain.chain_id] = address
    return AccountRef(
        account.pk,
        account.id,
        tenant_id,
        account.external_user_id,
        addresses,
        account.derivation_index,
    )


def set_fee(db: Database, chain_id: int, fee_usd: str) -> None:
    """Store a chain's live fee as the fee oracle would."""
    with db.transaction() as session:
        row = session.get(ChainFee, chain_id) or ChainFee(chain_id=chain_id)
        row.settlement_fee_usd = Decimal(fee_usd)
        row.gas_price_wei = Decimal(10**9)
        row.native_usd = Decimal(3000)
        row.gas_units = 65000
        row.source = "configured"
        row.updated_at = utcnow()
        session.add(row)


def deposit_row(db: Database, deposit_id: str) -> Deposit:
    with db.reader() as session:
        deposit = session.get(Deposit, deposit_id)
        assert deposit is not None
        session.expunge(deposit)
        return deposit


def deposits_of(db: Database, account: AccountRef) -> list[Deposit]:
    with db.reader() as session:
        rows = list(
            session.scalars(
                sa.select(Deposit).where(Deposit.account_id == account.id).order_by(Deposit.id)
            )
        )
        session.expunge_all()
        return rows


def events_of(db: Database, tenant_id: str) -> list[dict[str, Any]]:
    """The tenant's outbox events (decoded envelopes), oldest first; each matches the catalog."""
    with db.reader() as session:
        bodies = session.scalars(
            sa.select(OutboxEvent.body)
            .where(OutboxEvent.tenant_id == tenant_id)
            .order_by(OutboxEvent.id)
        )
        return [conforming(json.loads(body)) for body in bodies]


def deposit_event_types(db: Database, deposit_id: str) -> list[str]:
    """Types of the events about one deposit, in emission order."""
    with db.reader() as session:
        rows = session.scalars(
            sa.select(OutboxEvent.body)
            .where(OutboxEvent.event_type.like("deposit.%"))
            .where(OutboxEvent.body.contains(deposit_id))
            .order_by(OutboxEvent.id)
        )
        return [json.loads(body)["type"] for body in rows]


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 11, 21, 4, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> None:
        self.now += timedelta(**kwargs)


@dataclass
class DepositParts:
    """The deposit pipeline's use cases over one database, wired as the worker wires them."""

    db: Database
    registry: ChainRegistry
    settings: PipelineSettings
    settlement: Settlement
    detection: Detection
    settling: Settling
    ops: Ops
    queries: DepositQueries
    sandbox: SandboxDeposits
    clock: Clock


def deposit_parts(
    db: Database,
    registry: ChainRegistry,
    *,
    settings: PipelineSettings | None = None,
    settlement: Settlement | None = None,
    prices: PriceSource | None = None,
    clock: Clock = utcnow,
) -> DepositParts:
    """Every deposit use case on `db` (defaults: settings' prices, no payers)."""
    settings = settings or PipelineSettings()
    settlement = settlement or Settlement(
        registry, provider_max_failures=settings.provider_max_failures
    )
    prices = prices or StaticPrices(settings.prices_usd)
    return DepositParts(
        db=db,
        registry=registry,
        settings=settings,
        settlement=settlement,
        detection=Detection(db, registry, prices, clock=clock),
        settling=Settling(db, registry, settlement, prices, settings, clock=clock),
        ops=Ops(db, registry, settlement, settings, clock=clock),
        queries=DepositQueries(db),
        sandbox=SandboxDeposits(
            db, registry, prices, SandboxChain(settings.sandbox_block_s), clock=clock
        ),
        clock=clock,
    )
