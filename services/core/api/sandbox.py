"""Sandbox deposits: simulate a deposit that enters the real pipeline, to rehearse webhooks."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView

from services.core.api.schemas import Amount
from services.core.context import core
from services.core.deposits.pricing import StaticPrices
from services.core.deposits.rules import SANDBOX_OUTCOMES
from services.core.deposits.sandbox import SandboxChain
from services.core.deposits.sandbox import SandboxDeposits as SandboxDepositUseCase
from services.core.deposits.serialize import DepositEnvelopeSchema
from services.core.models import IdempotencyRecord
from shared.api import Address, Blueprint, ErrorSchema, Schema, StrictInteger
from shared.errors import Forbidden
from shared.idempotency import OPENAPI_PARAMETER, idempotent
from shared.identity import auth

blp = Blueprint(
    "sandbox",
    __name__,
    url_prefix="/v1",
    description="Sandbox: simulated deposits that go through the real pipeline.",
)


class SandboxDepositSchema(Schema):
    deposit_address = Address(required=True, metadata={"description": "One of your addresses."})
    chain_id = StrictInteger(required=True, metadata={"example": 8453})
    asset = ma.fields.String(
        required=True, validate=ma.validate.Length(min=1, max=20), metadata={"example": "USDC"}
    )
    amount = Amount(required=True)
    outcome = ma.fields.String(
        load_default="credited",
        validate=ma.validate.OneOf(SANDBOX_OUTCOMES),
        metadata={"description": "What the pipeline will do with it (default credited)."},
    )


@blp.route("/sandbox/deposits")
class SandboxDeposits(MethodView):
    @auth.requires(blp, "sandbox:write")
    @idempotent(IdempotencyRecord)
    @blp.arguments(SandboxDepositSchema)
    @blp.response(200, DepositEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description="invalid_request or unsupported_chain")
    @blp.alt_response(404, schema=ErrorSchema, description="not_found: not your deposit address")
    @blp.alt_response(409, schema=ErrorSchema, description="idempotency_key_reused")
    @blp.alt_response(413, schema=ErrorSchema, description="payload_too_large")
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self, args: dict[str, Any]) -> dict[str, Any]:
        """Simulate a deposit to one of your deposit addresses.

        Only for sandbox tenants (or when the service runs with SETTLE_SANDBOX on). The
        deposit starts in source_seen, gains confirmations on simulated blocks and then
        follows `outcome`: credited (default), failed or manual_review, emitting the
        same events as a real deposit.
        """
        ctx = core()
        principal = auth.current_principal()
        if not (principal.sandbox or ctx.config.sandbox):
            raise Forbidden("sandbox deposits are only for sandbox tenants")
        settings = ctx.config.deposits
        deposits = SandboxDepositUseCase(
            ctx.db,
            ctx.registry,
            StaticPrices(settings.prices_usd),
            SandboxChain(settings.sandbox_block_s),
        )
        deposit = deposits.create(
            principal.tenant_id,
            chain_id=args["chain_id"],
            deposit_address=args["deposit_address"],
            asset=args["asset"],
            amount=args["amount"],
            outcome=args["outcome"],
        )
        return {"deposit": deposit}
