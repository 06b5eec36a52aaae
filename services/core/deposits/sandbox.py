"""Simulated blocks for sandbox deposits: they confirm as a real chain would, only faster.

A sandbox chain mines one block every `block_s` seconds since the Unix epoch, so the
head is a pure function of the clock: every API and worker process agrees on it with
nothing stored. A sandbox deposit is "mined" in the head block at creation and gains
one confirmation per simulated block until the chain's depth (the chains file).
`block_s = 0` confirms at once.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from eth_utils import keccak

from services.core import amounts
from services.core.chains import ChainRegistry
from services.core.deposits.detection import Detection, open_deposit
from services.core.deposits.detection_store import account_at
from services.core.deposits.models import Deposit
from services.core.deposits.pricing import PriceSource, amount_usd
from services.core.deposits.rules import SANDBOX_OUTCOMES
from shared.api import field_error
from shared.db import Database
from shared.errors import NotFound
from shared.timefmt import utcnow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxChain:
    """The simulated chain every sandbox deposit is mined on."""

    block_s: float = 0.2

    def head(self, now: datetime) -> int:
        if self.block_s <= 0:
            return int(now.timestamp() * 1000)
        return int(now.timestamp() / self.block_s)

    def block_hash(self, chain_id: int, number: int) -> str:
        return "0x" + keccak(text=f"settle:sandbox:{chain_id}:{number}").hex()

    def confirmations(self, deposit: Deposit, now: datetime) -> int:
        """1 in the block it was mined in, +1 per simulated block since; capped at the depth."""
        if self.block_s <= 0 or deposit.block_number is None:
            return deposit.required_confirmations
        elapsed = (now - deposit.created_at).total_seconds()
        count = 1 + int(max(0.0, elapsed) / self.block_s)
        return min(count, deposit.required_confirmations)


class SandboxDeposits:
    """The use case behind POST /v1/sandbox/deposits."""

    def __init__(
        self,
        db: Database,
        registry: ChainRegistry,
        prices: PriceSource,
        chain: SandboxChain,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        self.registry = registry
        self.prices = prices
        self.chain = chain
        self.clock = clock

    def create(
        self,
        tenant_id: str,
        *,
        chain_id: int,
        deposit_address: str,
        asset: str,
        amount: Decimal,
        outcome: str = "credited",
    ) -> Deposit:
        """A simulated deposit to one of the tenant's addresses; enters the pipeline seen."""
        chain = self.registry.require_active(chain_id)
        token = chain.asset_by_symbol(asset)
        if token is None:
            accepted = ", ".join(a.symbol for a in chain.assets)
            raise field_error(
                "asset", f"{asset} is not accepted on chain {chain_id}; use {accepted}"
            )
        if not amount.is_finite() or amount <= 0:
            raise field_error("amount", "must be a positive decimal amount")
        if not amounts.fits(amount, token):
            raise field_error("amount", amounts.too_fine_message(amount, [(chain, token)]))
        amount_raw = amounts.base_units(amount, token.decimals)
        if outcome not in SANDBOX_OUTCOMES:
            raise field_error("outcome", f"must be one of {', '.join(SANDBOX_OUTCOMES)}")
        now = self.clock()
        block = self.chain.head(now)
        with self.db.transaction() as session:
            account = account_at(session, chain_id, deposit_address, tenant_id=tenant_id)
            if account is None:
                raise NotFound(f"no deposit address {deposit_address} on chain {chain_id}")
            price = self.prices.usd_price(chain_id, token.symbol)
            deposit = open_deposit(
                session,
                self.registry,
                account,
                chain_id=chain_id,
                deposit_address=deposit_address,
                asset=token.symbol,
                token_address=token.token_address,
                decimals=token.decimals,
                amount_raw=amount_raw,
                amount_usd_value=amount_usd(amount, price),
                source_tx_hash="0x" + secrets.token_hex(32),
                log_index=0,
                from_address=None,
                block_number=block,
                block_hash=self.chain.block_hash(chain_id, block),
                confirmations=1,
                now=now,
                sandbox=True,
                sandbox_outcome=outcome,
            )
            assert deposit is not None  # a random tx hash cannot collide
            return deposit


class SandboxConfirmer:
    """Counts confirmations of pending sandbox deposits and confirms them at depth."""

    def __init__(
        self,
        detection: Detection,
        chain: SandboxChain,
        *,
        clock: Callable[[], datetime] | None = None,
        batch_size: int = 100,
    ) -> None:
        self.detection = detection
        self.chain = chain
        self.clock = clock or detection.clock
        self.batch_size = batch_size

    def tick(self) -> int:
        """One round; returns how many deposits were confirmed."""
        now = self.clock()
        confirmed = 0
        counts: dict[str, int] = {}
        for deposit in self.detection.store.pending_sandbox(self.batch_size):
            count = self.chain.confirmations(deposit, now)
            if count >= deposit.required_confirmations:
                if self.detection.confirm(deposit.id, count, skip_locked=True) is not None:
                    confirmed += 1
            elif count != deposit.confirmations:
                counts[deposit.id] = count
        self.detection.set_confirmations(counts)
        return confirmed
