"""Settling: decide a confirmed deposit's credit, pay it, poll it, recover it.

Each step locks the deposit's row (`FOR UPDATE SKIP LOCKED`), so a step that runs twice
(two workers, a retry) finds the deposit already moved and does nothing. Calls to payers
and route providers happen between transactions: the deposit is marked (`settle_phase`)
before the call and the answer is recorded after it, so a crash in the middle is
noticed (and never paid twice).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy.orm import Session

from services.core.chains import ChainRegistry
from services.core.deposits import rules, states, store, transitions
from services.core.deposits.models import Deposit
from services.core.deposits.pricing import PriceSource
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import (
    ROUTED,
    Credited,
    CreditOrder,
    Failed,
    InFlight,
    Outcome,
    Route,
    Settlement,
)
from services.core.deposits.store import DepositStore
from services.core.fees import fee_for
from shared.db import Database
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

#: `settle_phase` while a payer or provider call is in flight.
PHASE_STARTING = "starting"


def _due(deposit: Deposit, now: datetime) -> bool:
    return deposit.next_attempt_at is None or deposit.next_attempt_at <= now


class Settling:
    """The settlement steps the worker runs for each due deposit."""

    def __init__(
        self,
        db: Database,
        registry: ChainRegistry,
        settlement: Settlement,
        prices: PriceSource,
        settings: PipelineSettings,
        *,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.registry = registry
        self.settlement = settlement
        self.prices = prices
        self.settings = settings
        self.clock = clock
        self.store = DepositStore(db)

    # --- deciding and starting a credit ---------------------------------------------------

    def settle(self, deposit_id: str, *, skip_locked: bool = True) -> str | None:
        """Credit a confirmed deposit (or one whose route failed and waits for another).

        Returns the status it ended the step in, or None when there was nothing to do.
        """
        now = self.clock()
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id, skip_locked=skip_locked)
            if deposit is None or deposit.settle_phase is not None or not _due(deposit, now):
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
                    transitions.review(session, deposit, now, states.REVIEW_UNSUPPORTED_DESTINATION)
            if order is None:
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

    def _payee(self, deposit: Deposit) -> rules.Payee | None:
        """The destination's asset and price (None when the destination cannot be paid)."""
        dest_chain = self.registry.get(deposit.dest_chain_id)
        dest_asset = dest_chain.asset_by_token(deposit.dest_token_address) if dest_chain else None
        if dest_chain is None or not dest_chain.is_active or dest_asset is None:
            return None
        price = self.prices.usd_price(dest_chain.chain_id, dest_asset.symbol)
        return rules.Payee(dest_chain, dest_asset, price)

    def _decide(self, session: Session, deposit: Deposit, now: datetime) -> CreditOrder | None:
        """Apply the settlement rules; the credit to pay, or None when the deposit ended."""
        chain = self.registry.get(deposit.chain_id)
        facts = rules.SettlementFacts(
            asset=deposit.asset,
            amount_usd=deposit.amount_usd,
            sandbox_outcome=deposit.sandbox_outcome,
        )
        # The fee is the chain's live fee at the moment of settlement.
        fee = fee_for(session, chain) if chain is not None else Decimal(0)
        payee = self._payee(deposit)
        decision = rules.decide(facts, chain, fee, payee)
        if decision.fee_usd is not None:
            deposit.fee_usd = decision.fee_usd
            deposit.net_usd = decision.net_usd
        if isinstance(decision, rules.Fail):
            transitions.move(session, deposit, states.FAILED, now, failure_reason=decision.reason)
            return None
        if isinstance(decision, rules.Review):
            transitions.review(session, deposit, now, decision.reason)
            return None
        assert payee is not None
        deposit.credit_amount = str(decision.amount)
        return self._credit_order(deposit, payee, decision.amount)

    def _order(self, deposit: Deposit) -> CreditOrder | None:
        """The credit decided at the first settlement (None when it can no longer be paid)."""
        payee = self._payee(deposit)
        if payee is None or deposit.credit_amount is None or deposit.net_usd is None:
            return None
        return self._credit_order(deposit, payee, Decimal(deposit.credit_amount))

    @staticmethod
    def _credit_order(deposit: Deposit, payee: rules.Payee, amount: Decimal) -> CreditOrder:
        assert deposit.net_usd is not None
        return CreditOrder(
            deposit_id=deposit.id,
            sandbox=deposit.sandbox,
            source_chain_id=deposit.chain_id,
            source_token_address=deposit.token_address,
            dest_chain_id=payee.chain.chain_id,
            dest_address=deposit.dest_address,
            dest_token_address=payee.asset.token_address,
            dest_asset=payee.asset.symbol,
            dest_decimals=payee.asset.decimals,
            amount=amount,
            net_usd=deposit.net_usd,
        )

    # --- recording answers ----------------------------------------------------------------

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
            deposit = store.lock(session, deposit_id)
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
            transitions.move(session, deposit, states.CREDITED, now, credit_tx_hash=outcome.tx_hash)
        elif isinstance(outcome, InFlight):
            deposit.provider_ref = outcome.ref
            deposit.next_attempt_at = now + timedelta(seconds=self.settings.poll_s)
            if deposit.status == states.CREDIT_SUBMITTED:
                deposit.updated_at = now
            else:
                transitions.move(session, deposit, states.CREDIT_SUBMITTED, now)
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
            transitions.move(session, deposit, states.FAILED, now, failure_reason=outcome.reason)
        else:
            self._retry_or_review(session, deposit, now, states.REVIEW_ROUTE_FAILED, outcome.reason)

    def _retry_or_review(
        self, session: Session, deposit: Deposit, now: datetime, review: str, why: str
    ) -> None:
        """Try again later with backoff, or hand to a person after the last attempt."""
        delay = rules.retry_delay(
            deposit.settle_attempts, self.settings.max_settle_attempts, self.settings.retry_base_s
        )
        if delay is None:
            transitions.review(session, deposit, now, f"{review}: {why}")
            return
        deposit.next_attempt_at = now + delay
        deposit.updated_at = now

    # --- in-flight credits ----------------------------------------------------------------

    def poll(self, deposit_id: str) -> str | None:
        """Ask the route of an in-flight credit how it is going; record the answer."""
        now = self.clock()
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id, skip_locked=True)
            if (
                deposit is None
                or deposit.status != states.CREDIT_SUBMITTED
                or deposit.provider_ref is None
                or deposit.settle_phase is not None
                or not _due(deposit, now)
            ):
                return None
            route = self.settlement.route_for(deposit)
            order = self._order(deposit)
            if route is None or order is None:
                transitions.review(
                    session, deposit, now, f"{states.REVIEW_ROUTE_FAILED}: route gone"
                )
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
            deposit = store.lock(session, deposit_id, skip_locked=True)
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
            transitions.review(session, deposit, now, states.REVIEW_SETTLEMENT_INTERRUPTED)
            return deposit.status

    def stuck_cutoff(self) -> datetime:
        """In-flight calls marked before this moment are taken as interrupted."""
        return self.clock() - timedelta(seconds=self.settings.stuck_payment_s)
