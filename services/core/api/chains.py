"""GET /v1/chains: public chain discovery with the live settlement fee."""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal

import marshmallow as ma
from flask import Response
from flask.views import MethodView

from services.core.chains import Asset, Chain, ChainRegistry
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
    explorer_tx_url = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={
            "description": "A transaction's page on the chain's block explorer, `{txHash}` "
            "standing for the hash; null when none is configured.",
            "example": "https://basescan.org/tx/{txHash}",
        },
    )


class VenueSchema(Schema):
    chain_id = ma.fields.Integer(required=True)
    asset = ma.fields.String(required=True)


class ChainsSchema(Schema):
    chains = ma.fields.List(ma.fields.Nested(ChainSchema), required=True)
    default_settlement_venue = ma.fields.Nested(VenueSchema, required=True)


@dataclass(frozen=True)
class ChainListing:
    """A chain as GET /v1/chains shows it: the chains file's entry and its live fee."""

    chain_id: int
    name: str
    status: str
    assets: tuple[Asset, ...]
    min_deposit_usd: Decimal | None
    settlement_gas_fee_usd: Decimal
    confirmations: int
    explorer_tx_url: str | None

    @classmethod
    def of(cls, chain: Chain, fee: Decimal) -> ChainListing:
        return cls(
            chain.chain_id,
            chain.name,
            chain.status,
            chain.assets,
            chain.min_deposit_usd,
            fee,
            chain.confirmations,
            chain.explorer_tx_url,
        )


@dataclass(frozen=True)
class Venue:
    chain_id: int
    asset: str


@dataclass(frozen=True)
class Discovery:
    chains: list[ChainListing]
    default_settlement_venue: Venue


def list_chains(registry: ChainRegistry, fees: dict[int, Decimal]) -> Discovery:
    """Every chain of the registry with its live fee (0 where none is stored)."""
    return Discovery(
        [ChainListing.of(c, fees.get(c.chain_id, Decimal(0))) for c in registry.chains],
        Venue(registry.default_venue_chain_id, registry.default_venue_asset),
    )


_CHAINS_SCHEMA = ChainsSchema()


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
            # Rendered by the schema once per fees object, then served as bytes (this
            # route's speed goal: docs/PERFORMANCE.md).
            listing = _CHAINS_SCHEMA.dump(list_chains(ctx.registry, fees))
            body = json.dumps(listing, separators=(",", ":"))
            cache.body, cache.fees = body.encode(), fees
        return Response(cache.body, mimetype="application/json")
