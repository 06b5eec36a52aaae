"""/v1/portal-links: one-time URLs that open the portal's webhook pages for a tenant."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import marshmallow as ma
from flask import Response, request
from flask.views import MethodView

from services.core.api.schemas import ERROR_DESCRIPTIONS, json_response
from services.core.context import core
from services.core.models import IdempotencyRecord
from shared.api import Blueprint, ErrorSchema, Schema, StrictInteger, Timestamp
from shared.audit.log import Change, record_request
from shared.idempotency import OPENAPI_PARAMETER, idempotent
from shared.identity import auth, portal_links
from shared.identity.models import LINK_ROLES
from shared.timefmt import iso_ms

blp = Blueprint(
    "portal_links",
    __name__,
    url_prefix="/v1",
    description="Portal links: give your own support staff the webhook pages without making "
    "them members.",
)

#: Where the portal opens a link (the token travels in the fragment, never to a server log).
LINK_PATH = "/portal/link#"
_MIN_S = int(portal_links.LINK_TTL_MIN.total_seconds())
_MAX_S = int(portal_links.LINK_TTL_MAX.total_seconds())


class PortalLinkCreateSchema(Schema):
    role = ma.fields.String(
        load_default="viewer",
        validate=ma.validate.OneOf(LINK_ROLES),
        metadata={"enum": list(LINK_ROLES), "description": "The role the link's session has."},
    )
    expires_in_seconds = StrictInteger(
        load_default=_MAX_S,
        validate=ma.validate.Range(min=_MIN_S, max=_MAX_S),
        metadata={"description": f"How long the link may wait to be opened ({_MIN_S}..{_MAX_S})."},
    )


class PortalLinkSchema(Schema):
    id = ma.fields.String(required=True, metadata={"example": "pl_01JD3Y9X8M2K4Q7R5T6V8W0Z1A"})
    url = ma.fields.String(
        required=True,
        metadata={
            "description": "Open it once, within expiresAt: it signs the browser in to the "
            "webhook pages (a session of one hour) and then no longer works."
        },
    )
    role = ma.fields.String(required=True, metadata={"enum": list(LINK_ROLES)})
    expires_at = Timestamp(required=True)


class PortalLinkEnvelopeSchema(Schema):
    portal_link = ma.fields.Nested(PortalLinkSchema, required=True)


def _base_url() -> str:
    configured = core().config.public_url
    return configured if configured else request.host_url.rstrip("/")


@blp.route("/portal-links")
class PortalLinks(MethodView):
    @auth.requires(blp, "portal:write")
    @idempotent(IdempotencyRecord)
    @blp.arguments(PortalLinkCreateSchema, required=False)
    @blp.response(200, PortalLinkEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(409, schema=ErrorSchema, description="idempotency_key_reused")
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self, args: dict[str, Any]) -> Response:
        """Make a one-time URL that opens the webhook pages for this tenant with a role.

        Valid for at most 15 minutes and for one opening; its session reaches the
        webhook endpoints and deliveries only. The base of the URL is
        SETTLE_PUBLIC_URL (or the host this request came to).
        """
        principal = auth.current_principal()
        ttl = timedelta(seconds=args["expires_in_seconds"])
        with auth.identity_db().transaction() as session:
            issued = portal_links.create_link(session, principal, args["role"], ttl)
            record_request(
                session,
                Change(
                    "portal_link.created",
                    "portal_link",
                    issued.record.id,
                    after={
                        "role": issued.record.role,
                        "expiresAt": iso_ms(issued.record.expires_at),
                    },
                ),
            )
            body = {
                "id": issued.record.id,
                "url": f"{_base_url()}{LINK_PATH}{issued.token}",
                "role": issued.record.role,
                "expiresAt": iso_ms(issued.record.expires_at),
            }
        return json_response({"portalLink": body})
