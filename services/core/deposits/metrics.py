"""What the chain watchers leave for ops to alert on, read from the database at scrape time
(right in any process: the API's /metrics and the core worker's metrics port alike).

- `settle_chain_incidents_open{chain_id,kind}`: open chain incidents. A `deep_reorg` is
  a confirmed or credited deposit whose block left the canonical chain: page someone.
- `settle_watcher_blocks_behind{chain_id,reading}`: how far each reading (`tip`,
  `final`) is behind the head the watcher last saw. A reading stuck while the other
  moves means its ranges are being refused (a logs backend behind, or on a stale fork).
- `settle_deposits_pending_under_final{chain_id}`: deposits still `source_seen` whose
  block is under the finality cursor: the reading at finality passed them without
  confirming them (incomplete logs). Alert on > 0 for more than a few minutes (a reorged
  one is failed `reorged` within a round or two; one on the canonical chain is a bug or a
  provider losing logs, and its money is not credited until someone looks).
- `settle_stray_transfers{chain_id}`: transfers of unknown tokens kept for ops.
- `settle_hot_wallet_payments_in_flight{chain_id}` and
  `settle_hot_wallet_payment_oldest_seconds{chain_id}`: hot-wallet payments signed and
  not yet settled, and the age of the oldest. Alert on the age (e.g. > 600 s): a payment
  that neither lands nor is replaced holds every later credit of that wallet back.
- `settle_payments_waiting_fee_cap{chain_id}`: payouts the market prices over the
  chain's cap (SETTLE_PAYMENT_MAX_FEE_GWEI): in-flight payments whose replacement is held
  back, and deposits whose first payout is not signed. Page on > 0: they wait, they do
  not bid up; raise the cap or wait for the market.
- `settle_payments_replacements_exhausted{chain_id}`: in-flight payments replaced the
  most times allowed (SETTLE_PAYMENT_MAX_REPLACEMENTS) and still not mined. Page on > 0.
- `settle_deposits_waiting{chain_id,reason}`: deposits whose settlement waits and tries
  again by itself (`waitReason`), by destination chain: `hot_wallet_insufficient_balance`
  (top the wallet up), `payments_paused` (an open incident: a nonce gap), `fee_cap`.
- `settle_hot_wallet_short{chain_id,asset}`: 1 while the hot wallet holds too little of a
  token (or of gas: the chain's native symbol) for a payout waiting there.
"""

from __future__ import annotations

from collections.abc import Iterator

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.core.deposits import states
from services.core.deposits.gas_pricing import STALLED_FEE_CAP, STALLED_MAX_REPLACEMENTS
from services.core.deposits.models import (
    OPEN_DEPOSITS,
    ChainCursor,
    ChainIncident,
    Deposit,
    HotWalletPayment,
    HotWalletShortfall,
    StrayTransfer,
)
from shared.db import Database
from shared.timefmt import utcnow


class ChainCollector(Collector):
    """Chain incidents and watcher cursors, from the database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        incidents = GaugeMetricFamily(
            "settle_chain_incidents_open",
            "Open chain incidents (deep_reorg: a confirmed or credited deposit's block left "
            "the canonical chain)",
            labels=["chain_id", "kind"],
        )
        behind = GaugeMetricFamily(
            "settle_watcher_blocks_behind",
            "Blocks between the head a chain watcher last saw and where each reading continues",
            labels=["chain_id", "reading"],
        )
        strays = GaugeMetricFamily(
            "settle_stray_transfers",
            "Transfers of unknown tokens to deposit addresses, kept for ops",
            labels=["chain_id"],
        )
        in_flight = GaugeMetricFamily(
            "settle_hot_wallet_payments_in_flight",
            "Hot-wallet payments signed and not yet settled (mined at depth, or failed)",
            labels=["chain_id"],
        )
        oldest = GaugeMetricFamily(
            "settle_hot_wallet_payment_oldest_seconds",
            "Age of the oldest hot-wallet payment in flight (alert when old)",
            labels=["chain_id"],
        )
        under_final = GaugeMetricFamily(
            "settle_deposits_pending_under_final",
            "Deposits still source_seen whose block is under the finality cursor (the "
            "reading at finality passed them: alert)",
            labels=["chain_id"],
        )
        fee_cap = GaugeMetricFamily(
            "settle_payments_waiting_fee_cap",
            "Payouts the market prices over the chain's cap: payments not replaced, and "
            "deposits whose payout is not signed (they wait: alert)",
            labels=["chain_id"],
        )
        exhausted = GaugeMetricFamily(
            "settle_payments_replacements_exhausted",
            "In-flight payments replaced the most times allowed and still not mined (alert)",
            labels=["chain_id"],
        )
        waiting = GaugeMetricFamily(
            "settle_deposits_waiting",
            "Deposits whose settlement waits and tries again by itself, by destination chain",
            labels=["chain_id", "reason"],
        )
        short = GaugeMetricFamily(
            "settle_hot_wallet_short",
            "1 while the hot wallet holds too little of a token (or of gas) for a payout",
            labels=["chain_id", "asset"],
        )
        now = utcnow()
        capped: dict[int, int] = {}
        with self._db.reader() as session:
            for chain_id, stalled, count in session.execute(
                sa.select(HotWalletPayment.chain_id, HotWalletPayment.stalled, sa.func.count())
                .where(
                    HotWalletPayment.resolved_at.is_(None), HotWalletPayment.stalled.is_not(None)
                )
                .group_by(HotWalletPayment.chain_id, HotWalletPayment.stalled)
            ):
                if stalled == STALLED_FEE_CAP:
                    capped[chain_id] = capped.get(chain_id, 0) + count
                elif stalled == STALLED_MAX_REPLACEMENTS:
                    exhausted.add_metric([str(chain_id)], count)
            for chain_id, reason, count in session.execute(
                sa.select(Deposit.dest_chain_id, Deposit.wait_reason, sa.func.count())
                .where(Deposit.wait_reason.is_not(None), sa.text(OPEN_DEPOSITS))
                .group_by(Deposit.dest_chain_id, Deposit.wait_reason)
            ):
                waiting.add_metric([str(chain_id), reason], count)
                if reason == states.WAIT_FEE_CAP:
                    capped[chain_id] = capped.get(chain_id, 0) + count
            for chain_id, count in capped.items():
                fee_cap.add_metric([str(chain_id)], count)
            for chain_id, asset in session.execute(
                sa.select(HotWalletShortfall.chain_id, HotWalletShortfall.asset)
            ):
                short.add_metric([str(chain_id), asset], 1)
            for chain_id, count, first in session.execute(
                sa.select(
                    HotWalletPayment.chain_id,
                    sa.func.count(),
                    sa.func.min(HotWalletPayment.created_at),
                )
                .where(HotWalletPayment.resolved_at.is_(None))
                .group_by(HotWalletPayment.chain_id)
            ):
                in_flight.add_metric([str(chain_id)], count)
                oldest.add_metric([str(chain_id)], (now - first).total_seconds())
            for chain_id, kind, count in session.execute(
                sa.select(ChainIncident.chain_id, ChainIncident.kind, sa.func.count())
                .where(ChainIncident.resolved_at.is_(None))
                .group_by(ChainIncident.chain_id, ChainIncident.kind)
            ):
                incidents.add_metric([str(chain_id), kind], count)
            for cursor in session.scalars(sa.select(ChainCursor)):
                if cursor.head is None:
                    continue
                final = (
                    cursor.next_block
                    if cursor.confirmed_block is None
                    else (cursor.confirmed_block)
                )
                behind.add_metric(
                    [str(cursor.chain_id), "tip"], cursor.head + 1 - cursor.next_block
                )
                behind.add_metric([str(cursor.chain_id), "final"], cursor.head + 1 - final)
            for chain_id, count in session.execute(
                sa.select(ChainCursor.chain_id, sa.func.count())
                .join(Deposit, Deposit.chain_id == ChainCursor.chain_id)
                .where(
                    Deposit.status == states.SOURCE_SEEN,
                    Deposit.sandbox.is_(False),
                    ChainCursor.confirmed_block.is_not(None),
                    Deposit.block_number < ChainCursor.confirmed_block,
                )
                .group_by(ChainCursor.chain_id)
            ):
                under_final.add_metric([str(chain_id)], count)
            for chain_id, count in session.execute(
                sa.select(StrayTransfer.chain_id, sa.func.count()).group_by(StrayTransfer.chain_id)
            ):
                strays.add_metric([str(chain_id)], count)
        yield incidents
        yield behind
        yield strays
        yield under_final
        yield in_flight
        yield oldest
        yield fee_cap
        yield exhausted
        yield waiting
        yield short


#: Deposits not yet final, as `settle_deposits_pending` reports them.
PENDING_STATUSES = (
    states.SOURCE_SEEN,
    states.SOURCE_CONFIRMED,
    states.CREDIT_SUBMITTED,
    states.MANUAL_REVIEW_REQUIRED,
)


class DepositCollector(Collector):
    """Deposits waiting for their credit (live ones; sandbox deposits move no money), by
    status, and the age of the oldest of each, from the database.

    - `settle_deposits_pending{status}`: `source_seen` (confirming), `source_confirmed`
      and `credit_submitted` (settling), `manual_review_required` (waiting for ops).
    - `settle_deposits_pending_oldest_seconds{status}`: age since detection of the oldest.
      Settling for long (the payments-stuck alert) or any deposit in review means a
      customer's money waits for someone.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pending = GaugeMetricFamily(
            "settle_deposits_pending",
            "Live deposits not yet credited or failed, by status",
            labels=["status"],
        )
        oldest = GaugeMetricFamily(
            "settle_deposits_pending_oldest_seconds",
            "Age since detection of the oldest live deposit in each pending status (0: none)",
            labels=["status"],
        )
        now = utcnow()
        found: dict[str, tuple[int, float]] = {}
        with self._db.reader() as session:
            for status, count, first in session.execute(
                sa.select(Deposit.status, sa.func.count(), sa.func.min(Deposit.created_at))
                .where(
                    sa.text(OPEN_DEPOSITS),  # the open deposits' partial index
                    Deposit.status.in_(PENDING_STATUSES),
                    Deposit.sandbox.is_(False),
                )
                .group_by(Deposit.status)
            ):
                found[status] = (count, max(0.0, (now - first).total_seconds()))
        for status in PENDING_STATUSES:
            count, age = found.get(status, (0, 0.0))
            pending.add_metric([status], count)
            oldest.add_metric([status], age)
        yield pending
        yield oldest
