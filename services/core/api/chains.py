"""GET /v1/chains: public chain discovery with the live settlement fee."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import marshmallow as ma
from flask import Response
from flask.views import MethodView

from services.core.chains import ChainRegistry
from services.core.context import core
from shared.api import Blueprint, Schema

blp = Blueprint("chains", __name__, url_prefix="/v1", description="Chain discovery (public).")


class AssetSchema(Schema):
    symbol = ma.fields.String(required=True, metadata={"example": "USDC"})
    token_address = ma.fields.String(required=True, metadata={"description": "Canonical contract"})
    decimals = ma.fields.Integer(required=True, metadata={"example": 6})


class ChainSchema(Schema):
    chain_id = ma.fields.Integer(required=True, metadata={"example": 1})
    name = ma.fields.String(required=True)
    status = ma.fields.String(required=True, metadata={"enum": ["active", "declared"]})
    assets = ma.fields.List(ma.fields.Nested(AssetSchema), required=True)
    min_deposit_usd = ma.fields.Float(required=True, allow_none=True)
    settlement_gas_fee_usd = ma.fields.Float(required=True)
    confirmations = ma.fields.Integer(
        required=True, metadata={"description": "Blocks before a deposit counts as confirmed."}
    )


class VenueSchema(Schema):
    chain_id = ma.fields.Integer(required=True)
    asset = ma.fields.String(required=True)


class ChainsSchema(Schema):
    chains = ma.fields.List(ma.fields.Nested(ChainSchema), required=True)
    default_settlement_venue = ma.fields.Nested(VenueSchema, required=True)


def chains_document(registry: ChainRegistry, fees: dict[int, Decimal]) -> dict[str, Any]:
    """The body of GET /v1/chains for these fees."""
    return {
        "chains": [
            {
                "chainId": c.chain_id,
                "name": c.name,
                "status": c.status,
                "assets": [
                    {"symbol": a.symbol, "tokenAddress": a.token_address, "decimals": a.decimals}
                    for a in c.assets
                ],
                "minDepositUsd": None if c.min_deposit_usd is None else float(c.min_deposit_usd),
                "settlementGasFeeUsd": float(fees.get(c.chain_id, Decimal(0))),
                "confirmations": c.confirmations,
            }
            for c in registry.chains
        ],
        "defaultSettlementVenue": {
            "chainId": registry.default_venue_chain_id,
            "asset": registry.default_venue_asset,
        },
    }


class _RenderedChains:
    """The rendered body, rebuilt only when the fees object changes."""

    fees: dict[int, Decimal] | None = None
    body: bytes = b""


@blp.route("/chains")
class Chains(MethodView):
    @blp.response(200, ChainsSchema)
    def get(self) -> Response:
        """List chains, their deposit assets, deposit floors and live settlement fees."""
        ctx = core()
        fees = ctx.fees.get()
        cache: _RenderedChains = ctx.__dict__.setdefault("_chains_render", _RenderedChains())
        if cache.fees is not fees:
            body = json.dumps(chains_document(ctx.registry, fees), separators=(",", ":"))
            cache.body, cache.fees = body.encode(), fees
        return Response(cache.body, mimetype="application/json")
