"""Deposits: list and read the tenant's deposits (the same object deposit events carry)."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import Response, jsonify
from flask.views import MethodView

from services.core.context import core
from services.core.deposits import states
from services.core.deposits.service import DepositFilters, DepositService
from shared.api import Blueprint, ErrorSchema, ListArgs, Schema, Timestamp
from shared.identity import auth

blp = Blueprint(
    "deposits",
    __name__,
    url_prefix="/v1",
    description="Deposits: each incoming transfer and its way to a credited settlement.",
)


class DepositDestinationSchema(Schema):
    chain_id = ma.fields.Integer(required=True)
    address = ma.fields.String(required=True)
    token_address = ma.fields.String(required=True)


class DepositSchema(Schema):
    """The deposit object (GET /v1/deposits and every deposit event's `data.deposit`)."""

    id = ma.fields.String(required=True, metadata={"example": "dep_01JD3Y9X8M2K4Q7R5T6V8W0Z1A"})
    account_id = ma.fields.String(required=True)
    external_user_id = ma.fields.String(required=True)
    status = ma.fields.String(required=True, metadata={"enum": list(states.STATUSES)})
    chain_id = ma.fields.Integer(required=True)
    deposit_address = ma.fields.String(required=True)
    asset = ma.fields.String(
        required=True, allow_none=True, metadata={"description": "Null for an unsupported token."}
    )
    token_address = ma.fields.String(required=True)
    decimals = ma.fields.Integer(required=True, allow_none=True)
    amount = ma.fields.String(
        required=True,
        metadata={
            "example": "125.50",
            "description": "Token units as a decimal string (base units when the token is "
            "unsupported and its decimals unknown).",
        },
    )
    amount_raw = ma.fields.String(required=True, metadata={"description": "Base units."})
    amount_usd = ma.fields.Float(required=True, allow_none=True)
    settlement_gas_fee_usd = ma.fields.Float(
        required=True,
        allow_none=True,
        metadata={"description": "The chain's live fee, recorded at settlement (estimate before)."},
    )
    net_amount_usd = ma.fields.Float(
        required=True, allow_none=True, metadata={"description": "amountUsd - fee."}
    )
    source_tx_hash = ma.fields.String(required=True)
    log_index = ma.fields.Integer(required=True)
    from_address = ma.fields.String(required=True, allow_none=True)
    block_number = ma.fields.Integer(required=True, allow_none=True)
    block_hash = ma.fields.String(required=True, allow_none=True)
    confirmations = ma.fields.Integer(required=True)
    required_confirmations = ma.fields.Integer(required=True)
    destination = ma.fields.Nested(
        DepositDestinationSchema,
        required=True,
        metadata={"description": "The account's destination when the deposit was detected."},
    )
    route = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"enum": ["direct", "inventory", "routed", "manual", None]},
    )
    credit_tx_hash = ma.fields.String(required=True, allow_none=True)
    failure_reason = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={
            "description": "reorged, below_minimum, below_fee, sandbox_outcome, or ops text."
        },
    )
    review_reason = ma.fields.String(required=True, allow_none=True)
    sandbox = ma.fields.Boolean(required=True)
    created_at = Timestamp(required=True)
    updated_at = Timestamp(required=True)
    confirmed_at = Timestamp(required=True, allow_none=True)
    credited_at = Timestamp(required=True, allow_none=True)


class DepositEnvelopeSchema(Schema):
    deposit = ma.fields.Nested(DepositSchema, required=True)


class DepositListSchema(Schema):
    deposits = ma.fields.List(ma.fields.Nested(DepositSchema), required=True)
    next_cursor = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "Pass as `cursor` for the next page; null on the last page."},
    )


def _printable(value: str) -> None:
    if not value.isprintable():
        raise ma.ValidationError("must contain only printable characters")


class DepositListArgs(ListArgs):
    external_user_id = ma.fields.String(validate=[ma.validate.Length(min=1, max=255), _printable])
    status = ma.fields.String(validate=ma.validate.OneOf(states.STATUSES))
    chain_id = ma.fields.Integer(validate=ma.validate.Range(min=0, max=2**31 - 1))
    created_after = Timestamp(metadata={"description": "Inclusive."})
    created_before = Timestamp(metadata={"description": "Exclusive."})


@blp.route("/deposits")
class Deposits(MethodView):
    @auth.api_key(blp, "deposits:read")
    @blp.arguments(DepositListArgs, location="query")
    @blp.response(200, DepositListSchema)
    @blp.alt_response(400, schema=ErrorSchema, description="invalid_request (names the field)")
    def get(self, args: dict[str, Any]) -> Response:
        """List the tenant's deposits, newest first, with optional filters."""
        ctx = core()
        filters = DepositFilters(
            external_user_id=args.get("external_user_id"),
            status=args.get("status"),
            chain_id=args.get("chain_id"),
            created_after=args.get("created_after"),
            created_before=args.get("created_before"),
        )
        with ctx.db.reader() as session:
            deposits, next_cursor = DepositService.list_page(
                session,
                auth.current_principal().tenant_id,
                filters,
                limit=args["limit"],
                cursor=args["cursor"],
            )
        return jsonify({"deposits": deposits, "nextCursor": next_cursor})


@blp.route("/deposits/<string:depositId>")
class Deposit(MethodView):
    @auth.api_key(blp, "deposits:read")
    @blp.response(200, DepositEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="not_found (also another tenant's)")
    def get(self, depositId: str) -> Response:
        """Read one deposit."""
        ctx = core()
        with ctx.db.reader() as session:
            document = DepositService(ctx.db, ctx.registry).get(
                session, auth.current_principal().tenant_id, depositId
            )
        return jsonify({"deposit": document})
