"""POST /v1/fee-preview: what deposits of an amount would net after the live settlement fee."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView

from services.core import quotes
from services.core.api.schemas import ERROR_DESCRIPTIONS, Amount, ChainId
from services.core.context import core
from services.core.models import IdempotencyRecord
from shared.api import Blueprint, ErrorSchema, Schema
from shared.idempotency import OPENAPI_PARAMETER, idempotent
from shared.identity import auth

blp = Blueprint(
    "fee_preview",
    __name__,
    url_prefix="/v1",
    description="Fee quotes with the live flat settlement fee.",
)


class FeePreviewInSchema(Schema):
    chain_id = ChainId(
        load_default=None,
        allow_none=True,
        metadata={"description": "Only this active chain (omit or null: every active chain)."},
    )
    asset = ma.fields.String(
        load_default=None,
        allow_none=True,
        validate=ma.validate.Length(min=1, max=20),
        metadata={
            "description": "Only this asset symbol, e.g. USDC (any case: usdc matches).",
            "example": "USDC",
        },
    )
    amount = Amount(required=True)


class QuoteSchema(Schema):
    chain_id = ma.fields.Integer(required=True, metadata={"example": 8453})
    asset = ma.fields.String(required=True, metadata={"example": "USDC"})
    token_address = ma.fields.String(required=True)
    amount = ma.fields.String(required=True, metadata={"example": "125.50"})
    amount_usd = ma.fields.Float(required=True, metadata={"example": 125.5})
    settlement_gas_fee_usd = ma.fields.Float(
        required=True, metadata={"description": "The live flat fee, as GET /v1/chains shows it."}
    )
    net_amount_usd = ma.fields.Float(
        required=True, metadata={"description": "amountUsd - settlementGasFeeUsd, at least 0."}
    )
    min_deposit_usd = ma.fields.Float(required=True, allow_none=True)
    below_minimum = ma.fields.Boolean(
        required=True, metadata={"description": "True when the deposit would be dust (failed)."}
    )


class QuotesSchema(Schema):
    quotes = ma.fields.List(ma.fields.Nested(QuoteSchema), required=True)


@blp.route("/fee-preview")
class FeePreview(MethodView):
    @auth.requires(blp, "fees:read")
    @idempotent(IdempotencyRecord)
    @blp.arguments(FeePreviewInSchema)
    @blp.response(200, QuotesSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(409, schema=ErrorSchema, description="idempotency_key_reused")
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self, args: dict[str, Any]) -> dict[str, list[quotes.Quote]]:
        """Quote every active chain and asset matching the filters for an amount."""
        ctx = core()
        found = quotes.preview_fees(
            ctx.db,
            ctx.registry,
            amount=args["amount"],
            chain_id=args["chain_id"],
            symbol=args["asset"],
        )
        return {"quotes": found}
