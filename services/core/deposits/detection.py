"""Detection: a transfer to a deposit address becomes a deposit, gains confirmations,
is confirmed at depth, or fails `reorged` when its block leaves the canonical chain.

The chain watcher (`watcher.py`) and the sandbox confirmer drive these use cases.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Protocol

import sqlalchemy as sa
from eth_utils import to_checksum_address
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.core.chains import ChainRegistry
from services.core.deposits import states, store, transitions
from services.core.deposits.models import Deposit
from services.core.deposits.pricing import PriceSource, amount_usd
from services.core.deposits.rules import net_usd
from services.core.deposits.serialize import token_units
from services.core.deposits.store import DepositStore
from services.core.fees import fee_for
from services.core.models import DepositAccount, DepositAddress
from shared.db import Database, is_unique_violation
from shared.ids import new_id
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class TransferLike(Protocol):
    """An ERC-20 transfer as the chain reader reports it (evm.TransferLog)."""

    block_number: int
    block_hash: str
    tx_hash: str
    log_index: int
    token_address: str
    from_address: str
    to_address: str
    amount_raw: int


def account_at(
    session: Session, chain_id: int, address: str, *, tenant_id: str | None = None
) -> DepositAccount | None:
    """The account a deposit address belongs to (only the tenant's, when given)."""
    stmt = (
        sa.select(DepositAccount)
        .join(DepositAddress, DepositAccount.pk == DepositAddress.account_pk)
        .where(DepositAddress.chain_id == chain_id, DepositAddress.address == address)
    )
    if tenant_id is not None:
        stmt = stmt.where(DepositAccount.tenant_id == tenant_id)
    return session.scalars(stmt).first()


def open_deposit(
    session: Session,
    registry: ChainRegistry,
    account: DepositAccount,
    *,
    chain_id: int,
    deposit_address: str,
    asset: str | None,
    token_address: str,
    decimals: int | None,
    amount_raw: int,
    amount_usd_value: Decimal | None,
    source_tx_hash: str,
    log_index: int,
    from_address: str | None,
    block_number: int | None,
    block_hash: str | None,
    confirmations: int,
    now: datetime,
    sandbox: bool = False,
    sandbox_outcome: str | None = None,
) -> Deposit | None:
    """A new deposit in `source_seen` and its event (None: the transfer is recorded already)."""
    chain = registry.get(chain_id)
    assert chain is not None
    # The fee shown before settlement is the live one now (an estimate); settlement
    # records the value it actually skims.
    fee = fee_for(session, chain)
    deposit = Deposit(
        id=new_id("dep"),
        tenant_id=account.tenant_id,
        account_pk=account.pk,
        account_id=account.id,
        external_user_id=account.external_user_id,
        status=states.SOURCE_SEEN,
        chain_id=chain_id,
        deposit_address=deposit_address,
        asset=asset,
        token_address=token_address,
        decimals=decimals,
        amount_raw=str(amount_raw),
        amount_usd=amount_usd_value,
        fee_usd=fee,
        net_usd=None if amount_usd_value is None else net_usd(amount_usd_value, fee),
        source_tx_hash=source_tx_hash,
        log_index=log_index,
        from_address=from_address,
        block_number=block_number,
        block_hash=block_hash,
        confirmations=min(confirmations, chain.confirmations),
        required_confirmations=chain.confirmations,
        dest_chain_id=account.dest_chain_id,
        dest_address=account.dest_address,
        dest_token_address=account.dest_token_address,
        settle_attempts=0,
        failed_providers=[],
        sandbox=sandbox,
        sandbox_outcome=sandbox_outcome,
        created_at=now,
        updated_at=now,
    )
    try:
        with session.begin_nested():
            session.add(deposit)
            session.flush()
    except IntegrityError as exc:
        if not is_unique_violation(exc):
            raise
        return None  # another watcher recorded the same transfer first
    transitions.emit(session, deposit, states.SOURCE_SEEN, now)
    return deposit


class Detection:
    """Recording transfers and counting their confirmations."""

    def __init__(
        self,
        db: Database,
        registry: ChainRegistry,
        prices: PriceSource,
        *,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.registry = registry
        self.prices = prices
        self.clock = clock
        self.store = DepositStore(db)

    def record_transfer(
        self, session: Session, chain_id: int, transfer: TransferLike, *, confirmations: int
    ) -> Deposit | None:
        """A transfer to a deposit address becomes a deposit in `source_seen` (in `session`).

        Seen before in the same block: nothing. Seen before in a block that has since
        been replaced (a reorg re-included it): the pending deposit moves to the new block.
        Returns the new deposit, or None.
        """
        chain = self.registry.get(chain_id)
        if chain is None:
            return None
        to_address = to_checksum_address(transfer.to_address)
        account = account_at(session, chain_id, to_address)
        if account is None:
            return None
        existing = session.scalars(
            sa.select(Deposit).where(
                Deposit.chain_id == chain_id,
                Deposit.source_tx_hash == transfer.tx_hash,
                Deposit.log_index == transfer.log_index,
                sa.or_(
                    Deposit.failure_reason.is_(None),
                    Deposit.failure_reason != states.REASON_REORGED,
                ),
            )
        ).first()
        if existing is not None:
            self._seen_again(existing, transfer, confirmations)
            return None
        asset = chain.asset_by_token(transfer.token_address)
        amount_raw = int(transfer.amount_raw)
        usd = None
        if asset is not None:
            price = self.prices.usd_price(chain_id, asset.symbol)
            usd = amount_usd(token_units(amount_raw, asset.decimals), price)
        return open_deposit(
            session,
            self.registry,
            account,
            chain_id=chain_id,
            deposit_address=to_address,
            asset=asset.symbol if asset else None,
            token_address=to_checksum_address(transfer.token_address),
            decimals=asset.decimals if asset else None,
            amount_raw=amount_raw,
            amount_usd_value=usd,
            source_tx_hash=transfer.tx_hash,
            log_index=transfer.log_index,
            from_address=to_checksum_address(transfer.from_address),
            block_number=transfer.block_number,
            block_hash=transfer.block_hash,
            confirmations=confirmations,
            now=self.clock(),
        )

    def _seen_again(self, deposit: Deposit, transfer: TransferLike, confirmations: int) -> None:
        if deposit.block_hash == transfer.block_hash:
            return  # the same block scanned again: already counted
        if deposit.status == states.SOURCE_SEEN:
            log.info(
                "deposit %s re-included by a reorg: block %s -> %s",
                deposit.id,
                deposit.block_number,
                transfer.block_number,
            )
            deposit.block_number = transfer.block_number
            deposit.block_hash = transfer.block_hash
            deposit.confirmations = confirmations
            deposit.updated_at = self.clock()
        else:
            log.error(
                "deposit %s (%s) is in block %s on a replaced branch: a reorg deeper than "
                "the confirmation depth",
                deposit.id,
                deposit.status,
                deposit.block_number,
            )

    def set_confirmations(self, counts: Mapping[str, int]) -> None:
        """Store confirmation counts of deposits still waiting for their depth."""
        if not counts:
            return
        now = self.clock()
        with self.db.transaction() as session:
            for deposit_id, count in counts.items():
                session.execute(
                    sa.update(Deposit)
                    .where(Deposit.id == deposit_id, Deposit.status == states.SOURCE_SEEN)
                    .values(confirmations=count, updated_at=now)
                )

    def confirm(
        self,
        deposit_id: str,
        confirmations: int,
        *,
        block_hash: str | None = None,
        skip_locked: bool = False,
    ) -> Deposit | None:
        """`source_seen` -> `source_confirmed` (or manual review for an unsupported token).

        `block_hash`: the canonical hash the caller just read for the deposit's block;
        a deposit recorded in another block is not confirmed.
        """
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id, skip_locked=skip_locked)
            if deposit is None or deposit.status != states.SOURCE_SEEN:
                return None
            if block_hash is not None and deposit.block_hash != block_hash:
                return None
            now = self.clock()
            deposit.confirmations = confirmations
            if deposit.asset is None:
                deposit.confirmed_at = now
                transitions.review(session, deposit, now, states.REVIEW_UNSUPPORTED_TOKEN)
            else:
                transitions.move(session, deposit, states.SOURCE_CONFIRMED, now)
            return deposit

    def mark_reorged(self, deposit_id: str, stale_block_hash: str) -> Deposit | None:
        """A pending deposit whose block left the canonical chain: failed, `reorged`."""
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id)
            if (
                deposit is None
                or deposit.status != states.SOURCE_SEEN
                or deposit.block_hash != stale_block_hash
            ):
                return None
            transitions.move(
                session, deposit, states.FAILED, self.clock(), failure_reason=states.REASON_REORGED
            )
            return deposit
