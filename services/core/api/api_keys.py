"""/v1/api-keys: a tenant's API keys, created (shown once), listed and revoked."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import Response
from flask.views import MethodView

from services.core.api.schemas import ERROR_DESCRIPTIONS, json_response, printable
from services.core.api_keys import revoke_key
from services.core.context import core
from services.core.models import IdempotencyRecord
from shared.api import Blueprint, ErrorSchema, ListArgs, Schema, Timestamp
from shared.audit.changes import key_created, key_revoked
from shared.audit.log import record_request
from shared.errors import Forbidden
from shared.idempotency import OPENAPI_PARAMETER, idempotent
from shared.identity import auth
from shared.identity import service as identity
from shared.identity.models import SCOPES, ApiKey
from shared.timefmt import iso_ms

blp = Blueprint(
    "api_keys",
    __name__,
    url_prefix="/v1",
    description="The tenant's API keys: create one with chosen scopes (shown once), list, revoke.",
)

SCOPE = "api_keys:write"


class ApiKeySchema(Schema):
    id = ma.fields.String(required=True, metadata={"example": "key_01JD3Y9X8M2K4Q7R5T6V8W0Z1A"})
    name = ma.fields.String(required=True, allow_none=True, metadata={"example": "billing"})
    prefix = ma.fields.String(
        required=True,
        metadata={"example": "sk_Jb3kQ9x", "description": "The key's first characters."},
    )
    scopes = ma.fields.List(ma.fields.String(metadata={"enum": list(SCOPES)}), required=True)
    created_at = Timestamp(required=True)
    revoked_at = Timestamp(required=True, allow_none=True)


class ApiKeyCreateSchema(Schema):
    name = ma.fields.String(
        load_default=None,
        validate=[ma.validate.Length(min=1, max=100), printable],
        metadata={"description": "A label to tell keys apart."},
    )
    scopes = ma.fields.List(
        ma.fields.String(validate=ma.validate.OneOf(SCOPES), metadata={"enum": list(SCOPES)}),
        required=True,
        validate=ma.validate.Length(min=1, max=len(SCOPES)),
        metadata={"description": "At most the scopes the caller holds itself."},
    )


class ApiKeyEnvelopeSchema(Schema):
    api_key = ma.fields.Nested(ApiKeySchema, required=True)


class ApiKeyWithSecretSchema(ApiKeyEnvelopeSchema):
    secret = ma.fields.String(
        required=True,
        metadata={"description": "The key itself (`sk_...`): shown only in this response."},
    )


class ApiKeyListSchema(Schema):
    api_keys = ma.fields.List(ma.fields.Nested(ApiKeySchema), required=True)
    next_cursor = ma.fields.String(required=True, allow_none=True)


def key_document(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.key_prefix,
        "scopes": list(key.scopes),
        "createdAt": iso_ms(key.created_at),
        "revokedAt": None if key.revoked_at is None else iso_ms(key.revoked_at),
    }


@blp.route("/api-keys")
class ApiKeys(MethodView):
    @auth.requires(blp, SCOPE)
    @blp.arguments(ListArgs, location="query")
    @blp.response(200, ApiKeyListSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    def get(self, args: dict[str, Any]) -> Response:
        """List the tenant's API keys, revoked ones too, newest first (never the keys)."""
        tenant_id = auth.current_principal().tenant_id
        with core().db.reader() as session:
            page = identity.list_api_keys(
                session, tenant_id, limit=args["limit"], cursor=args["cursor"]
            )
            items = [key_document(k) for k in page.items]
        return json_response({"apiKeys": items, "nextCursor": page.next_cursor})

    @auth.requires(blp, SCOPE, step_up=True)
    @idempotent(IdempotencyRecord)
    @blp.arguments(ApiKeyCreateSchema)
    @blp.response(200, ApiKeyWithSecretSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(409, schema=ErrorSchema, description="idempotency_key_reused")
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self, args: dict[str, Any]) -> Response:
        """Create an API key with chosen scopes; the key is in this response only.

        A key never makes a key with a scope it lacks itself (403 forbidden); a member
        (admin or owner) may give any scope.
        """
        principal = auth.current_principal()
        if not principal.may_grant_scopes(args["scopes"]):
            missing = sorted(set(args["scopes"]) - principal.holds())
            raise Forbidden(f"you cannot give scopes you lack: {', '.join(missing)}")
        with auth.identity_db().transaction() as session:
            issued = identity.create_api_key(
                session, principal.tenant_id, args["scopes"], name=args["name"]
            )
            record_request(session, key_created(issued.record))
            body = {"apiKey": key_document(issued.record), "secret": issued.api_key}
        return json_response(body)


@blp.route("/api-keys/<apiKeyId>")
class OneApiKey(MethodView):
    @auth.requires(blp, SCOPE)
    @blp.response(204)
    @blp.alt_response(404, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[404])
    def delete(self, apiKeyId: str) -> Response:
        """Revoke an API key: it fails from the next request on; emits tenant.api_key_revoked.

        Revoking a revoked key changes nothing (204 again, no second event).
        """
        tenant_id = auth.current_principal().tenant_id
        # Core's database: the key and its outbox event commit together.
        with core().db.transaction() as session:
            key, newly = revoke_key(session, apiKeyId, tenant_id=tenant_id)
            if newly:
                record_request(session, key_revoked(key))
        return Response(status=204)
