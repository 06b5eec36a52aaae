"""The tenant destination policy: by API key, and by portal session per tenant."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView

from services.core.api.schemas import (
    ERROR_DESCRIPTIONS,
    DestinationSchema,
    printable,
)
from services.core.context import core
from services.core.destinations import Destination
from services.core.policy import VENUE_MAX, Policy, get_policy, put_policy
from shared.api import Blueprint, ErrorSchema, Schema, Timestamp
from shared.audit.log import record_request
from shared.identity import auth

blp = Blueprint(
    "destination_policy",
    __name__,
    url_prefix="/v1",
    description="The tenant's default settlement destination.",
)


class PolicyInSchema(Schema):
    destination = ma.fields.Nested(DestinationSchema, required=True)
    venue = ma.fields.String(
        load_default=None,
        allow_none=True,
        validate=[ma.validate.Length(max=VENUE_MAX), printable],
        metadata={"description": f"Free-form label, at most {VENUE_MAX} characters."},
    )


class PolicySchema(Schema):
    tenant_id = ma.fields.String(required=True, metadata={"format": "uuid"})
    destination = ma.fields.Nested(DestinationSchema, required=True)
    venue = ma.fields.String(required=True, allow_none=True)
    created_at = Timestamp(required=True)
    updated_at = Timestamp(required=True)


class PolicyEnvelopeSchema(Schema):
    destination_policy = ma.fields.Nested(
        PolicySchema,
        required=True,
        allow_none=True,
        metadata={"description": "null when no policy is configured."},
    )


def _read(tenant_id: str) -> dict[str, Policy | None]:
    return {"destination_policy": get_policy(core().db, tenant_id)}


def _write(tenant_id: str, args: dict[str, Any]) -> dict[str, Policy]:
    ctx = core()
    destination: Destination = args["destination"]
    return {
        "destination_policy": put_policy(
            ctx.db, ctx.registry, tenant_id, destination, args["venue"], audit=record_request
        )
    }


def _errors(fn: Any) -> Any:
    blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])(fn)
    return blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])(fn)


@blp.route("/destination-policy")
class DestinationPolicy(MethodView):
    @auth.requires(blp, "destination_policy:read")
    @blp.response(200, PolicyEnvelopeSchema)
    def get(self) -> dict[str, Policy | None]:
        """Read the destination policy (null when none is configured)."""
        return _read(auth.current_principal().tenant_id)

    @auth.requires(blp, "destination_policy:write", step_up=True)
    @blp.arguments(PolicyInSchema)
    @blp.response(200, PolicyEnvelopeSchema)
    @_errors
    def put(self, args: dict[str, Any]) -> dict[str, Policy]:
        """Create or replace the destination policy.

        Accounts created later without a destination copy it; existing accounts keep
        theirs.
        """
        return _write(auth.current_principal().tenant_id, args)


@blp.route("/tenants/<tenantId>/destination-policy")
class TenantDestinationPolicy(MethodView):
    @auth.member(blp, "viewer", tenant_arg="tenantId")
    @blp.response(200, PolicyEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[404])
    def get(self, tenantId: str) -> dict[str, Policy | None]:
        """Read the destination policy as a signed-in member (any role)."""
        return _read(auth.current_principal().tenant_id)

    @auth.member(blp, "developer", tenant_arg="tenantId", step_up=True)
    @blp.arguments(PolicyInSchema)
    @blp.response(200, PolicyEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[404])
    @_errors
    def put(self, args: dict[str, Any], tenantId: str) -> dict[str, Policy]:
        """Create or replace the destination policy as a member (developer or higher)."""
        return _write(auth.current_principal().tenant_id, args)
