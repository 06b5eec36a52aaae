"""Portal sessions: sign in (cookie + CSRF token), who am I, sign out."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
from flask import Response, request
from flask.views import MethodView

from services.core.api.schemas import ERROR_DESCRIPTIONS, json_response, printable
from services.core.context import core
from shared.api import Blueprint, ErrorSchema, Schema, Timestamp
from shared.errors import Unauthorized
from shared.identity import auth, portal_links, service, signin_guard
from shared.identity.models import ROLES, Member, PortalSession
from shared.timefmt import iso_ms

blp = Blueprint(
    "sessions",
    __name__,
    url_prefix="/v1",
    description="Portal sign-in. Unsafe requests on a session need the X-CSRF-Token header.",
)

#: Longest password we hash (argon2 work grows with the input).
PASSWORD_MAX = 1024


def unicode_text(value: str) -> None:
    """Text the password hash can take: UTF-8 encodable (no unpaired surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ma.ValidationError("must not contain unpaired surrogates") from None


class SignInSchema(Schema):
    # Checked here, not left to the lookup: PostgreSQL refuses NUL in text and the
    # driver cannot encode unpaired surrogates (both were 500s before).
    email = ma.fields.String(
        required=True,
        validate=[ma.validate.Length(min=1, max=320), printable],
        metadata={"example": "ops@example.com"},
    )
    password = ma.fields.String(
        required=True, validate=[ma.validate.Length(min=1, max=PASSWORD_MAX), unicode_text]
    )


class SessionSchema(Schema):
    id = ma.fields.String(required=True, metadata={"example": "ses_01JD3Y9X8M2K4Q7R5T6V8W0Z1A"})
    tenant_id = ma.fields.String(required=True, metadata={"format": "uuid"})
    member_id = ma.fields.String(
        required=True, allow_none=True, metadata={"description": "Null for a portal link's."}
    )
    email = ma.fields.String(required=True, allow_none=True)
    role = ma.fields.String(required=True, metadata={"enum": list(ROLES)})
    csrf_token = ma.fields.String(
        metadata={
            "description": "Only in the sign-in response: send it as X-CSRF-Token on "
            "every unsafe request of this session."
        }
    )
    created_at = Timestamp(required=True)
    expires_at = Timestamp(required=True)


class SessionEnvelopeSchema(Schema):
    session = ma.fields.Nested(SessionSchema, required=True)


def _document(record: PortalSession, member: Member | None) -> dict[str, Any]:
    """A member's session, or (member None) one a portal link opened."""
    return {
        "id": record.id,
        "tenantId": record.tenant_id,
        "memberId": member.id if member else None,
        "email": member.email if member else None,
        "role": member.role if member else record.role,
        "createdAt": iso_ms(record.created_at),
        "expiresAt": iso_ms(record.expires_at),
    }


def _signed_in(body: dict[str, Any], issued: service.IssuedSession) -> Response:
    """The session with its CSRF token (shown once), and the cookie."""
    response = json_response({"session": {**body, "csrfToken": issued.csrf_token}})
    response.set_cookie(auth.SESSION_COOKIE, issued.token, **_cookie_options())
    return response


def _cookie_options() -> dict[str, Any]:
    return {
        "httponly": True,
        "samesite": "Lax",
        "path": "/v1",
        "secure": not core().config.is_dev,
    }


@blp.route("/sessions")
class Sessions(MethodView):
    @blp.arguments(SignInSchema)
    @blp.response(200, SessionEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(401, schema=ErrorSchema, description="unauthorized: wrong email or password")
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.alt_response(
        429,
        schema=ErrorSchema,
        description="rate_limited: too many failed sign-ins from this address or for this "
        "account; Retry-After says when to try again (the wait doubles with each failure)",
        headers={"Retry-After": {"schema": {"type": "integer"}}},
    )
    @blp.alt_response(
        503,
        schema=ErrorSchema,
        description="service_unavailable: the process is checking as many passwords as it "
        "may at once; retry after Retry-After (1 s)",
        headers={"Retry-After": {"schema": {"type": "integer"}}},
    )
    def post(self, args: dict[str, Any]) -> Response:
        """Sign in: sets the HttpOnly `settle_session` cookie and returns the CSRF token once."""
        email, password = args["email"], args["password"]

        def check() -> tuple[dict[str, Any], service.IssuedSession]:
            with auth.identity_db().transaction() as session:
                issued = service.sign_in(session, email, password)
                return _document(issued.record, issued.member), issued

        client = request.remote_addr or "unknown"
        body, issued = signin_guard.current_guard().attempt(email, client, check)
        return _signed_in(body, issued)


class OpenLinkSchema(Schema):
    token = ma.fields.String(
        required=True,
        validate=[ma.validate.Length(min=1, max=200), printable],
        metadata={"description": "The token after `#` in the portal link's URL."},
    )


@blp.route("/sessions/portal-link")
class PortalLinkSessions(MethodView):
    @blp.arguments(OpenLinkSchema)
    @blp.response(200, SessionEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(
        401, schema=ErrorSchema, description="unauthorized: the link expired or was used"
    )
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    def post(self, args: dict[str, Any]) -> Response:
        """Open a portal link: a session of the link's role for the webhook pages.

        A link opens one session, once; after that (or after it expires) it is 401.
        The session has no member (`memberId` and `email` are null) and lasts one hour.
        """
        with auth.identity_db().transaction() as session:
            issued = portal_links.open_link(session, args["token"])
            body = _document(issued.record, issued.member)
        return _signed_in(body, issued)


@blp.route("/sessions/current")
class CurrentSession(MethodView):
    @auth.member(blp, "viewer", links=True)
    @blp.response(200, SessionEnvelopeSchema)
    def get(self) -> Response:
        """The signed-in member's session (without the CSRF token)."""
        session_id = auth.current_principal().session_id
        with auth.identity_db().reader() as session:
            record = session.get(PortalSession, session_id)
            member = session.get(Member, record.member_id) if record and record.member_id else None
            if record is None or (member is None and record.portal_link_id is None):
                raise Unauthorized("the session has ended; sign in again")
            body = _document(record, member)
        return json_response({"session": body})

    @auth.member(blp, "viewer", links=True)
    @blp.response(204)
    def delete(self) -> Response:
        """Sign out: ends the session and clears the cookie."""
        session_id = auth.current_principal().session_id
        assert session_id is not None
        with auth.identity_db().transaction() as session:
            service.end_session(session, session_id)
        response = Response(status=204)
        response.delete_cookie(auth.SESSION_COOKIE, **_cookie_options())
        return response
