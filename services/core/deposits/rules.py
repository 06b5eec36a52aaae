"""The settlement rules: pure decisions about a deposit, no database, no clock, no I/O.

The use cases read what these functions need (the deposit's figures, the chain, the
live fee, prices), call them, and write what they decide. So every rule here is
unit-tested on plain values (tests/unit/test_deposit_rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from services.core.chains import Asset, Chain
from services.core.deposits import states
from services.core.deposits.pricing import off_peg, token_amount

#: Outcomes a sandbox deposit can rehearse.
SANDBOX_OUTCOMES = ("credited", "failed", "manual_review")


@dataclass(frozen=True)
class SettlementFacts:
    """What the settlement decision looks at, read from one deposit."""

    asset: str | None
    amount_usd: Decimal | None
    sandbox_outcome: str | None = None


@dataclass(frozen=True)
class Payee:
    """Where a credit lands: the destination chain's asset and its USD price."""

    chain: Chain
    asset: Asset
    price_usd: Decimal | None


@dataclass(frozen=True)
class Fail:
    """End the deposit as `failed` with `reason`."""

    reason: str
    fee_usd: Decimal | None = None
    net_usd: Decimal | None = None


@dataclass(frozen=True)
class Review:
    """Hand the deposit to a person (`manual_review_required`) because of `reason`."""

    reason: str
    fee_usd: Decimal | None = None
    net_usd: Decimal | None = None


@dataclass(frozen=True)
class Pay:
    """Credit `amount` destination token units; `fee_usd` is skimmed, `net_usd` paid."""

    fee_usd: Decimal
    net_usd: Decimal
    amount: Decimal


Decision = Fail | Review | Pay


@dataclass(frozen=True)
class PegCheck:
    """The deposit asset's price now, and how far a dollar stablecoin may be from 1."""

    asset_price: Decimal | None
    band: Decimal


def net_usd(amount_usd: Decimal, fee_usd: Decimal) -> Decimal:
    """What is left to pay after the fee (never below 0)."""
    return max(amount_usd - fee_usd, Decimal(0))


def decide(
    facts: SettlementFacts,
    chain: Chain | None,
    fee_usd: Decimal,
    payee: Payee | None,
    peg: PegCheck | None = None,
) -> Decision:
    """The settlement decision of a confirmed deposit.

    `chain` is the deposit's own chain (None when no longer configured), `fee_usd` the
    chain's live fee now, `payee` the destination's asset and price (None when the
    destination cannot be paid), `peg` the guard (None: not checked, sandbox deposits).
    """
    if facts.sandbox_outcome == "failed":
        return Fail(states.REASON_SANDBOX)
    if facts.sandbox_outcome == "manual_review":
        return Review(states.REVIEW_SANDBOX)
    if chain is None or facts.asset is None:
        return Review(states.REVIEW_UNSUPPORTED_TOKEN)
    if facts.amount_usd is None:
        return Review(states.REVIEW_NO_PRICE)
    if peg is not None:
        # A stablecoin off its peg is not worth a dollar: a person decides, on either
        # side of the credit (what arrived, what would be paid).
        if peg.asset_price is None:
            return Review(states.REVIEW_NO_PRICE)
        if off_peg(facts.asset, peg.asset_price, peg.band):
            return Review(_off_peg(facts.asset, peg.asset_price, peg.band))
        paid = payee.price_usd if payee is not None else None
        if payee is not None and paid is not None and off_peg(payee.asset.symbol, paid, peg.band):
            return Review(_off_peg(payee.asset.symbol, paid, peg.band))
    net = facts.amount_usd - fee_usd
    shown = net_usd(facts.amount_usd, fee_usd)
    if chain.min_deposit_usd is not None and facts.amount_usd < chain.min_deposit_usd:
        # Dust is never paid: no net amount to show (the fee stays, as what it would cost).
        return Fail(states.REASON_BELOW_MINIMUM, fee_usd, None)
    if net <= 0:
        return Fail(states.REASON_BELOW_FEE, fee_usd, shown)
    if payee is None or payee.price_usd is None or payee.price_usd <= 0:
        return Review(states.REVIEW_UNSUPPORTED_DESTINATION, fee_usd, shown)
    amount = token_amount(net, payee.price_usd, payee.asset.decimals)
    if amount <= 0:
        return Fail(states.REASON_BELOW_FEE, fee_usd, shown)
    return Pay(fee_usd, net, amount)


def _off_peg(symbol: str, price: Decimal, band: Decimal) -> str:
    return f"{states.REVIEW_OFF_PEG}: {symbol} at {price} USD (band {(band * 100).normalize():f} %)"


def retry_delay(attempts: int, max_attempts: int, base_s: float) -> timedelta | None:
    """Backoff before the next settlement attempt; None: no attempt left (review)."""
    if attempts >= max_attempts:
        return None
    return timedelta(seconds=base_s * 2 ** max(0, attempts - 1))


def ops_refusal(
    deposit_id: str,
    status: str,
    *,
    payment_in_flight: bool,
    updated_at: datetime,
    now: datetime,
    stuck_after_s: float,
    waiting: bool = False,
) -> str | None:
    """Why ops may not resolve this deposit by hand now; None when they may (in review,
    waiting with nothing in flight, or stuck)."""
    if states.is_final(status):
        return f"deposit {deposit_id} is already {status}"
    if status == states.MANUAL_REVIEW_REQUIRED or (waiting and not payment_in_flight):
        return None
    stuck_after = timedelta(seconds=stuck_after_s)
    if payment_in_flight or now - updated_at < stuck_after:
        return (
            f"deposit {deposit_id} is {status} and the pipeline is working on it; "
            "ops may resolve deposits in manual_review_required, or others after "
            f"{int(stuck_after.total_seconds())} s without progress"
        )
    return None


#: Review reasons `settle deposits retry` refuses, and why: settling again could pay
#: twice, or cannot work. A person credits or fails those by hand.
_NOT_RETRIED = {
    states.REVIEW_SETTLEMENT_INTERRUPTED: "a route provider's call never came back and may "
    "have paid; check it, then credit or fail the deposit",
    states.REVIEW_SOURCE_REORGED: "its transfer left the chain; check it, then credit or fail",
    states.REVIEW_PAYOUT_NOT_TRANSFERRED: "a payout of it was mined; check what it moved, then "
    "credit or fail the deposit",
    states.REVIEW_UNSUPPORTED_TOKEN: "its token is not supported",
    states.REVIEW_SANDBOX: "a sandbox outcome is what it rehearses",
}


def retry_refusal(review_reason: str) -> str | None:
    """Why a deposit in review with this reason may not be put back into settlement."""
    for reason, why in _NOT_RETRIED.items():
        if review_reason == reason or review_reason.startswith(f"{reason}:"):
            return why
    return None
