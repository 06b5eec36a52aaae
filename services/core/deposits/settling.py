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
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy.orm import Session

from services.core.amounts import token_units
from services.core.chains import Chain, ChainRegistry
from services.core.deposits import (
    gas_pricing,
    incidents,
    payments,
    rules,
    states,
    store,
    transitions,
)
from services.core.deposits.models import Deposit
from services.core.deposits.outcomes import (
    Credited,
    CreditOrder,
    Failed,
    InFlight,
    NeedsReview,
    Outcome,
    PayerWaits,
    Waiting,
)
from services.core.deposits.payout_tag import tag_for
from services.core.deposits.pricing import PriceSource, amount_usd
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import ROUTED, EvmPayer, PayerRoute, Route, Settlement
from services.core.deposits.store import DepositStore
from services.core.fees import fee_for
from shared.db import Database
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

#: `settle_phase` while a payer or provider call is in flight.
PHASE_STARTING = "starting"
#: Statuses a credit is decided, started and polled in: a hot-wallet payment in flight
#: stays `source_confirmed` (no `credit_submitted` for direct and inventory credits); a
#: routed one is `credit_submitted`. `provider_ref` set: in flight.
SETTLEABLE = (states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED)


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
            if (
                deposit is None
                or deposit.settle_phase is not None
                or deposit.provider_ref is not None  # a credit in flight: polled, not started
                or not _due(deposit, now)
            ):
                return None
            if deposit.status not in SETTLEABLE:
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
            paused = self._paused(session, order)
            if paused is not None:
                self._wait(session, deposit, paused, now)
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
            if isinstance(route, PayerRoute) and route.chain_payer is not None:
                order = replace(order, tag=self._tag(deposit))

        def expected(d: Deposit) -> bool:
            return d.settle_phase == PHASE_STARTING and d.settle_attempts == attempt

        payer = route.chain_payer if isinstance(route, PayerRoute) else None
        if payer is not None:
            return self._start_payment(deposit_id, route, payer, order, expected)
        outcome = self._call(lambda: route.start(order))
        return self._record(deposit_id, route, outcome, expected)

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
        peg = None
        if not deposit.sandbox and deposit.asset is not None:
            price = self.prices.usd_price(deposit.chain_id, deposit.asset)
            peg = rules.PegCheck(price, self.settings.peg_band)
            if deposit.amount_usd is None and price is not None and deposit.decimals is not None:
                # Seen while the price source was silent: valued now, by the same rule.
                units = token_units(int(deposit.amount_raw), deposit.decimals)
                deposit.amount_usd = amount_usd(units, price)
        facts = rules.SettlementFacts(
            asset=deposit.asset,
            amount_usd=deposit.amount_usd,
            sandbox_outcome=deposit.sandbox_outcome,
        )
        # The fee is the chain's live fee at the moment of settlement.
        fee = fee_for(session, chain) if chain is not None else Decimal(0)
        payee = self._payee(deposit)
        decision = rules.decide(facts, chain, fee, payee, peg)
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

    @staticmethod
    def _tag(deposit: Deposit) -> bytes:
        """The hot-wallet payout's tag (`payout_tag`); none for an id that is not a ULID
        (only hand-made rows: a payout untagged beats one never paid)."""
        try:
            return tag_for(deposit).encode()
        except ValueError:
            log.error("deposit %s: its id is not a ULID; its payout carries no tag", deposit.id)
            return b""

    def _paused(self, session: Session, order: CreditOrder) -> Waiting | None:
        """Why the destination chain's hot wallet may not pay now (an open incident that
        pauses it: a nonce gap until a person resolves it); None when it may."""
        if order.sandbox or not isinstance(
            self.settlement.payers.get(order.dest_chain_id), EvmPayer
        ):
            return None
        incident = incidents.pausing(session, order.dest_chain_id)
        if incident is None:
            return None
        return Waiting(
            states.WAIT_PAYMENTS_PAUSED,
            f"payments on chain {order.dest_chain_id} are paused by chain incident "
            f"{incident.id} ({incident.kind}) until it is resolved",
        )

    def _wait(self, session: Session, deposit: Deposit, waiting: Waiting, now: datetime) -> None:
        """The deposit waits, saying why, and is tried again by itself; a short hot
        wallet's wait is bounded (SETTLE_HOT_WALLET_WAIT_S), then a person is asked."""
        started = deposit.wait_reason != waiting.reason
        if started:
            (log.error if waiting.reason == states.WAIT_FEE_CAP else log.warning)(
                "%sdeposit %s waits (%s): %s",
                "ALERT " if waiting.reason == states.WAIT_FEE_CAP else "",
                deposit.id,
                waiting.reason,
                waiting.detail,
            )
        if started or deposit.waiting_since is None:
            deposit.waiting_since = now  # the bound counts from when this reason began
        deposit.wait_reason = waiting.reason
        deposit.updated_at = now
        if waiting.shortfall is not None:
            self.settlement.hot_wallet_short(session, waiting.shortfall, now)
        waited = (now - deposit.waiting_since).total_seconds()
        if (
            waiting.reason == states.WAIT_HOT_WALLET_SHORT
            and waited >= self.settings.hot_wallet_wait_s
        ):
            transitions.review(session, deposit, now, states.REVIEW_HOT_WALLET_SHORT)
            return
        deposit.next_attempt_at = now + timedelta(seconds=self.settings.wait_retry_s)

    # --- recording answers ----------------------------------------------------------------

    @staticmethod
    def _call(fn: Callable[[], Outcome]) -> Outcome:
        try:
            return fn()
        except Exception as exc:  # a payer or provider error is a failed attempt, not a crash
            log.exception("settlement call failed")
            return Failed(f"{type(exc).__name__}: {exc}"[:300])

    def _record(
        self,
        deposit_id: str,
        route: Route,
        outcome: Outcome,
        expected: Callable[[Deposit], bool],
        *,
        payment_outcome: str | None = None,
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
            self._apply(
                session, deposit, route, outcome, self.clock(), payment_outcome=payment_outcome
            )
            return deposit.status

    def _apply(
        self,
        session: Session,
        deposit: Deposit,
        route: Route,
        outcome: Outcome,
        now: datetime,
        *,
        payment_outcome: str | None = None,
    ) -> None:
        deposit.settle_phase = None
        if isinstance(outcome, Waiting):
            # Nothing was signed: the route's hold is given back, and no attempt spent.
            self.settlement.release(session, deposit, now)
            deposit.provider_ref = None
            deposit.settle_attempts = max(0, deposit.settle_attempts - 1)
            self._wait(session, deposit, outcome, now)
            return
        deposit.wait_reason = None
        deposit.waiting_since = None
        if not isinstance(outcome, InFlight) and payments.is_payment_ref(deposit.provider_ref):
            payments.resolve(
                session,
                deposit.id,
                payment_outcome
                or (payments.MINED if isinstance(outcome, Credited) else payments.FAILED),
                now,
            )
        if isinstance(outcome, NeedsReview):
            self.settlement.release(session, deposit, now)
            deposit.provider_ref = None
            transitions.review(session, deposit, now, outcome.reason)
        elif isinstance(outcome, Credited):
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
        """Ask the route of an in-flight credit how it is going; record the answer.

        Returns the status it ended in, `credit_submitted` for a routed credit still in
        flight, None when there was nothing to do or a hot-wallet payment is still in
        flight (the worker counts neither as work)."""
        now = self.clock()
        payer: EvmPayer | None = None
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id, skip_locked=True)
            if (
                deposit is None
                or deposit.status not in SETTLEABLE
                or deposit.provider_ref is None
                or deposit.settle_phase is not None
                or not _due(deposit, now)
            ):
                return None
            route = self.settlement.route_for(deposit)
            order = self._order(deposit)
            if route is None or order is None:
                if payments.open_payment(session, deposit.id) is not None:
                    # A signed payment may still be mined: never abandon it because this
                    # worker cannot watch it (no hot-wallet key or RPC URL here, or its
                    # chain paused). Review would stop every poll, re-send and
                    # replacement, and its nonce would then block every later payment.
                    log.warning(
                        "deposit %s: its hot-wallet payment is in flight but this worker "
                        "has no payer for chain %s; leaving it to one that has",
                        deposit.id,
                        deposit.dest_chain_id,
                    )
                    deposit.next_attempt_at = now + timedelta(seconds=self.settings.poll_s)
                    return None
                transitions.review(
                    session, deposit, now, f"{states.REVIEW_ROUTE_FAILED}: route gone"
                )
                return deposit.status
            ref = deposit.provider_ref
            payer = route.chain_payer if isinstance(route, PayerRoute) else None
            if payer is not None:
                payment = payments.open_payment(session, deposit.id)
                if payment is None or payment.ref != ref:
                    transitions.review(
                        session, deposit, now, f"{states.REVIEW_ROUTE_FAILED}: payment record gone"
                    )
                    return deposit.status
                view = payments.PaymentView.of(payment)
                dest_chain = self.registry.get(deposit.dest_chain_id)
                assert dest_chain is not None  # route_for found its payer
                # Observing is read-only and a replacement re-checks what it replaces,
                # so a second poller is harmless: no hold beyond the poll interval.
                deposit.next_attempt_at = now + timedelta(seconds=self.settings.poll_s)
            elif route.instant:
                outcome = self._call(lambda: route.poll(order, ref))
                if not (isinstance(outcome, InFlight) and outcome.ref == ref):
                    self._apply(session, deposit, route, outcome, now)
                else:
                    deposit.next_attempt_at = now + timedelta(seconds=self.settings.poll_s)
                return deposit.status
            else:
                # Hold other pollers off for a round while this one asks.
                deposit.next_attempt_at = now + timedelta(seconds=max(self.settings.poll_s, 1.0))
        if payer is not None:
            return self._poll_payment(deposit_id, route, payer, view, dest_chain)
        outcome = self._call(lambda: route.poll(order, ref))
        if isinstance(outcome, InFlight) and outcome.ref == ref:
            return states.CREDIT_SUBMITTED
        return self._record(
            deposit_id,
            route,
            outcome,
            lambda d: d.status == states.CREDIT_SUBMITTED and d.provider_ref == ref,
        )

    # --- hot-wallet payments (idempotent by nonce: deposits/payments.py) -------------------

    def _start_payment(
        self,
        deposit_id: str,
        route: Route,
        payer: EvmPayer,
        order: CreditOrder,
        expected: Callable[[Deposit], bool],
    ) -> str | None:
        """Draft, then allocate the nonce, sign and store in one transaction, then broadcast."""
        dest_chain = self.registry.get(order.dest_chain_id)
        cap = gas_pricing.cap_wei(self.settings.fee_cap_gwei(dest_chain))
        try:
            draft = payer.draft(order, cap)
        except PayerWaits as waits:  # short of funds, over the cap, chain not checked
            return self._record(deposit_id, route, waits.waiting, expected)
        except Exception as exc:  # nothing was signed: a plain failed attempt
            log.exception("drafting the credit of %s failed", deposit_id)
            return self._record(
                deposit_id, route, Failed(f"{type(exc).__name__}: {exc}"[:300]), expected
            )
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id)
            if deposit is None or not expected(deposit):
                log.error("payment draft for %s dropped: the deposit moved meanwhile", deposit_id)
                return None if deposit is None else deposit.status
            now = self.clock()
            try:
                nonce = payments.allocate_nonce(
                    session, order.dest_chain_id, payer.wallet, draft.pending_nonce, now
                )
            except payments.NonceGap as gap:
                incidents.raise_nonce_gap(session, gap, draft.head, now)
                self._apply(
                    session, deposit, route, Waiting(states.WAIT_PAYMENTS_PAUSED, str(gap)), now
                )
                return deposit.status
            signed = payer.sign(draft.tx, nonce)
            payment = payments.record(
                session,
                deposit,
                order.dest_chain_id,
                payer.wallet,
                nonce,
                draft.tx,
                signed.raw,
                signed.hash,
                draft.head,
                now,
            )
            # The status stays (`source_confirmed`): a direct or inventory credit emits
            # no `credit_submitted` (DESIGN.md); `provider_ref` marks it in flight.
            deposit.settle_phase = None
            deposit.provider_ref = payment.ref
            deposit.next_attempt_at = now + timedelta(seconds=self.settings.poll_s)
            deposit.wait_reason = None
            deposit.waiting_since = None
            deposit.updated_at = now
            # The draft found the token and the gas there: a dip under them is over.
            self.settlement.hot_wallet_sufficient(
                session, order.dest_chain_id, order.dest_token_address
            )
            status = deposit.status
        # Only now that it is stored: from here on a crash or an error leaves a payment
        # its poll finds (and broadcasts again), never one signed anew.
        log.info("deposit %s: paying with nonce %s, tx %s", deposit_id, nonce, signed.hash)
        payer.broadcast(signed.raw)
        return status

    def _poll_payment(
        self,
        deposit_id: str,
        route: Route,
        payer: EvmPayer,
        payment: payments.PaymentView,
        chain: Chain,
    ) -> str | None:
        """Judge an in-flight payment at the destination chain's finality; record its end,
        or cancel, replace or re-broadcast it."""
        try:
            observation = payer.observe(payment, chain)
        except Exception as exc:  # unknown: it may be mined; ask again next round
            log.warning(
                "payment of %s: no answer from the node (%s: %s)",
                deposit_id,
                type(exc).__name__,
                exc,
            )
            self._alert_if_old(payment)
            return None
        verdict = payments.judge(observation, payment, self.settings.payment_replace_blocks)
        if not isinstance(verdict, InFlight | payments.Replace):
            return self._end_payment(deposit_id, route, payment, verdict)
        self._alert_if_old(payment)
        if payment.cancel_reason is not None:
            if payment.cancel_tx_hash is None and observation.mined is None:
                self._cancel(deposit_id, payer, payment)
            elif not observation.known:
                payer.broadcast(payment.cancel_raw_tx or payment.raw_tx)
            return None
        if isinstance(verdict, payments.Replace) and self._replace(
            deposit_id, payer, payment, observation.head, chain
        ):
            return None
        if not observation.known:
            # The node lost it (dropped from its pool, or a reorg took the block): the
            # same bytes again, so it can only ever be mined once.
            log.warning("payment of %s unknown to the node: broadcast again", deposit_id)
            payer.broadcast(payment.raw_tx)
        return None

    def _end_payment(
        self,
        deposit_id: str,
        route: Route,
        payment: payments.PaymentView,
        verdict: Credited | Failed | NeedsReview | payments.Cancelled,
    ) -> str | None:
        """Record how a payment ended. One being cancelled (its deposit's transfer left the
        chain) that did not pay goes to a person, never to a new payment."""
        outcome: Outcome
        payment_outcome = None
        if isinstance(verdict, payments.Cancelled):
            outcome = NeedsReview(
                f"{states.REVIEW_SOURCE_REORGED}: its transfer left the chain; the payout was "
                f"cancelled by {verdict.tx_hash}"
            )
            payment_outcome = payments.CANCELLED
        elif payment.cancel_reason is not None and not isinstance(verdict, Credited):
            why = verdict.reason
            outcome = NeedsReview(f"{states.REVIEW_SOURCE_REORGED}: {payment.cancel_reason}; {why}")
        else:
            outcome = verdict
        ref = payment.ref
        return self._record(
            deposit_id,
            route,
            outcome,
            lambda d: d.status in SETTLEABLE and d.provider_ref == ref,
            payment_outcome=payment_outcome,
        )

    def _cancel(self, deposit_id: str, payer: EvmPayer, payment: payments.PaymentView) -> None:
        """Sign the payout's cancel (its nonce, zero value, to the wallet itself), store it,
        then broadcast it."""
        try:
            signed = payer.sign_cancel(payment.tx, payment.nonce)
        except Exception as exc:  # unknown market: try next round
            log.warning("payment of %s: could not price its cancel (%s)", deposit_id, exc)
            return
        with self.db.transaction() as session:
            if not payments.cancel_signed(
                session, payment.id, signed.raw, signed.hash, self.clock()
            ):
                return
        log.critical(
            "payment of %s cancelled by %s (nonce %s): %s",
            deposit_id,
            signed.hash,
            payment.nonce,
            payment.cancel_reason,
        )
        payer.broadcast(signed.raw)

    def _replace(
        self,
        deposit_id: str,
        payer: EvmPayer,
        payment: payments.PaymentView,
        head: int,
        chain: Chain,
    ) -> bool:
        """Same nonce and calldata, priced from the market: stored first, then broadcast;
        or held back (the market asks no more than it offers; the cap, the most
        replacements: alerting once). True when a replacement was sent."""
        try:
            market = payer.market()
        except Exception as exc:
            log.warning("payment of %s: could not price a replacement (%s)", deposit_id, exc)
            return False
        decision = gas_pricing.reprice(
            payment.tx,
            market,
            gas_pricing.cap_wei(self.settings.fee_cap_gwei(chain)),
            payment.replacements,
            self.settings.payment_max_replacements,
        )
        if decision is None or isinstance(decision, gas_pricing.Stall):
            stall = None if decision is None else decision.reason
            with self.db.transaction() as session:
                changed = payments.mark_stalled(session, payment.id, stall, self.clock())
            if changed and isinstance(decision, gas_pricing.Stall):
                log.error(
                    "ALERT hot-wallet payment of %s not replaced (nonce %s, %s): %s; it waits "
                    "as it is (raise the cap, or cancel the nonce)",
                    deposit_id,
                    payment.nonce,
                    decision.reason,
                    decision.detail,
                )
            return False
        signed = payer.sign(decision, payment.nonce)
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id)
            if deposit is None or deposit.provider_ref != payment.ref:
                return False
            current = payments.open_payment(session, deposit_id)
            if (
                current is None
                or list(current.tx_hashes) != list(payment.tx_hashes)
                or current.cancel_reason is not None
            ):
                return False  # another worker replaced it, or it is being cancelled
            payments.replaced(
                session, payment.id, decision, signed.raw, signed.hash, head, self.clock()
            )
        log.warning(
            "payment of %s not mined after %s blocks: replaced by %s at %s wei per gas (nonce %s)",
            deposit_id,
            self.settings.payment_replace_blocks,
            signed.hash,
            gas_pricing.offered(decision),
            payment.nonce,
        )
        payer.broadcast(signed.raw)
        return True

    def _alert_if_old(self, payment: payments.PaymentView) -> None:
        now = self.clock()
        age = (now - payment.created_at).total_seconds()
        if payment.alerted or age < self.settings.payment_alert_s:
            return
        # Once per payment; settle_hot_wallet_payment_oldest_seconds shows it all along.
        log.error(
            "ALERT hot-wallet payment of %s in flight for %d s (nonce %s, transactions %s)",
            payment.deposit_id,
            age,
            payment.nonce,
            ", ".join(payment.tx_hashes),
        )
        with self.db.transaction() as session:
            payments.mark_alerted(session, payment.id, now)

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
