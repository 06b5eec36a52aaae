"""Fee previews: what a deposit of an amount would net after the flat settlement fee.

The fee is the stored live value (`services.core.fees.fee_for`), never computed
here. Every deposit asset is a USD stablecoin, priced at 1 USD.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from services.core.chains import Asset, Chain, ChainRegistry
from services.core.fees import usd
from shared.errors import InvalidRequest

#: A plain decimal string: digits, optionally a point and more digits ("125.50").
_AMOUNT = re.compile(r"^[0-9]{1,30}(\.[0-9]{1,36})?$")
#: Every deposit asset is a dollar stablecoin (the chains file only lists those).
STABLECOIN_USD = Decimal(1)


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", details={"fields": {field: [message]}})


def parse_amount(text: str) -> Decimal:
    """A positive decimal string -> Decimal; anything else is a 400 naming `amount`."""
    if not _AMOUNT.match(text):
        raise _invalid(
            "amount", 'must be a decimal string such as "125.50" (up to 30 integer digits)'
        )
    amount = Decimal(text)
    if amount <= 0:
        raise _invalid("amount", "must be greater than 0")
    return amount


def decimal_places(amount: Decimal) -> int:
    exponent = amount.normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def usd_price(asset: Asset) -> Decimal:
    """USD price of one unit of a deposit asset."""
    return STABLECOIN_USD


def matching_assets(
    registry: ChainRegistry, chain_id: int | None, symbol: str | None
) -> list[tuple[Chain, Asset]]:
    """Active (chain, asset) pairs matching the optional filters, in registry order.

    A chain that is not active is `unsupported_chain`; an asset no matching chain
    accepts is a 400 naming `asset`. Symbols match case-insensitively.
    """
    chains = (registry.require_active(chain_id),) if chain_id is not None else registry.active()
    wanted = symbol.casefold() if symbol is not None else None
    pairs = [
        (chain, asset)
        for chain in chains
        for asset in chain.assets
        if wanted is None or asset.symbol.casefold() == wanted
    ]
    if not pairs:
        where = f"chain {chain_id}" if chain_id is not None else "any active chain"
        raise _invalid("asset", f"{symbol!r} is not a deposit asset on {where}")
    return pairs


def quote(chain: Chain, asset: Asset, amount: Decimal, fee_usd: Decimal) -> dict[str, Any]:
    """One quote: the amount's USD value, the flat fee, the net and the dust floor."""
    amount_usd = usd(amount * usd_price(asset))
    net = max(Decimal(0), amount_usd - fee_usd)
    floor = chain.min_deposit_usd
    return {
        "chainId": chain.chain_id,
        "asset": asset.symbol,
        "tokenAddress": asset.token_address,
        "amount": format(amount, "f"),
        "amountUsd": float(amount_usd),
        "settlementGasFeeUsd": float(fee_usd),
        "netAmountUsd": float(usd(net)),
        "minDepositUsd": None if floor is None else float(floor),
        "belowMinimum": floor is not None and amount_usd < floor,
    }


def preview(
    registry: ChainRegistry,
    fee_of: Callable[[Chain], Decimal],
    *,
    amount: str,
    chain_id: int | None = None,
    symbol: str | None = None,
) -> list[dict[str, Any]]:
    """Quotes for every active chain and asset matching the filters.

    An amount with more decimals than a matching asset has is refused rather than
    silently rounded: it could never be sent in that token.
    """
    value = parse_amount(amount)
    pairs = matching_assets(registry, chain_id, symbol)
    places = decimal_places(value)
    too_fine = [(c, a) for c, a in pairs if a.decimals < places]
    if too_fine:
        names = ", ".join(f"{a.symbol} on {c.chain_id} ({a.decimals})" for c, a in too_fine)
        raise _invalid("amount", f"has {places} decimal places, more than the asset has: {names}")
    fees: dict[int, Decimal] = {}
    out = []
    for chain, asset in pairs:
        if chain.chain_id not in fees:
            fees[chain.chain_id] = fee_of(chain)
        out.append(quote(chain, asset, value, fees[chain.chain_id]))
    return out
