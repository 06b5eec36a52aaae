"""Ops resolve a deposit by hand (`settle deposits credit|fail`), recording who and why,
or put one in manual review back into settlement (`settle deposits retry`).

Allowed for deposits in manual review at any time, for deposits waiting (`waitReason`:
nothing in flight), and for others only after SETTLE_OPS_STUCK_AFTER_S without progress
and with no payment in flight (the rule is `rules.ops_refusal`). A late transition is
emitted as its durable event like any other.

Whatever the status, a deposit with a hot-wallet payment that may still be mined is
refused (a manual payment plus the late original would pay twice): unless `--tx` is
one of that payment's transactions, or the chain shows it can no longer be mined (the
wallet's nonce at the destination chain's depth has passed it, with no receipt of ours).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy.orm import Session

from services.core.chains import ChainRegistry
from services.core.deposits import payments, rules, states, store, transitions
from services.core.deposits.models import Deposit, HotWalletPayment
from services.core.deposits.queries import DEPOSIT_ID
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import MANUAL, EvmPayer, Settlement
from services.core.fees import fee_for
from shared.audit.log import Actor, Change, record
from shared.db import Database
from shared.errors import Conflict, NotFound
from shared.timefmt import utcnow

Clock = Callable[[], datetime]


class Ops:
    """Manual credits, failures and retries, each recorded in the tenant's audit log
    (actor `ops`).

    `audit_log`: the identity database when it is not `db` (None: the same database, so
    the entry commits with the change).
    """

    def __init__(
        self,
        db: Database,
        registry: ChainRegistry,
        settlement: Settlement,
        settings: PipelineSettings,
        *,
        clock: Clock = utcnow,
        audit_log: Database | None = None,
    ) -> None:
        self.db = db
        self.audit_log = audit_log
        self.registry = registry
        self.settlement = settlement
        self.settings = settings
        self.clock = clock

    @contextmanager
    def _locked(self, deposit_id: str) -> Iterator[tuple[Session, Deposit]]:
        """A transaction holding the deposit's row lock; NotFound for no such deposit."""
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id)
            if deposit is None:
                raise NotFound(f"no deposit {deposit_id}")
            yield session, deposit

    def _allowed(self, deposit: Deposit, now: datetime) -> None:
        refusal = rules.ops_refusal(
            deposit.id,
            deposit.status,
            payment_in_flight=deposit.settle_phase is not None,
            waiting=deposit.wait_reason is not None and deposit.provider_ref is None,
            updated_at=deposit.updated_at,
            now=now,
            stuck_after_s=self.settings.ops_stuck_after_s,
        )
        if refusal is not None:
            raise Conflict(refusal)

    def _payment_allows(self, session: Session, deposit: Deposit, tx_hash: str | None) -> None:
        """Refuse while the deposit's hot-wallet payment may still be mined."""
        payment = payments.open_payment(session, deposit.id)
        if payment is None:
            return
        if tx_hash is not None and tx_hash in payment.tx_hashes:
            # Its own transaction: credited by hand only once the chain shows it paid,
            # else the deposit would read credited while the payment can still fail.
            unpaid = self._not_paid_by(deposit, payment, tx_hash)
            if unpaid is None:
                return
            raise Conflict(
                f"deposit {deposit.id}: {tx_hash} is its hot-wallet payment's transaction, "
                f"but {unpaid}. Wait for the worker to settle it: it credits the deposit "
                "itself once the transaction is as deep as the chain's confirmations"
            )
        why = self._still_minable(deposit, payment)
        if why is None:
            return
        hashes = ", ".join(payment.tx_hashes)
        chain = deposit.dest_chain_id
        raise Conflict(
            f"deposit {deposit.id} has a hot-wallet payment that may still be mined "
            f"(nonce {payment.nonce} on chain {chain}, transactions {hashes}): {why}. "
            "Wait for the worker to settle it. If one of its transactions paid, credit "
            f"with --tx {payment.tx_hashes[-1]} (or another of them). To fail the deposit "
            f"or credit it with --tx <another transaction>, first use nonce {payment.nonce} "
            "(e.g. a 0-value transfer from the hot wallet to itself with that nonce and "
            "higher fees) and wait until it is as deep as the chain's confirmations"
        )

    def _observe(
        self, deposit: Deposit, payment: HotWalletPayment
    ) -> tuple[payments.Observation, int] | str:
        """(what the chain says of the payment, the chain's depth), or why it cannot be asked."""
        payer = self.settlement.payers.get(deposit.dest_chain_id)
        chain = self.registry.get(deposit.dest_chain_id)
        if not isinstance(payer, EvmPayer) or chain is None:
            return (
                f"there is no node to check it (SETTLE_RPC_URL_{deposit.dest_chain_id} and "
                "SETTLE_HOT_WALLET_KEY are not both set here)"
            )
        try:
            seen = payer.observe(payments.PaymentView.of(payment), chain)
        except Exception as exc:  # cannot prove anything: refuse
            return f"the node could not be asked ({type(exc).__name__}: {exc})"[:300]
        return seen, chain.confirmations

    def _still_minable(self, deposit: Deposit, payment: HotWalletPayment) -> str | None:
        """Why the payment may still be mined; None when the chain shows it cannot be."""
        observed = self._observe(deposit, payment)
        if isinstance(observed, str):
            return observed
        seen, depth = observed
        if seen.mined is not None:
            mined = seen.mined
            return (
                f"transaction {mined.tx_hash} is mined (status {mined.status}, "
                f"{seen.confirmations()} of {depth} confirmations"
                + (")" if mined.final else ", not final yet)")
            )
        if seen.nonce_used:
            return None
        return "it is not mined, and the wallet's nonce has not passed it"

    def _not_paid_by(self, deposit: Deposit, payment: HotWalletPayment, tx_hash: str) -> str | None:
        """Why `tx_hash` is not (yet) proof of payment; None when it is mined, succeeded, deep."""
        observed = self._observe(deposit, payment)
        if isinstance(observed, str):
            return observed
        seen, depth = observed
        mined = seen.mined
        if mined is None:
            return "it is not mined"
        if mined.tx_hash != tx_hash:
            return f"the payment's mined transaction is {mined.tx_hash}"
        if mined.status != 1:
            return "it reverted (status 0)"
        if not mined.final:
            return (
                f"it has {seen.confirmations()} confirmations and is not final yet (the "
                f"chain's {depth} confirmations, and its finalized block where it has one)"
            )
        _, _, amount = payments.PaymentView.of(payment).transfer()
        if mined.transferred != amount:
            return f"its Transfer logs moved {mined.transferred} of {amount} base units"
        return None

    def credit(self, deposit_id: str, tx_hash: str, *, by: str, reason: str | None) -> Deposit:
        """Ops credited the deposit by hand with `tx_hash` (also days later)."""
        now = self.clock()
        with self._locked(deposit_id) as (session, deposit):
            self._allowed(deposit, now)
            self._payment_allows(session, deposit, tx_hash)
            before = {"status": deposit.status}
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
                deposit.net_usd = rules.net_usd(deposit.amount_usd, fee)
            payments.resolve(session, deposit.id, payments.OPS, now)
            transitions.move(
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
            after = {"status": deposit.status, "creditTxHash": tx_hash, "reason": reason}
            change = Change("deposit.credited_by_ops", "deposit", deposit.id, before, after)
            record(session, deposit.tenant_id, change, Actor.ops(by), log=self.audit_log)
            return deposit

    def retry(self, deposit_id: str, *, by: str, reason: str | None) -> Deposit:
        """Put a deposit in manual review back into settlement: the pipeline settles it
        afresh (the fee and net decided at its first settlement stay). Refused where
        settling it again could pay twice or cannot work; those are credited or failed
        by hand."""
        now = self.clock()
        with self._locked(deposit_id) as (session, deposit):
            if deposit.status != states.MANUAL_REVIEW_REQUIRED:
                raise Conflict(
                    f"deposit {deposit_id} is {deposit.status}: only a deposit in "
                    "manual_review_required can be put back into settlement"
                )
            why_not = rules.retry_refusal(deposit.review_reason or "")
            if why_not is not None:
                raise Conflict(f"deposit {deposit_id} cannot be retried: {why_not}")
            if payments.open_payment(session, deposit.id) is not None:
                raise Conflict(
                    f"deposit {deposit_id} has a hot-wallet payment that is not settled: "
                    "credit or fail it (settle deposits credit|fail)"
                )
            before = {"status": deposit.status, "reviewReason": deposit.review_reason}
            transitions.back_to_settlement(
                session, deposit, now, ops_by=by, ops_reason=reason, ops_at=now
            )
            after = {"status": deposit.status, "reason": reason}
            change = Change("deposit.retried_by_ops", "deposit", deposit.id, before, after)
            record(session, deposit.tenant_id, change, Actor.ops(by), log=self.audit_log)
            return deposit

    def fail(self, deposit_id: str, reason: str, *, by: str) -> Deposit:
        """Ops ended the deposit as failed, with `reason` as its failureReason."""
        now = self.clock()
        with self._locked(deposit_id) as (session, deposit):
            self._allowed(deposit, now)
            self._payment_allows(session, deposit, None)
            before = {"status": deposit.status}
            payments.resolve(session, deposit.id, payments.OPS, now)
            self.settlement.release(session, deposit, now)
            transitions.move(
                session,
                deposit,
                states.FAILED,
                now,
                failure_reason=reason[:500],
                ops_by=by,
                ops_reason=reason,
                ops_at=now,
            )
            after = {"status": deposit.status, "failureReason": deposit.failure_reason}
            change = Change("deposit.failed_by_ops", "deposit", deposit.id, before, after)
            record(session, deposit.tenant_id, change, Actor.ops(by), log=self.audit_log)
            return deposit
