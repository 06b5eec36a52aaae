"""Fee previews: what a deposit of an amount would net after the flat settlement fee.

The fee is the stored live value (`services.core.fees.fee_for`), never computed
here. Every deposit asset is a USD stablecoin, priced at 1 USD.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from services.core import amounts
from services.core.chains import Asset, Chain, ChainRegistry
from services.core.deposits.pricing import amount_usd as usd_value
from services.core.fees import fee_for
from shared.api import field_error
from shared.db import Database

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


@dataclass(frozen=True)
class Quote:
    """What a deposit of `amount` of one asset on one chain would net."""

    chain_id: int
    asset: str
    token_address: str
    #: As every answer writes amounts (`amounts.format_amount`).
    amount: str
    amount_usd: Decimal
    settlement_gas_fee_usd: Decimal
    #: amount_usd - fee, never below 0.
    net_amount_usd: Decimal
    min_deposit_usd: Decimal | None
    #: Below the chain's floor: such a deposit fails as dust.
    below_minimum: bool


def quote(chain: Chain, asset: Asset, amount: Decimal, fee_usd: Decimal) -> Quote:
    """One quote: the amount's USD value, the flat fee, the net and the dust floor."""
    # The one rule a deposit's value follows too (rounded down to the micro-dollar), so
    # the preview and the deposit agree on dust at the edge (9.9999995 DAI is 9.999999).
    amount_usd = usd_value(amount, usd_price(asset))
    assert amount_usd is not None
    floor = chain.min_deposit_usd
    return Quote(
        chain_id=chain.chain_id,
        asset=asset.symbol,
        token_address=asset.token_address,
        amount=amounts.format_amount(amount),
        amount_usd=amount_usd,
        settlement_gas_fee_usd=fee_usd,
        net_amount_usd=max(Decimal(0), amount_usd - fee_usd),
        min_deposit_usd=floor,
        below_minimum=floor is not None and amount_usd < floor,
    )


def preview(
    registry: ChainRegistry,
    fee_of: Callable[[Chain], Decimal],
    *,
    amount: Decimal,
    chain_id: int | None = None,
    symbol: str | None = None,
) -> list[Quote]:
    """Quotes for every active chain and asset matching the filters (no I/O: the fees
    come from `fee_of`).

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


def preview_fees(
    db: Database,
    registry: ChainRegistry,
    *,
    amount: Decimal,
    chain_id: int | None = None,
    symbol: str | None = None,
) -> list[Quote]:
    """POST /v1/fee-preview: `preview` with each chain's stored live fee."""
    with db.reader() as session:
        return preview(
            registry,
            lambda chain: fee_for(session, chain),
            amount=amount,
            chain_id=chain_id,
            symbol=symbol,
        )
