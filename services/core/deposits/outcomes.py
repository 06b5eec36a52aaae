"""What a settlement route is asked (`CreditOrder`) and what it answers (`Outcome`).

Plain values below the routes (`settlement.py`) and the hot-wallet payments
(`payments.py`), which both speak them.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class CreditOrder:
    """Pay `amount` of the destination token to the destination, for one deposit."""

    deposit_id: str
    sandbox: bool
    source_chain_id: int
    source_token_address: str
    dest_chain_id: int
    dest_address: str
    dest_token_address: str
    dest_asset: str
    dest_decimals: int
    #: Destination token units (already net of the fee).
    amount: Decimal
    net_usd: Decimal
    #: What a hot-wallet payout appends to its calldata (`payout_tag`): its deposit,
    #: readable from the chain alone.
    tag: bytes = b""

    @property
    def amount_raw(self) -> int:
        return int(self.amount.scaleb(self.dest_decimals))

    @property
    def same_token(self) -> bool:
        return (
            self.source_chain_id == self.dest_chain_id
            and self.source_token_address.lower() == self.dest_token_address.lower()
        )


@dataclass(frozen=True)
class Credited:
    tx_hash: str


@dataclass(frozen=True)
class InFlight:
    ref: str


@dataclass(frozen=True)
class Failed:
    reason: str
    #: True when retrying cannot help (the deposit fails); False: retry or review.
    final: bool = False


@dataclass(frozen=True)
class Shortfall:
    """The hot wallet holds less of a token (or of gas: `token_address` is the zero
    address, `asset` the native symbol) than a payout needs; token units."""

    chain_id: int
    token_address: str
    asset: str
    wallet: str
    balance: Decimal
    needed: Decimal


@dataclass(frozen=True)
class Waiting:
    """The credit cannot be paid now, for a reason that passes by itself: nothing was
    signed, no attempt is spent, the deposit shows `waitReason` and is tried again."""

    reason: str
    detail: str
    shortfall: Shortfall | None = None


@dataclass(frozen=True)
class NeedsReview:
    """The credit's payment ended in a way only a person can judge (no retry)."""

    reason: str


Outcome = Credited | InFlight | Failed | Waiting | NeedsReview


class PayerWaits(Exception):
    """A payer cannot pay now (`Waiting` says why); raised before anything is signed."""

    def __init__(self, waiting: Waiting) -> None:
        super().__init__(waiting.detail)
        self.waiting = waiting
