"""/v1/members: the people who sign in to the tenant's portal, and their roles."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import Response
from flask.views import MethodView

from services.core.api.schemas import ERROR_DESCRIPTIONS, json_response, printable
from services.core.api.sessions import PASSWORD_MAX, unicode_text
from services.core.models import IdempotencyRecord
from shared.api import Blueprint, ErrorSchema, ListArgs, Schema, Timestamp
from shared.audit.changes import member_added
from shared.audit.log import Change, record_request
from shared.idempotency import OPENAPI_PARAMETER, idempotent
from shared.identity import auth
from shared.identity import service as identity
from shared.identity.models import ROLES, Member
from shared.timefmt import iso_ms

blp = Blueprint(
    "members",
    __name__,
    url_prefix="/v1",
    description="Portal members: add one with a role, change a role, remove. A caller never "
    "gives a role above its own.",
)

SCOPE = "members:write"
_ROLE = ma.fields.String(
    required=True, validate=ma.validate.OneOf(ROLES), metadata={"enum": list(ROLES)}
)


class MemberSchema(Schema):
    id = ma.fields.String(required=True, metadata={"example": "mem_01JD3Y9X8M2K4Q7R5T6V8W0Z1A"})
    email = ma.fields.String(required=True, metadata={"example": "ops@example.com"})
    role = ma.fields.String(required=True, metadata={"enum": list(ROLES)})
    created_at = Timestamp(required=True)


class MemberCreateSchema(Schema):
    email = ma.fields.String(
        required=True,
        validate=[ma.validate.Length(min=3, max=320), printable],
        metadata={"example": "ops@example.com"},
    )
    role = _ROLE
    password = ma.fields.String(
        required=True,
        validate=[ma.validate.Length(min=12, max=PASSWORD_MAX), unicode_text],
        metadata={"description": "The first password (12 characters or more)."},
    )


class MemberPatchSchema(Schema):
    role = _ROLE


class MemberEnvelopeSchema(Schema):
    member = ma.fields.Nested(MemberSchema, required=True)


class MemberListSchema(Schema):
    members = ma.fields.List(ma.fields.Nested(MemberSchema), required=True)
    next_cursor = ma.fields.String(required=True, allow_none=True)


def member_document(member: Member) -> dict[str, Any]:
    return {
        "id": member.id,
        "email": member.email,
        "role": member.role,
        "createdAt": iso_ms(member.created_at),
    }


_FORBIDDEN = "insufficient_scope, or forbidden (a role above the caller's)"
_CONFLICT = "conflict (the email is taken; the last owner) or idempotency_key_reused"


@blp.route("/members")
class Members(MethodView):
    @auth.requires(blp, SCOPE)
    @blp.arguments(ListArgs, location="query")
    @blp.response(200, MemberListSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    def get(self, args: dict[str, Any]) -> Response:
        """List the tenant's members, newest first."""
        tenant_id = auth.current_principal().tenant_id
        with auth.identity_db().reader() as session:
            page = identity.list_members(
                session, tenant_id, limit=args["limit"], cursor=args["cursor"]
            )
            items = [member_document(m) for m in page.items]
        return json_response({"members": items, "nextCursor": page.next_cursor})

    @auth.requires(blp, SCOPE)
    @idempotent(IdempotencyRecord)
    @blp.arguments(MemberCreateSchema)
    @blp.response(200, MemberEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(403, schema=ErrorSchema, description=_FORBIDDEN)
    @blp.alt_response(409, schema=ErrorSchema, description=_CONFLICT)
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self, args: dict[str, Any]) -> Response:
        """Add a member with a role (at most the caller's own) and a first password."""
        principal = auth.current_principal()
        with auth.identity_db().transaction() as session:
            member = identity.grant_member(
                session, principal, args["email"], args["role"], args["password"]
            )
            record_request(session, member_added(member))
            body = member_document(member)
        return json_response({"member": body})


@blp.route("/members/<memberId>")
class OneMember(MethodView):
    @auth.requires(blp, SCOPE, step_up=True)
    @blp.arguments(MemberPatchSchema)
    @blp.response(200, MemberEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(403, schema=ErrorSchema, description=_FORBIDDEN)
    @blp.alt_response(404, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[404])
    @blp.alt_response(409, schema=ErrorSchema, description="conflict: the tenant's last owner")
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    def patch(self, args: dict[str, Any], memberId: str) -> Response:
        """Change a member's role; it applies to their next request."""
        principal = auth.current_principal()
        with auth.identity_db().transaction() as session:
            member, before = identity.change_role(session, principal, memberId, args["role"])
            record_request(
                session,
                Change(
                    "member.role_changed",
                    "member",
                    member.id,
                    before={"email": member.email, "role": before},
                    after={"email": member.email, "role": member.role},
                ),
            )
            body = member_document(member)
        return json_response({"member": body})

    @auth.requires(blp, SCOPE)
    @blp.response(204)
    @blp.alt_response(403, schema=ErrorSchema, description=_FORBIDDEN)
    @blp.alt_response(404, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[404])
    @blp.alt_response(409, schema=ErrorSchema, description="conflict: the tenant's last owner")
    def delete(self, memberId: str) -> Response:
        """Remove a member; their sessions end at once."""
        principal = auth.current_principal()
        with auth.identity_db().transaction() as session:
            removed = identity.remove_member(session, principal, memberId)
            record_request(
                session,
                Change(
                    "member.removed",
                    "member",
                    removed.id,
                    before={"email": removed.email, "role": removed.role},
                ),
            )
        return Response(status=204)
