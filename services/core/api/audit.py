"""/v1/audit-events: the tenant's audit log, newest first, with each entry's chain hashes."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask.views import MethodView

from services.core.api.schemas import ERROR_DESCRIPTIONS, json_response, printable
from shared.api import Blueprint, ErrorSchema, ListArgs, Schema, Timestamp
from shared.audit.chain import hashed_fields
from shared.audit.log import ACTOR_TYPES, Filters, list_events
from shared.identity import auth
from shared.identity.models import AuditEvent
from shared.timefmt import iso_ms

blp = Blueprint(
    "audit_events",
    __name__,
    url_prefix="/v1",
    description="The audit log: who changed what, when and from where; append-only, each "
    "entry chained to the one before by its hash.",
)

SCOPE = "audit:read"


class AuditListArgs(ListArgs):
    """Filters of GET /v1/audit-events; every one given must match."""

    actor_id = ma.fields.String(
        validate=[ma.validate.Length(min=1, max=200), printable],
        metadata={
            "description": "Only entries by this actor (key_..., mem_..., pl_..., or ops' name)."
        },
    )
    action = ma.fields.String(
        validate=[ma.validate.Length(min=1, max=64), printable],
        metadata={
            "description": "Only this action (`member.role_changed`), or a family of them "
            "ending in `.*` (`member.*`).",
            "example": "destination_policy.updated",
        },
    )
    created_after = Timestamp(metadata={"description": "At or after (inclusive)."})
    created_before = Timestamp(metadata={"description": "Before (exclusive)."})


class ActorSchema(Schema):
    type = ma.fields.String(required=True, metadata={"enum": list(ACTOR_TYPES)})
    id = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "The API key, member or portal link id; ops' name."},
    )
    name = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "A member's email at the time; ops' OS user@host."},
    )


class TargetSchema(Schema):
    type = ma.fields.String(required=True, metadata={"example": "deposit_account"})
    id = ma.fields.String(required=True, allow_none=True)


class AuditEventSchema(Schema):
    id = ma.fields.String(required=True, metadata={"example": "aud_01JD3Y9X8M2K4Q7R5T6V8W0Z1A"})
    tenant_id = ma.fields.String(required=True, metadata={"format": "uuid"})
    sequence = ma.fields.Integer(
        required=True, metadata={"description": "Place in the tenant's chain: 1, 2, 3 ..."}
    )
    created_at = Timestamp(required=True)
    chain_time = ma.fields.String(
        required=True,
        metadata={"description": "createdAt with microseconds, as the hash covers it."},
    )
    action = ma.fields.String(required=True, metadata={"example": "destination_policy.updated"})
    actor = ma.fields.Nested(ActorSchema, required=True)
    target = ma.fields.Nested(TargetSchema, required=True)
    before = ma.fields.Raw(required=True, allow_none=True, metadata={"type": "object"})
    after = ma.fields.Raw(required=True, allow_none=True, metadata={"type": "object"})
    ip = ma.fields.String(required=True, allow_none=True)
    request_id = ma.fields.String(required=True, allow_none=True)
    prev_hash = ma.fields.String(
        required=True, metadata={"description": "The hash of the entry before (64 zeros first)."}
    )
    hash = ma.fields.String(
        required=True,
        metadata={"description": "SHA-256 of the entry's canonical form (docs/SECURITY.md)."},
    )


class AuditListSchema(Schema):
    audit_events = ma.fields.List(ma.fields.Nested(AuditEventSchema), required=True)
    next_cursor = ma.fields.String(required=True, allow_none=True)


def event_document(event: AuditEvent) -> dict[str, Any]:
    """Every field the entry's hash covers (createdAt with microseconds as `chainTime`),
    the time in milliseconds as every timestamp, and the hash."""
    fields = hashed_fields(event)
    return {
        **fields,
        "createdAt": iso_ms(event.created_at),
        "chainTime": fields["createdAt"],
        "hash": event.hash,
    }


@blp.route("/audit-events")
class AuditEvents(MethodView):
    @auth.requires(blp, SCOPE)
    # Unknown parameters are refused: a misspelt filter would silently list everything.
    @blp.arguments(AuditListArgs, location="query", unknown=ma.RAISE)
    @blp.response(200, AuditListSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    def get(self, args: dict[str, Any]) -> Any:
        """List the tenant's audit events, newest first, filtered by actor, action and time.

        Kept at least a year (nothing prunes them). Each entry carries `prevHash` and
        `hash`, so a tenant can check its own chain: see docs/SECURITY.md, Audit log.
        """
        filters = Filters(
            actor_id=args.get("actor_id"),
            action=args.get("action"),
            created_after=args.get("created_after"),
            created_before=args.get("created_before"),
        )
        with auth.identity_db().reader() as session:
            page = list_events(
                session,
                auth.current_principal().tenant_id,
                filters,
                limit=args["limit"],
                cursor=args["cursor"],
            )
            items = [event_document(e) for e in page.items]
        return json_response({"auditEvents": items, "nextCursor": page.next_cursor})
