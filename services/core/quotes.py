"""Fee previews: what a deposit of an amount would net after the flat settlement fee.

The fee is the stored live value (`services.core.fees.fee_for`), never computed
here. Every deposit asset is a USD stablecoin, priced at 1 USD.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from services.core import amounts
from services.core.chains import Asset, Chain, ChainRegistry
from services.core.fees import usd
from shared.api import field_error

#: Every deposit asset is a dollar stablecoin (the chains file only lists those).
STABLECOIN_USD = Decimal(1)


def usd_price(asset: Asset) -> Decimal:
    """USD price of one unit of a deposit asset."""
    return STABLECOIN_USD


def matching_assets(
    registry: ChainRegistry, chain_id: int | None, symbol: str | None
) -> list[tuple[Chain, Asset]]:
    """Active (chain, asset) pairs matching the optional filters, in registry order.

    A chain that is not active is `unsupported_chain`; an asset no matching chain
    accepts is a 400 naming `asset`. Symbols match as `Chain.asset_by_symbol` says.
    """
    chains = (registry.require_active(chain_id),) if chain_id is not None else registry.active()
    pairs = [
        (chain, asset)
        for chain in chains
        for asset in (chain.assets if symbol is None else (chain.asset_by_symbol(symbol),))
        if asset is not None
    ]
    if not pairs:
        where = f"chain {chain_id}" if chain_id is not None else "any active chain"
        raise field_error("asset", f"{symbol!r} is not a deposit asset on {where}")
    return pairs


def quote(chain: Chain, asset: Asset, amount: Decimal, fee_usd: Decimal) -> dict[str, Any]:
    """One quote: the amount's USD value, the flat fee, the net and the dust floor."""
    amount_usd = usd(amounts.EXACT.multiply(amount, usd_price(asset)))
    net = max(Decimal(0), amount_usd - fee_usd)
    floor = chain.min_deposit_usd
    return {
        "chainId": chain.chain_id,
        "asset": asset.symbol,
        "tokenAddress": asset.token_address,
        "amount": amounts.format_amount(amount),
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
    amount: Decimal,
    chain_id: int | None = None,
    symbol: str | None = None,
) -> list[dict[str, Any]]:
    """Quotes for every active chain and asset matching the filters.

    `amount` is already read by `services.core.amounts`. One with more decimals than
    a matching asset has is refused rather than silently rounded: it could never be
    sent in that token.
    """
    pairs = matching_assets(registry, chain_id, symbol)
    too_fine = [(c, a) for c, a in pairs if not amounts.fits(amount, a)]
    if too_fine:
        raise field_error("amount", amounts.too_fine_message(amount, too_fine))
    fees: dict[int, Decimal] = {}
    out = []
    for chain, asset in pairs:
        if chain.chain_id not in fees:
            fees[chain.chain_id] = fee_of(chain)
        out.append(quote(chain, asset, amount, fees[chain.chain_id]))
    return out
