"""Deposit use cases: detect, confirm, settle, resolve by hand, list.

Each status change and its outbox event commit in ONE transaction, with the deposit's
row locked (`FOR UPDATE`), so a step that runs twice (two workers, a retry) finds the
status already moved and does nothing. Durable events (`evt_dep_<id>_<status>`) are
written in a savepoint: the outbox's unique event id turns a racing duplicate into a
no-op, so the database itself guarantees "at most once".

Calls to payers and route providers happen between transactions: the deposit is marked
(`settle_phase`) before the call and the answer is recorded after it, so a crash in
the middle is noticed (and never paid twice).
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

import sqlalchemy as sa
from eth_utils import to_checksum_address
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.core import outbox
from services.core.chains import ChainRegistry
from services.core.deposits import states
from services.core.deposits.models import Deposit
from services.core.deposits.pricing import PriceSource, StaticPrices, amount_usd, token_amount
from services.core.deposits.serialize import deposit_document, token_units
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import (
    MANUAL,
    ROUTED,
    Credited,
    CreditOrder,
    Failed,
    InFlight,
    Outcome,
    Route,
    Settlement,
)
from services.core.fees import fee_for
from services.core.models import DepositAccount, DepositAddress
from shared.api import decode_cursor, encode_cursor
from shared.db import Database, is_unique_violation
from shared.errors import Conflict, InvalidRequest, NotFound
from shared.ids import new_id
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

#: `settle_phase` while a payer or provider call is in flight.
PHASE_STARTING = "starting"

#: What a deposit id looks like (anything else is not found without a query).
DEPOSIT_ID = re.compile(r"^dep_[0-9A-Z]{26}$")

#: Outcomes a sandbox deposit can rehearse.
SANDBOX_OUTCOMES = ("credited", "failed", "manual_review")


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


@dataclass(frozen=True)
class DepositFilters:
    external_user_id: str | None = None
    status: str | None = None
    chain_id: int | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", details={"fields": {field: [message]}})


class DepositService:
    """The deposit pipeline's use cases over one database."""

    def __init__(
        self,
        db: Database,
        registry: ChainRegistry,
        *,
        settings: PipelineSettings | None = None,
        prices: PriceSource | None = None,
        settlement: Settlement | None = None,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.registry = registry
        self.settings = settings or PipelineSettings()
        self.prices = prices or StaticPrices(self.settings.prices_usd)
        self.settlement = settlement or Settlement(
            registry, provider_max_failures=self.settings.provider_max_failures
        )
        self.clock = clock

    # --- writing a status change and its event ------------------------------------------

    def _lock(
        self, session: Session, deposit_id: str, *, skip_locked: bool = False
    ) -> Deposit | None:
        stmt = (
            sa.select(Deposit)
            .where(Deposit.id == deposit_id)
            .with_for_update(skip_locked=skip_locked)
            .execution_options(populate_existing=True)
        )
        return session.scalars(stmt).first()

    def _emit(self, session: Session, deposit: Deposit, status: str, now: datetime) -> bool:
        """Write the status's event; a durable one already written is a no-op (False)."""
        event_type = states.EVENT_TYPES[status]
        data = {"deposit": deposit_document(deposit)}
        event_id = states.event_id(deposit.id, status)
        if not states.is_durable(status):
            outbox.emit(
                session, event_type, deposit.tenant_id, data, event_id=event_id, created_at=now
            )
            return True
        try:
            with session.begin_nested():
                outbox.emit(
                    session, event_type, deposit.tenant_id, data, event_id=event_id, created_at=now
                )
        except IntegrityError as exc:
            if not is_unique_violation(exc):
                raise
            log.info("event %s was already emitted", event_id)
            return False
        return True

    def _move(
        self, session: Session, deposit: Deposit, target: str, now: datetime, **fields: Any
    ) -> None:
        """Change the status (legal moves only), then write its event."""
        states.transition(deposit.status, target)
        for name, value in fields.items():
            setattr(deposit, name, value)
        deposit.status = target
        deposit.updated_at = now
        if target == states.SOURCE_CONFIRMED:
            deposit.confirmed_at = now
        if target == states.CREDITED:
            deposit.credited_at = now
        if states.is_final(target):
            deposit.settle_phase = None
            deposit.next_attempt_at = None
        session.flush()
        self._emit(session, deposit, target, now)

    # --- detection ------------------------------------------------------------------------

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
        row = session.execute(
            sa.select(DepositAddress, DepositAccount)
            .join(DepositAccount, DepositAccount.pk == DepositAddress.account_pk)
            .where(DepositAddress.chain_id == chain_id, DepositAddress.address == to_address)
        ).first()
        if row is None:
            return None
        _, account = row
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
            self._seen_again(session, existing, transfer, confirmations)
            return None
        now = self.clock()
        asset = chain.asset_by_token(transfer.token_address)
        amount_raw = int(transfer.amount_raw)
        usd = None
        if asset is not None:
            price = self.prices.usd_price(chain_id, asset.symbol)
            usd = amount_usd(token_units(amount_raw, asset.decimals), price)
        deposit = self._new_deposit(
            session,
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
            now=now,
        )
        return deposit

    def _seen_again(
        self, session: Session, deposit: Deposit, transfer: TransferLike, confirmations: int
    ) -> None:
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

    def _new_deposit(
        self,
        session: Session,
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
        chain = self.registry.get(chain_id)
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
            net_usd=None if amount_usd_value is None else max(amount_usd_value - fee, Decimal(0)),
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
        self._emit(session, deposit, states.SOURCE_SEEN, now)
        return deposit

    def create_sandbox_deposit(
        self,
        tenant_id: str,
        *,
        chain_id: int,
        deposit_address: str,
        asset: str,
        amount: Decimal,
        outcome: str = "credited",
        block_number: int | None = None,
        block_hash: str | None = None,
    ) -> dict[str, Any]:
        """A simulated deposit to one of the tenant's addresses; enters the pipeline seen."""
        chain = self.registry.require_active(chain_id)
        token = chain.asset_by_symbol(asset)
        if token is None:
            accepted = ", ".join(a.symbol for a in chain.assets)
            raise _invalid("asset", f"{asset} is not accepted on chain {chain_id}; use {accepted}")
        if not amount.is_finite() or amount <= 0:
            raise _invalid("amount", "must be a positive decimal amount")
        if amount.as_tuple().exponent < -token.decimals:  # type: ignore[operator]
            raise _invalid("amount", f"{asset} has {token.decimals} decimals; {amount} has more")
        amount_raw = int(amount.scaleb(token.decimals))
        if amount_raw >= 2**256:
            raise _invalid("amount", "is too large for a token amount")
        if outcome not in SANDBOX_OUTCOMES:
            raise _invalid("outcome", f"must be one of {', '.join(SANDBOX_OUTCOMES)}")
        with self.db.transaction() as session:
            row = session.execute(
                sa.select(DepositAddress, DepositAccount)
                .join(DepositAccount, DepositAccount.pk == DepositAddress.account_pk)
                .where(
                    DepositAddress.chain_id == chain_id,
                    DepositAddress.address == deposit_address,
                    DepositAccount.tenant_id == tenant_id,
                )
            ).first()
            if row is None:
                raise NotFound(f"no deposit address {deposit_address} on chain {chain_id}")
            _, account = row
            now = self.clock()
            price = self.prices.usd_price(chain_id, token.symbol)
            deposit = self._new_deposit(
                session,
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
                block_number=block_number,
                block_hash=block_hash,
                confirmations=1,
                now=now,
                sandbox=True,
                sandbox_outcome=outcome,
            )
            assert deposit is not None  # a random tx hash cannot collide
            return deposit_document(deposit)

    # --- confirmations --------------------------------------------------------------------

    def set_confirmations(self, counts: dict[str, int]) -> None:
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
            deposit = self._lock(session, deposit_id, skip_locked=skip_locked)
            if deposit is None or deposit.status != states.SOURCE_SEEN:
                return None
            if block_hash is not None and deposit.block_hash != block_hash:
                return None
            now = self.clock()
            deposit.confirmations = confirmations
            if deposit.asset is None:
                deposit.confirmed_at = now
                self._move(
                    session,
                    deposit,
                    states.MANUAL_REVIEW_REQUIRED,
                    now,
                    review_reason=states.REVIEW_UNSUPPORTED_TOKEN,
                )
            else:
                self._move(session, deposit, states.SOURCE_CONFIRMED, now)
            return deposit

    def mark_reorged(self, deposit_id: str, stale_block_hash: str) -> Deposit | None:
        """A pending deposit whose block left the canonical chain: failed, `reorged`."""
        with self.db.transaction() as session:
            deposit = self._lock(session, deposit_id)
            if (
                deposit is None
                or deposit.status != states.SOURCE_SEEN
                or deposit.block_hash != stale_block_hash
            ):
                return None
            self._move(
                session, deposit, states.FAILED, self.clock(), failure_reason=states.REASON_REORGED
            )
            return deposit

    # --- settlement -----------------------------------------------------------------------

    @staticmethod
    def _due(deposit: Deposit, now: datetime) -> bool:
        return deposit.next_attempt_at is None or deposit.next_attempt_at <= now

    def settle(self, deposit_id: str, *, skip_locked: bool = True) -> str | None:
        """Credit a confirmed deposit (or one whose route failed and waits for another).

        Returns the status it ended the step in, or None when there was nothing to do.
        """
        now = self.clock()
        with self.db.transaction() as session:
            deposit = self._lock(session, deposit_id, skip_locked=skip_locked)
            if deposit is None or deposit.settle_phase is not None or not self._due(deposit, now):
                return None
            waiting = deposit.status == states.CREDIT_SUBMITTED and deposit.provider_ref is None
            if deposit.status != states.SOURCE_CONFIRMED and not waiting:
                return None
            if deposit.credit_amount is None:
                order = self._decide(session, deposit, now)
            else:
                # A retry pays what the first settlement decided (same fee, same net).
                order = self._order(deposit)
            if order is None:
                if (
                    not states.is_final(deposit.status)
                    and deposit.status != states.MANUAL_REVIEW_REQUIRED
                ):
                    self._review(session, deposit, now, states.REVIEW_UNSUPPORTED_DESTINATION)
                return deposit.status
            route = self.settlement.choose(session, deposit, order, now)
            if route is None:
                deposit.settle_attempts += 1
                self._retry_or_review(
                    session, deposit, now, states.REVIEW_NO_ROUTE, "no route available"
                )
                return deposit.status
            deposit.route = route.kind
            deposit.provider = route.name
            deposit.provider_ref = None
            deposit.credit_amount = str(order.amount)
            deposit.settle_attempts += 1
            deposit.updated_at = now
            if route.instant:
                # Answers from memory (simulated routes): no call to wait for, so the
                # answer commits with the decision, under the same lock.
                self._apply(session, deposit, route, self._call(lambda: route.start(order)), now)
                return deposit.status
            deposit.settle_phase = PHASE_STARTING
            attempt = deposit.settle_attempts
        outcome = self._call(lambda: route.start(order))
        return self._record(
            deposit_id,
            route,
            outcome,
            lambda d: d.settle_phase == PHASE_STARTING and d.settle_attempts == attempt,
        )

    def _decide(self, session: Session, deposit: Deposit, now: datetime) -> CreditOrder | None:
        """Apply the rules that may end a deposit before paying; else the credit to pay."""
        if deposit.sandbox_outcome == "failed":
            self._move(session, deposit, states.FAILED, now, failure_reason=states.REASON_SANDBOX)
            return None
        if deposit.sandbox_outcome == "manual_review":
            self._review(session, deposit, now, states.REVIEW_SANDBOX)
            return None
        chain = self.registry.get(deposit.chain_id)
        if chain is None or deposit.asset is None:
            self._review(session, deposit, now, states.REVIEW_UNSUPPORTED_TOKEN)
            return None
        if deposit.amount_usd is None:
            self._review(session, deposit, now, states.REVIEW_NO_PRICE)
            return None
        # The fee is the chain's live fee at the moment of settlement.
        fee = fee_for(session, chain)
        net = deposit.amount_usd - fee
        deposit.fee_usd = fee
        deposit.net_usd = max(net, Decimal(0))
        if chain.min_deposit_usd is not None and deposit.amount_usd < chain.min_deposit_usd:
            self._move(
                session, deposit, states.FAILED, now, failure_reason=states.REASON_BELOW_MINIMUM
            )
            return None
        if net <= 0:
            self._move(session, deposit, states.FAILED, now, failure_reason=states.REASON_BELOW_FEE)
            return None
        order = self._order(deposit)
        if order is None:
            self._review(session, deposit, now, states.REVIEW_UNSUPPORTED_DESTINATION)
            return None
        deposit.credit_amount = str(order.amount)
        if order.amount <= 0:
            self._move(session, deposit, states.FAILED, now, failure_reason=states.REASON_BELOW_FEE)
            return None
        return order

    def _order(self, deposit: Deposit) -> CreditOrder | None:
        """The credit a deposit pays (None when its destination cannot be paid)."""
        dest_chain = self.registry.get(deposit.dest_chain_id)
        dest_asset = dest_chain.asset_by_token(deposit.dest_token_address) if dest_chain else None
        if dest_chain is None or not dest_chain.is_active or dest_asset is None:
            return None
        if deposit.net_usd is None:
            return None
        if deposit.credit_amount is not None:
            amount = Decimal(deposit.credit_amount)  # decided at the first settlement
        else:
            price = self.prices.usd_price(dest_chain.chain_id, dest_asset.symbol)
            if price is None or price <= 0:
                return None
            amount = token_amount(deposit.net_usd, price, dest_asset.decimals)
        return CreditOrder(
            deposit_id=deposit.id,
            sandbox=deposit.sandbox,
            source_chain_id=deposit.chain_id,
            source_token_address=deposit.token_address,
            dest_chain_id=dest_chain.chain_id,
            dest_address=deposit.dest_address,
            dest_token_address=dest_asset.token_address,
            dest_asset=dest_asset.symbol,
            dest_decimals=dest_asset.decimals,
            amount=amount,
            net_usd=deposit.net_usd,
        )

    @staticmethod
    def _call(fn: Callable[[], Outcome]) -> Outcome:
        try:
            return fn()
        except Exception as exc:  # a payer or provider error is a failed attempt, not a crash
            log.exception("settlement call failed")
            return Failed(f"{type(exc).__name__}: {exc}"[:300])

    def _record(
        self, deposit_id: str, route: Route, outcome: Outcome, expected: Callable[[Deposit], bool]
    ) -> str | None:
        """Record what a payer or provider answered, if the deposit still awaits it."""
        with self.db.transaction() as session:
            deposit = self._lock(session, deposit_id)
            if deposit is None:
                return None
            if not expected(deposit):
                # Resolved meanwhile (ops, or recovery): never overwrite it.
                log.error("late settlement answer for %s ignored: %s", deposit_id, outcome)
                return deposit.status
            self._apply(session, deposit, route, outcome, self.clock())
            return deposit.status

    def _apply(
        self, session: Session, deposit: Deposit, route: Route, outcome: Outcome, now: datetime
    ) -> None:
        deposit.settle_phase = None
        if isinstance(outcome, Credited):
            deposit.inventory_reserved = None  # spent for good
            if deposit.route == ROUTED and not deposit.sandbox:
                self.settlement.provider_succeeded(session, route.name, now)
            self._move(session, deposit, states.CREDITED, now, credit_tx_hash=outcome.tx_hash)
        elif isinstance(outcome, InFlight):
            deposit.provider_ref = outcome.ref
            deposit.next_attempt_at = now + timedelta(seconds=self.settings.poll_s)
            if deposit.status == states.CREDIT_SUBMITTED:
                deposit.updated_at = now
            else:
                self._move(session, deposit, states.CREDIT_SUBMITTED, now)
        else:
            self._route_failed(session, deposit, route, outcome, now)

    def _route_failed(
        self, session: Session, deposit: Deposit, route: Route, outcome: Failed, now: datetime
    ) -> None:
        log.warning("settlement of %s via %s failed: %s", deposit.id, route.name, outcome.reason)
        self.settlement.release(session, deposit, now)
        if deposit.route == ROUTED and not deposit.sandbox:
            self.settlement.provider_failed(session, route.name, outcome.reason, now)
        deposit.failed_providers = [*(deposit.failed_providers or []), route.name]
        deposit.provider_ref = None
        if outcome.final:
            self._move(session, deposit, states.FAILED, now, failure_reason=outcome.reason)
        else:
            self._retry_or_review(session, deposit, now, states.REVIEW_ROUTE_FAILED, outcome.reason)

    def _retry_or_review(
        self, session: Session, deposit: Deposit, now: datetime, review: str, why: str
    ) -> None:
        """Try again later with backoff, or hand to a person after the last attempt."""
        if deposit.settle_attempts >= self.settings.max_settle_attempts:
            self._review(session, deposit, now, f"{review}: {why}")
            return
        delay = self.settings.retry_base_s * 2 ** max(0, deposit.settle_attempts - 1)
        deposit.next_attempt_at = now + timedelta(seconds=delay)
        deposit.updated_at = now

    def _review(self, session: Session, deposit: Deposit, now: datetime, reason: str) -> None:
        self._move(session, deposit, states.MANUAL_REVIEW_REQUIRED, now, review_reason=reason[:500])

    def poll(self, deposit_id: str) -> str | None:
        """Ask the route of an in-flight credit how it is going; record the answer."""
        now = self.clock()
        with self.db.transaction() as session:
            deposit = self._lock(session, deposit_id, skip_locked=True)
            if (
                deposit is None
                or deposit.status != states.CREDIT_SUBMITTED
                or deposit.provider_ref is None
                or deposit.settle_phase is not None
                or not self._due(deposit, now)
            ):
                return None
            route = self.settlement.route_for(deposit)
            order = self._order(deposit)
            if route is None or order is None:
                self._review(session, deposit, now, f"{states.REVIEW_ROUTE_FAILED}: route gone")
                return deposit.status
            ref = deposit.provider_ref
            if route.instant:
                outcome = self._call(lambda: route.poll(order, ref))
                if not (isinstance(outcome, InFlight) and outcome.ref == ref):
                    self._apply(session, deposit, route, outcome, now)
                else:
                    deposit.next_attempt_at = now + timedelta(seconds=self.settings.poll_s)
                return deposit.status
            # Hold other pollers off for a round while this one asks.
            deposit.next_attempt_at = now + timedelta(seconds=max(self.settings.poll_s, 1.0))
        outcome = self._call(lambda: route.poll(order, ref))
        if isinstance(outcome, InFlight) and outcome.ref == ref:
            return states.CREDIT_SUBMITTED
        return self._record(
            deposit_id,
            route,
            outcome,
            lambda d: d.status == states.CREDIT_SUBMITTED and d.provider_ref == ref,
        )

    def recover(self, deposit_id: str) -> str | None:
        """A payer or provider call that never came back (a crash): retry or review."""
        now = self.clock()
        cutoff = now - timedelta(seconds=self.settings.stuck_payment_s)
        with self.db.transaction() as session:
            deposit = self._lock(session, deposit_id, skip_locked=True)
            if deposit is None or deposit.settle_phase is None or deposit.updated_at > cutoff:
                return None
            route = self.settlement.route_for(deposit)
            if route is not None and route.idempotent:
                self.settlement.release(session, deposit, now)
                deposit.settle_phase = None
                deposit.next_attempt_at = None
                deposit.updated_at = now
                return deposit.status
            # It may have paid: only a person can tell without paying twice.
            self._review(session, deposit, now, states.REVIEW_SETTLEMENT_INTERRUPTED)
            return deposit.status

    # --- the worker's queues ------------------------------------------------------------

    def _ids(self, stmt: sa.Select[tuple[str]]) -> list[str]:
        with self.db.reader() as session:
            return list(session.scalars(stmt))

    def due_for_settlement(self, limit: int) -> list[str]:
        now = self.clock()
        return self._ids(
            sa.select(Deposit.id)
            .where(
                sa.or_(
                    Deposit.status == states.SOURCE_CONFIRMED,
                    sa.and_(
                        Deposit.status == states.CREDIT_SUBMITTED, Deposit.provider_ref.is_(None)
                    ),
                ),
                Deposit.settle_phase.is_(None),
                sa.or_(Deposit.next_attempt_at.is_(None), Deposit.next_attempt_at <= now),
            )
            .order_by(Deposit.id)
            .limit(limit)
        )

    def due_for_poll(self, limit: int) -> list[str]:
        now = self.clock()
        return self._ids(
            sa.select(Deposit.id)
            .where(
                Deposit.status == states.CREDIT_SUBMITTED,
                Deposit.provider_ref.is_not(None),
                Deposit.settle_phase.is_(None),
                sa.or_(Deposit.next_attempt_at.is_(None), Deposit.next_attempt_at <= now),
            )
            .order_by(Deposit.id)
            .limit(limit)
        )

    def interrupted(self, limit: int) -> list[str]:
        cutoff = self.clock() - timedelta(seconds=self.settings.stuck_payment_s)
        return self._ids(
            sa.select(Deposit.id)
            .where(
                Deposit.status.in_((states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED)),
                Deposit.settle_phase.is_not(None),
                Deposit.updated_at <= cutoff,
            )
            .order_by(Deposit.id)
            .limit(limit)
        )

    def _detached(self, stmt: sa.Select[tuple[Deposit]]) -> list[Deposit]:
        """Rows read and detached (a reader's rollback would expire them)."""
        with self.db.reader() as session:
            rows = list(session.scalars(stmt))
            session.expunge_all()
            return rows

    def pending_on_chain(self, chain_id: int, limit: int) -> list[Deposit]:
        """Deposits of a chain (not sandbox) waiting for their confirmations."""
        return self._detached(
            sa.select(Deposit)
            .where(
                Deposit.status == states.SOURCE_SEEN,
                Deposit.chain_id == chain_id,
                Deposit.sandbox.is_(False),
            )
            .order_by(Deposit.block_number, Deposit.id)
            .limit(limit)
        )

    def pending_sandbox(self, limit: int) -> list[Deposit]:
        return self._detached(
            sa.select(Deposit)
            .where(Deposit.status == states.SOURCE_SEEN, Deposit.sandbox.is_(True))
            .order_by(Deposit.id)
            .limit(limit)
        )

    # --- ops ------------------------------------------------------------------------------

    def _ops_allowed(self, deposit: Deposit, now: datetime) -> None:
        if states.is_final(deposit.status):
            raise Conflict(f"deposit {deposit.id} is already {deposit.status}")
        if deposit.status == states.MANUAL_REVIEW_REQUIRED:
            return
        quiet = now - deposit.updated_at
        stuck_after = timedelta(seconds=self.settings.ops_stuck_after_s)
        if deposit.settle_phase is not None or quiet < stuck_after:
            raise Conflict(
                f"deposit {deposit.id} is {deposit.status} and the pipeline is working on it; "
                "ops may resolve deposits in manual_review_required, or others after "
                f"{int(stuck_after.total_seconds())} s without progress"
            )

    def ops_credit(
        self, deposit_id: str, tx_hash: str, *, by: str, reason: str | None
    ) -> dict[str, Any]:
        """Ops credited the deposit by hand with `tx_hash` (also days later)."""
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        now = self.clock()
        with self.db.transaction() as session:
            deposit = self._lock(session, deposit_id)
            if deposit is None:
                raise NotFound(f"no deposit {deposit_id}")
            self._ops_allowed(deposit, now)
            if not states.can_transition(deposit.status, states.CREDITED):
                raise Conflict(
                    f"deposit {deposit_id} is {deposit.status}: its source is not confirmed, "
                    "so it cannot be credited (fail it instead, or wait)"
                )
            chain = self.registry.get(deposit.chain_id)
            if deposit.route is None and chain is not None and deposit.amount_usd is not None:
                # Settled now: the fee is the live one at this moment.
                fee = fee_for(session, chain)
                deposit.fee_usd = fee
                deposit.net_usd = max(deposit.amount_usd - fee, Decimal(0))
            self._move(
                session,
                deposit,
                states.CREDITED,
                now,
                credit_tx_hash=tx_hash,
                route=deposit.route or MANUAL,
                ops_by=by,
                ops_reason=reason,
                ops_at=now,
                settle_phase=None,
            )
            return deposit_document(deposit)

    def ops_fail(self, deposit_id: str, reason: str, *, by: str) -> dict[str, Any]:
        """Ops ended the deposit as failed, with `reason` as its failureReason."""
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        now = self.clock()
        with self.db.transaction() as session:
            deposit = self._lock(session, deposit_id)
            if deposit is None:
                raise NotFound(f"no deposit {deposit_id}")
            self._ops_allowed(deposit, now)
            self.settlement.release(session, deposit, now)
            self._move(
                session,
                deposit,
                states.FAILED,
                now,
                failure_reason=reason[:500],
                ops_by=by,
                ops_reason=reason,
                ops_at=now,
            )
            return deposit_document(deposit)

    # --- reading --------------------------------------------------------------------------

    def get(self, session: Session, tenant_id: str, deposit_id: str) -> dict[str, Any]:
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        deposit = session.get(Deposit, deposit_id)
        if deposit is None or deposit.tenant_id != tenant_id:
            raise NotFound(f"no deposit {deposit_id}")
        return deposit_document(deposit)

    @staticmethod
    def list_page(
        session: Session,
        tenant_id: str,
        filters: DepositFilters,
        *,
        limit: int,
        cursor: str | None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of the tenant's deposits, newest first, and the next page's cursor."""
        stmt = sa.select(Deposit).where(Deposit.tenant_id == tenant_id)
        if filters.external_user_id is not None:
            stmt = stmt.where(Deposit.external_user_id == filters.external_user_id)
        if filters.status is not None:
            stmt = stmt.where(Deposit.status == filters.status)
        if filters.chain_id is not None:
            stmt = stmt.where(Deposit.chain_id == filters.chain_id)
        if filters.created_after is not None:
            stmt = stmt.where(Deposit.created_at >= filters.created_after)
        if filters.created_before is not None:
            stmt = stmt.where(Deposit.created_at < filters.created_before)
        after = decode_cursor(cursor)
        if after is not None:
            last = after.get("id")
            if not isinstance(last, str) or not DEPOSIT_ID.match(last):
                raise _invalid("cursor", "not a cursor this API gave out")
            stmt = stmt.where(Deposit.id < last)
        rows: Sequence[Deposit] = session.scalars(
            stmt.order_by(Deposit.id.desc()).limit(limit + 1)
        ).all()
        page = rows[:limit]
        next_cursor = encode_cursor({"id": page[-1].id}) if len(rows) > limit else None
        return [deposit_document(d) for d in page], next_cursor
