"""Ops resolve a deposit by hand (`settle deposits credit|fail`), recording who and why.

Allowed for deposits in manual review at any time, and for others only after
SETTLE_OPS_STUCK_AFTER_S without progress and with no payment in flight (the rule is
`rules.ops_refusal`). A late transition is emitted as its durable event like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from services.core.chains import ChainRegistry
from services.core.deposits import rules, states, store, transitions
from services.core.deposits.models import Deposit
from services.core.deposits.queries import DEPOSIT_ID
from services.core.deposits.settings import PipelineSettings
from services.core.deposits.settlement import MANUAL, Settlement
from services.core.fees import fee_for
from shared.db import Database
from shared.errors import Conflict, NotFound
from shared.timefmt import utcnow

Clock = Callable[[], datetime]


class Ops:
    """Manual credits and failures."""

    def __init__(
        self,
        db: Database,
        registry: ChainRegistry,
        settlement: Settlement,
        settings: PipelineSettings,
        *,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.registry = registry
        self.settlement = settlement
        self.settings = settings
        self.clock = clock

    def _allowed(self, deposit: Deposit, now: datetime) -> None:
        refusal = rules.ops_refusal(
            deposit.id,
            deposit.status,
            payment_in_flight=deposit.settle_phase is not None,
            updated_at=deposit.updated_at,
            now=now,
            stuck_after_s=self.settings.ops_stuck_after_s,
        )
        if refusal is not None:
            raise Conflict(refusal)

    def credit(self, deposit_id: str, tx_hash: str, *, by: str, reason: str | None) -> Deposit:
        """Ops credited the deposit by hand with `tx_hash` (also days later)."""
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        now = self.clock()
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id)
            if deposit is None:
                raise NotFound(f"no deposit {deposit_id}")
            self._allowed(deposit, now)
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
            return deposit

    def fail(self, deposit_id: str, reason: str, *, by: str) -> Deposit:
        """Ops ended the deposit as failed, with `reason` as its failureReason."""
        if not DEPOSIT_ID.match(deposit_id):
            raise NotFound(f"no deposit {deposit_id[:60]}")
        now = self.clock()
        with self.db.transaction() as session:
            deposit = store.lock(session, deposit_id)
            if deposit is None:
                raise NotFound(f"no deposit {deposit_id}")
            self._allowed(deposit, now)
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
            return deposit
