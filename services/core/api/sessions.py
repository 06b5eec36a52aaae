"""Portal sessions: sign in (cookie + CSRF token, a second factor when the member has
one), who am I, step up for a sensitive change, sign out. Each sign-in, failed sign-in
and step-up is an audit event."""

from __future__ import annotations

from typing import Any

import marshmallow as ma
import sqlalchemy as sa
from flask import Response, request
from flask.views import MethodView
from sqlalchemy.orm import Session

from services.core.api.schemas import ERROR_DESCRIPTIONS, json_response, printable
from services.core.context import core
from shared.api import Blueprint, ErrorSchema, Schema, Timestamp, field_error, no_store
from shared.audit.log import ANONYMOUS, MEMBER, PORTAL_LINK, Actor, Change, record, record_alone
from shared.db import Database
from shared.errors import Unauthorized
from shared.identity import auth, mfa, portal_links, service, signin_guard
from shared.identity.models import ROLES, Member, PortalSession, Tenant
from shared.timefmt import iso_ms

blp = Blueprint(
    "sessions",
    __name__,
    url_prefix="/v1",
    description="Portal sign-in. Unsafe requests on a session need the X-CSRF-Token header.",
)
# Sessions, CSRF tokens, TOTP secrets and recovery codes: never kept by a cache.
blp.after_request(no_store)

#: Longest password we hash (argon2 work grows with the input).
PASSWORD_MAX = 1024


def unicode_text(value: str) -> None:
    """Text the password hash can take: UTF-8 encodable (no unpaired surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ma.ValidationError("must not contain unpaired surrogates") from None


def password_field(**kwargs: object) -> ma.fields.String:
    """A password as the hash takes it: 1..PASSWORD_MAX characters, UTF-8 encodable."""
    return ma.fields.String(
        validate=[ma.validate.Length(min=1, max=PASSWORD_MAX), unicode_text], **kwargs
    )


def code_field(description: str) -> ma.fields.String:
    """A second-factor code: the app's 6 digits or a recovery code."""
    return ma.fields.String(
        validate=[ma.validate.Length(min=1, max=64), printable],
        metadata={"description": description},
    )


class SignInSchema(Schema):
    # Checked here, not left to the lookup: PostgreSQL refuses NUL in text and the
    # driver cannot encode unpaired surrogates (both were 500s before).
    email = ma.fields.String(
        required=True,
        validate=[ma.validate.Length(min=1, max=320), printable],
        metadata={"example": "ops@example.com"},
    )
    password = password_field(required=True)
    code = code_field(
        "For a member with two-factor sign-in: the 6-digit code of their authenticator "
        "app, or one of their recovery codes (each works once). Without it such a "
        "member's right password answers 401 `mfa_required`."
    )
    tenantId = ma.fields.String(
        validate=[ma.validate.Length(min=1, max=40), printable],
        metadata={
            "description": "Only for a person who is a member of several tenants with one "
            "email and password: which tenant to sign in to (without it such a sign-in "
            "answers 400 naming `tenantId`).",
            "example": "ten_01J9Z3V8J5X2Q4N6M8P0R2S4T6",
        },
    )


class StepUpSchema(Schema):
    password = password_field(metadata={"description": "For a member without two-factor sign-in."})
    code = code_field("For a member with it: an app code or a recovery code.")


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
    mfa_enabled = ma.fields.Boolean(
        required=True, metadata={"description": "The member signs in with a second factor."}
    )
    mfa_enrolment_required = ma.fields.Boolean(
        required=True,
        metadata={
            "description": "The tenant requires a second factor and the member has none: "
            "until they enrol, other routes answer 403 `mfa_enrolment_required`."
        },
    )
    step_up_expires_at = Timestamp(
        required=True,
        allow_none=True,
        metadata={
            "description": "Until when sensitive changes need no password or code (5 minutes "
            "after the last one given)."
        },
    )


class SessionEnvelopeSchema(Schema):
    session = ma.fields.Nested(SessionSchema, required=True)


def _document(session: Session, record: PortalSession, member: Member | None) -> dict[str, Any]:
    """A member's session, or (member None) one a portal link opened."""
    enrol = member is not None and not member.mfa_enabled and _requires_mfa(session, member)
    factor = record.factor_at
    return {
        "id": record.id,
        "tenantId": record.tenant_id,
        "memberId": member.id if member else None,
        "email": member.email if member else None,
        "role": member.role if member else record.role,
        "createdAt": iso_ms(record.created_at),
        "expiresAt": iso_ms(record.expires_at),
        "mfaEnabled": bool(member and member.mfa_enabled),
        "mfaEnrolmentRequired": enrol,
        "stepUpExpiresAt": None if factor is None else iso_ms(factor + auth.STEP_UP_WINDOW),
    }


def _requires_mfa(session: Session, member: Member) -> bool:
    return bool(session.scalar(sa.select(Tenant.require_mfa).where(Tenant.id == member.tenant_id)))


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
        """Sign in: sets the HttpOnly `settle_session` cookie and returns the CSRF token once.

        A member with two-factor sign-in sends `code` too; without it, a right password
        answers 401 `mfa_required` (send the same call again with `code`). Wrong codes
        count as failed sign-ins (throttled alike); a code works once.
        """
        email, password, code = args["email"], args["password"], args.get("code")
        tenant_id = args.get("tenantId")
        box = mfa.secret_box(core().config.secret_key)
        log = auth.identity_db()

        def check() -> tuple[dict[str, Any], service.IssuedSession]:
            try:
                with log.transaction() as session:
                    issued = service.sign_in(
                        session, email, password, tenant_id=tenant_id, code=code, box=box
                    )
                    member = issued.member
                    assert member is not None
                    after = {"sessionId": issued.record.id, "secondFactor": issued.second_factor}
                    change = Change("session.signed_in", "member", member.id, after=after)
                    record(session, member.tenant_id, change, Actor(MEMBER, member.id))
                    return _document(session, issued.record, member), issued
            except service.SignInRefused as refused:
                _record_refusal(log, "session.sign_in_failed", refused)
                raise

        client = request.remote_addr or "unknown"
        body, issued = signin_guard.current_guard().attempt(
            email, client, check, second_factor=code is not None
        )
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
            link_id = issued.record.portal_link_id
            after = {"sessionId": issued.record.id, "role": issued.record.role}
            change = Change("portal_link.opened", "portal_link", link_id, after=after)
            record(session, issued.record.tenant_id, change, Actor(PORTAL_LINK, link_id))
            body = _document(session, issued.record, issued.member)
        return _signed_in(body, issued)


@blp.route("/sessions/current")
class CurrentSession(MethodView):
    @auth.member(blp, "viewer", links=True, enrolling=True)
    @blp.response(200, SessionEnvelopeSchema)
    def get(self) -> Response:
        """The signed-in member's session (without the CSRF token)."""
        session_id = auth.current_principal().session_id
        with auth.identity_db().reader() as session:
            record = session.get(PortalSession, session_id)
            member = session.get(Member, record.member_id) if record and record.member_id else None
            if record is None or (member is None and record.portal_link_id is None):
                raise Unauthorized("the session has ended; sign in again")
            body = _document(session, record, member)
        return json_response({"session": body})

    @auth.member(blp, "viewer", links=True, enrolling=True)
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


def _record_refusal(log: Database, action: str, refused: service.SignInRefused) -> None:
    """A refused sign-in or step-up of a known member, in the member's tenant's log.

    An unknown email belongs to no tenant, so it is not recorded (the log's metric and
    lines count it)."""
    if refused.tenant_id is None:
        return
    after = {"reason": refused.reason}
    change = Change(action, "member", refused.member_id, after=after)
    record_alone(log, refused.tenant_id, change, Actor(ANONYMOUS))


@blp.route("/sessions/current/step-up")
class StepUp(MethodView):
    # (enrolling: a member who must enrol steps up first when their sign-in is old)
    @auth.member(blp, "viewer", enrolling=True)
    @blp.arguments(StepUpSchema)
    @blp.response(200, SessionEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(
        401,
        schema=ErrorSchema,
        description="unauthorized (a wrong password or code), or mfa_required (a member with "
        "two-factor sign-in steps up with a code, not the password)",
    )
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.alt_response(
        429,
        schema=ErrorSchema,
        description="rate_limited: too many wrong passwords or codes (as for signing in)",
        headers={"Retry-After": {"schema": {"type": "integer"}}},
    )
    def post(self, args: dict[str, Any]) -> Response:
        """Give the password (or, with two-factor sign-in, a code) again before a
        sensitive change: for 5 minutes the session may change destinations and the
        policy, create API keys, change roles and rotate secrets.

        Send exactly one of `password` and `code`. Throttled like signing in.
        """
        principal = auth.current_principal()
        password, code = args.get("password"), args.get("code")
        if (password is None) == (code is None):
            raise field_error("password", "send exactly one of password and code")
        box = mfa.secret_box(core().config.secret_key)
        log = auth.identity_db()
        assert principal.member_id is not None and principal.session_id is not None
        with log.reader() as session:
            email = service.get_member(session, principal.tenant_id, principal.member_id).email

        def check() -> dict[str, Any]:
            try:
                with log.transaction() as session:
                    member = service.get_member(
                        session, principal.tenant_id, principal.member_id or ""
                    )
                    factor = service.step_up(session, member, password=password, code=code, box=box)
                    service.stepped_up(session, principal.session_id or "")
                    change = Change(
                        "session.stepped_up", "member", member.id, after={"factor": factor}
                    )
                    record(session, member.tenant_id, change, Actor(MEMBER, member.id))
                    stored = session.get(PortalSession, principal.session_id)
                    assert stored is not None
                    session.refresh(stored)
                    return _document(session, stored, member)
            except service.SignInRefused as refused:
                _record_refusal(log, "session.step_up_failed", refused)
                raise

        client = request.remote_addr or "unknown"
        body = signin_guard.current_guard().attempt(
            email, client, check, second_factor=code is not None
        )
        return json_response({"session": body})
