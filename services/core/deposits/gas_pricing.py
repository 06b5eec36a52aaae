"""What a hot-wallet payment offers per gas: the first transaction's fees held to the
chain's cap, a replacement's priced from the market, a cancel's (pure).

The market is what the node asks now (`hot_wallet.Market`: the fee fields a new
transaction would carry, 2 x base fee + tip, and the latest base fee). A replacement
must offer FEE_BUMP over the transaction it replaces (nodes refuse less), so pricing a
replacement from its own last price compounds: 1.125^11 = 3.65x after eleven, in a
market that never moved. Here it is priced from the market, and only when the market
asks more than it offers; never past the chain's cap (SETTLE_PAYMENT_MAX_FEE_GWEI) or
the most replacements (SETTLE_PAYMENT_MAX_REPLACEMENTS): the payment then waits, as it
is, and ops are alerted (`Stall`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

#: A replacement raises each fee by at least this factor over the one it replaces
#: (nodes want 10 %: geth's default price bump).
FEE_BUMP = Decimal("1.125")
#: `HotWalletPayment.stalled`: why a due replacement is held back.
STALLED_FEE_CAP = "fee_cap"
STALLED_MAX_REPLACEMENTS = "max_replacements"
_FEE_KEYS = ("gasPrice", "maxFeePerGas", "maxPriorityFeePerGas")


class Market(Protocol):
    """What the network asks per gas now (`hot_wallet.Market`)."""

    @property
    def fees(self) -> dict[str, int]:
        """The fee fields a new transaction would carry."""
        ...

    @property
    def base_fee(self) -> int | None:
        """The latest block's base fee (None without EIP-1559)."""
        ...


@dataclass(frozen=True)
class Stall:
    """A due replacement held back; the payment waits as it is (and ops are alerted)."""

    reason: str
    detail: str


def cap_wei(cap_gwei: Decimal | None) -> int | None:
    return None if cap_gwei is None else int(cap_gwei * 10**9)


def offered(fees: dict[str, Any]) -> int:
    """The most a transaction may pay per gas."""
    return int(fees.get("maxFeePerGas", fees.get("gasPrice", 0)))


def within_cap(
    fees: dict[str, int], base_fee: int | None, cap: int | None
) -> dict[str, int] | None:
    """`fees`, held to `cap` per gas; None when even the cap cannot get a transaction
    mined now (the block's base fee and the tip are over it)."""
    if cap is None or offered(fees) <= cap:
        return fees
    tip = int(fees.get("maxPriorityFeePerGas", 0))
    if "maxFeePerGas" in fees and base_fee is not None and base_fee + tip <= cap:
        # The cap still pays the base fee and the tip: offer the cap (less headroom for
        # the base fee rising, never more than the cap).
        return {**fees, "maxFeePerGas": cap}
    return None


def _bumped(tx: dict[str, Any], key: str) -> int:
    """The least a replacement may offer for `key` (nodes refuse less)."""
    return math.ceil(Decimal(int(tx[key])) * FEE_BUMP)


def reprice(
    tx: dict[str, Any], market: Market, cap: int | None, replacements: int, max_replacements: int
) -> dict[str, Any] | Stall | None:
    """A replacement of `tx` priced from the market (pure).

    None: the payment offers what the market asks already (a replacement would only
    outbid itself; it is sent again as it is). A Stall: the market asks more, but the
    most replacements were made, or the cap is below what a replacement must offer.
    Otherwise `tx` with the market's fees, at least FEE_BUMP over its own (the least a
    node accepts as a replacement), and at most the cap.
    """
    keys = [k for k in _FEE_KEYS if k in tx]
    if not any(int(market.fees.get(k, 0)) > int(tx[k]) for k in keys):
        return None
    if replacements >= max_replacements:
        return Stall(
            STALLED_MAX_REPLACEMENTS,
            f"replaced {replacements} times already (SETTLE_PAYMENT_MAX_REPLACEMENTS)",
        )
    fees = {k: max(int(market.fees.get(k, 0)), _bumped(tx, k)) for k in keys}
    if "maxFeePerGas" in fees:
        fees["maxFeePerGas"] = max(fees["maxFeePerGas"], fees["maxPriorityFeePerGas"])
    capped = within_cap(fees, market.base_fee, cap)
    if capped is None or any(capped[k] < _bumped(tx, k) for k in keys):
        return Stall(
            STALLED_FEE_CAP,
            f"the market asks {offered(market.fees)} wei per gas, a replacement must offer "
            f"{offered(fees)}; the chain's cap is {cap} (SETTLE_PAYMENT_MAX_FEE_GWEI)",
        )
    return {**tx, **capped}


def cancel_fees(tx: dict[str, Any], market: Market) -> dict[str, int]:
    """The fees of a cancel of `tx`: the market's, and at least FEE_BUMP over `tx`'s (a
    node takes it as the nonce's replacement). No cap: a cancel costs 21,000 gas, and
    not sending it may pay out money Settle never received."""
    keys = [k for k in _FEE_KEYS if k in tx]
    fees = {k: max(int(market.fees.get(k, 0)), _bumped(tx, k)) for k in keys}
    if "maxFeePerGas" in fees:
        fees["type"] = 2
        fees["maxFeePerGas"] = max(fees["maxFeePerGas"], fees["maxPriorityFeePerGas"])
    return fees
