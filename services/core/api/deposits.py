"""Deposits: list and read the tenant's deposits (the same object deposit events carry),
and one deposit's timeline."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView

from services.core.context import core
from services.core.deposits import states
from services.core.deposits.queries import DepositFilters, DepositQueries
from services.core.deposits.serialize import DepositEnvelopeSchema, DepositSchema
from shared.api import Blueprint, ErrorSchema, ListArgs, Schema, Timestamp
from shared.identity import auth

blp = Blueprint(
    "deposits",
    __name__,
    url_prefix="/v1",
    description="Deposits: each incoming transfer and its way to a credited settlement.",
)


class DepositListSchema(Schema):
    deposits = ma.fields.List(ma.fields.Nested(DepositSchema), required=True)
    next_cursor = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "Pass as `cursor` for the next page; null on the last page."},
    )


class TransitionSchema(Schema):
    status = ma.fields.String(
        required=True,
        metadata={"enum": list(states.STATUSES), "description": "The status the deposit took."},
    )
    at = Timestamp(required=True, metadata={"description": "When (the event's `createdAt`)."})
    event_id = ma.fields.String(
        required=True,
        metadata={
            "description": "The event that recorded it (deliveries: "
            "`GET /v1/webhook-deliveries?eventId=...`).",
            "example": "evt_dep_dep_01JD3Y9X8M2K4Q7R5T6V8W0Z1A_credited",
        },
    )
    event_type = ma.fields.String(required=True, metadata={"example": "deposit.credited"})


class TimelineSchema(Schema):
    timeline = ma.fields.List(
        ma.fields.Nested(TransitionSchema),
        required=True,
        metadata={"description": "Oldest first."},
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
    @auth.requires(blp, "deposits:read")
    @blp.arguments(DepositListArgs, location="query")
    @blp.response(200, DepositListSchema)
    @blp.alt_response(400, schema=ErrorSchema, description="invalid_request (names the field)")
    def get(self, args: dict[str, Any]) -> dict[str, Any]:
        """List the tenant's deposits, newest first, with optional filters."""
        filters = DepositFilters(
            external_user_id=args.get("external_user_id"),
            status=args.get("status"),
            chain_id=args.get("chain_id"),
            created_after=args.get("created_after"),
            created_before=args.get("created_before"),
        )
        page = DepositQueries(core().db).list_page(
            auth.current_principal().tenant_id, filters, limit=args["limit"], cursor=args["cursor"]
        )
        return {"deposits": page.items, "next_cursor": page.next_cursor}


@blp.route("/deposits/<string:depositId>")
class Deposit(MethodView):
    @auth.requires(blp, "deposits:read")
    @blp.response(200, DepositEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="not_found (also another tenant's)")
    def get(self, depositId: str) -> dict[str, Any]:
        """Read one deposit."""
        deposit = DepositQueries(core().db).get(auth.current_principal().tenant_id, depositId)
        return {"deposit": deposit}


@blp.route("/deposits/<string:depositId>/timeline")
class DepositTimeline(MethodView):
    @auth.requires(blp, "deposits:read")
    @blp.response(200, TimelineSchema)
    @blp.alt_response(404, schema=ErrorSchema, description="not_found (also another tenant's)")
    def get(self, depositId: str) -> dict[str, Any]:
        """Each status the deposit went through, with its time and the event that told it.

        Read from the deposit's recorded events, oldest first: a status taken days later
        (a manual credit) shows its own time, and best-effort statuses
        (`credit_submitted`, `manual_review_required`) are there with their event ids.
        """
        steps = DepositQueries(core().db).timeline(auth.current_principal().tenant_id, depositId)
        return {"timeline": steps}
