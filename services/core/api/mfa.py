"""Two-factor sign-in: a member enrols an authenticator app (TOTP), keeps recovery codes,
turns it off; an owner requires it for every member; an admin resets a member's.

Every change here is an audit event. Turning it on or off, new recovery codes, a reset
and the tenant's requirement are sensitive changes (a fresh password or code).
"""

from __future__ import annotations

from typing import Any

import marshmallow as ma
import sqlalchemy as sa
from flask import Response
from flask.views import MethodView
from sqlalchemy.orm import Session

from services.core.api.schemas import ERROR_DESCRIPTIONS, json_response
from services.core.context import core
from services.core.models import IdempotencyRecord
from shared.api import Blueprint, ErrorSchema, Schema, StrictBoolean, Timestamp, no_store
from shared.audit.log import Change, record_request
from shared.errors import Conflict, Forbidden
from shared.idempotency import OPENAPI_PARAMETER, idempotent
from shared.identity import auth, mfa
from shared.identity import service as identity
from shared.identity.models import Member, Tenant
from shared.secretbox import SecretBox
from shared.timefmt import iso_ms

blp = Blueprint(
    "mfa",
    __name__,
    url_prefix="/v1",
    description="Two-factor sign-in (TOTP authenticator apps, recovery codes) for portal "
    "members, and a tenant's requirement of it.",
)
# Sessions, CSRF tokens, TOTP secrets and recovery codes: never kept by a cache.
blp.after_request(no_store)


class MfaSchema(Schema):
    enabled = ma.fields.Boolean(required=True)
    enabled_at = Timestamp(required=True, allow_none=True)
    recovery_codes_left = ma.fields.Integer(required=True)
    required_by_tenant = ma.fields.Boolean(required=True)


class MfaEnvelopeSchema(Schema):
    mfa = ma.fields.Nested(MfaSchema, required=True)


class EnrolmentSchema(Schema):
    secret = ma.fields.String(
        required=True,
        metadata={"description": "Base32, for apps that cannot scan: shown in this response only."},
    )
    otpauth_url = ma.fields.String(
        required=True, metadata={"example": "otpauth://totp/Settle:ops%40example.com?secret=..."}
    )
    qr_code = ma.fields.String(
        required=True,
        metadata={"description": "The otpauth URL as a QR code: an SVG `data:` URI."},
    )
    expires_at = Timestamp(
        required=True, metadata={"description": "Confirm with a code before this."}
    )


class EnrolmentEnvelopeSchema(Schema):
    enrolment = ma.fields.Nested(EnrolmentSchema, required=True)


class ConfirmSchema(Schema):
    code = ma.fields.String(
        required=True,
        validate=ma.validate.Regexp(r"^\d{6}$", error="must be the app's 6-digit code"),
        metadata={"example": "492039"},
    )


class RecoveryCodesSchema(Schema):
    recovery_codes = ma.fields.List(
        ma.fields.String(),
        required=True,
        metadata={
            "description": "Ten one-time codes for when the app is lost: shown in this "
            "response only (Settle keeps their hashes)."
        },
    )


class ConfirmedSchema(RecoveryCodesSchema):
    mfa = ma.fields.Nested(MfaSchema, required=True)


class SecuritySchema(Schema):
    require_mfa = StrictBoolean(
        required=True,
        metadata={
            "description": "Every member signs in with a second factor; one without enrols "
            "before anything else."
        },
    )


class SecurityEnvelopeSchema(Schema):
    security = ma.fields.Nested(SecuritySchema, required=True)


def _box() -> SecretBox:
    return mfa.secret_box(core().config.secret_key)


def _me(session: Session) -> Member:
    principal = auth.current_principal()
    assert principal.member_id is not None
    return identity.get_member(session, principal.tenant_id, principal.member_id, lock=True)


def _required(session: Session, tenant_id: str) -> bool:
    return bool(session.scalar(sa.select(Tenant.require_mfa).where(Tenant.id == tenant_id)))


def _state(session: Session, member: Member) -> dict[str, Any]:
    enabled_at = member.totp_enabled_at
    return {
        "enabled": member.mfa_enabled,
        "enabledAt": None if enabled_at is None else iso_ms(enabled_at),
        "recoveryCodesLeft": mfa.recovery_codes_left(session, member.id),
        "requiredByTenant": _required(session, member.tenant_id),
    }


def _mfa_change(action: str, member: Member, before: bool, after: bool) -> Change:
    return Change(action, "member", member.id, {"mfaEnabled": before}, {"mfaEnabled": after})


_CONFLICT = "conflict (already on, or no enrolment in progress), idempotency_key_reused"


@blp.route("/me/mfa")
class MyMfa(MethodView):
    @auth.member(blp, "viewer", enrolling=True)
    @blp.response(200, MfaEnvelopeSchema)
    def get(self) -> Response:
        """The signed-in member's two-factor sign-in: on or off, recovery codes left."""
        with auth.identity_db().reader() as session:
            return json_response({"mfa": _state(session, _me(session))})

    @auth.member(blp, "viewer", step_up=True)
    @blp.response(204)
    @blp.alt_response(409, schema=ErrorSchema, description="conflict: the tenant requires it")
    def delete(self) -> Response:
        """Turn two-factor sign-in off (the secret and recovery codes go)."""
        with auth.identity_db().transaction() as session:
            member = _me(session)
            if _required(session, member.tenant_id):
                raise Conflict("your tenant requires two-factor sign-in; it stays on")
            was = member.mfa_enabled
            mfa.disable(session, member)
            record_request(session, _mfa_change("mfa.disabled", member, was, False))
        return Response(status=204)


@blp.route("/me/mfa/enrolment")
class Enrolment(MethodView):
    @auth.member(blp, "viewer", enrolling=True, step_up=True)
    @idempotent(IdempotencyRecord)
    @blp.response(200, EnrolmentEnvelopeSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(
        409, schema=ErrorSchema, description="conflict (it is on already), idempotency_key_reused"
    )
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self) -> Response:
        """Start enrolling an authenticator app: a new secret, as an otpauth URL and its QR
        code. Nothing changes until a code confirms it (within 15 minutes)."""
        with auth.identity_db().transaction() as session:
            enrolment = mfa.start_enrolment(session, _me(session), _box())
        body = {
            "secret": enrolment.secret,
            "otpauthUrl": enrolment.otpauth_url,
            "qrCode": enrolment.qr_svg,
            "expiresAt": iso_ms(enrolment.expires_at),
        }
        return json_response({"enrolment": body})


@blp.route("/me/mfa/enrolment/confirm")
class ConfirmEnrolment(MethodView):
    @auth.member(blp, "viewer", enrolling=True)
    @idempotent(IdempotencyRecord)
    @blp.arguments(ConfirmSchema)
    @blp.response(200, ConfirmedSchema)
    @blp.alt_response(400, schema=ErrorSchema, description="invalid_request: a wrong code")
    @blp.alt_response(409, schema=ErrorSchema, description=_CONFLICT)
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self, args: dict[str, Any]) -> Response:
        """Turn two-factor sign-in on with a code the app shows; the ten recovery codes
        (in this response only)."""
        with auth.identity_db().transaction() as session:
            member = _me(session)
            codes = mfa.confirm_enrolment(session, member, _box(), args["code"])
            record_request(session, _mfa_change("mfa.enabled", member, False, True))
            state = _state(session, member)
        return json_response({"mfa": state, "recoveryCodes": codes})


@blp.route("/me/mfa/recovery-codes")
class RecoveryCodes(MethodView):
    @auth.member(blp, "viewer", step_up=True)
    @idempotent(IdempotencyRecord)
    @blp.response(200, RecoveryCodesSchema)
    @blp.alt_response(400, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[400])
    @blp.alt_response(
        409,
        schema=ErrorSchema,
        description="conflict (two-factor sign-in is off), idempotency_key_reused",
    )
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    @blp.doc(parameters=[OPENAPI_PARAMETER])
    def post(self) -> Response:
        """Ten new recovery codes (shown once); the earlier ones stop working."""
        with auth.identity_db().transaction() as session:
            member = _me(session)
            if not member.mfa_enabled:
                raise Conflict("two-factor sign-in is off: there are no recovery codes")
            codes = mfa.replace_recovery_codes(session, member)
            after = {"recoveryCodes": len(codes)}
            change = Change("mfa.recovery_codes_replaced", "member", member.id, None, after)
            record_request(session, change)
        return json_response({"recoveryCodes": codes})


@blp.route("/members/<memberId>/mfa")
class MemberMfa(MethodView):
    @auth.requires(blp, "members:write", step_up=True)
    @blp.response(204)
    @blp.alt_response(404, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[404])
    def delete(self, memberId: str) -> Response:
        """Reset a member's two-factor sign-in (a lost phone and lost recovery codes): they
        sign in with the password alone, and enrol again if the tenant requires it.

        The caller may handle the member's role (an admin never resets an owner)."""
        principal = auth.current_principal()
        with auth.identity_db().transaction() as session:
            member = identity.get_member(session, principal.tenant_id, memberId, lock=True)
            if not principal.may_grant_role(member.role):
                raise Forbidden(f"you may not change a member with the {member.role} role")
            was = member.mfa_enabled
            mfa.disable(session, member)
            record_request(session, _mfa_change("mfa.reset", member, was, False))
        return Response(status=204)


@blp.route("/tenants/<tenantId>/security")
class TenantSecurity(MethodView):
    @auth.member(blp, "viewer", tenant_arg="tenantId")
    @blp.response(200, SecurityEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[404])
    def get(self, tenantId: str) -> Response:
        """The tenant's sign-in rules, for any member."""
        with auth.identity_db().reader() as session:
            required = _required(session, auth.current_principal().tenant_id)
        return json_response({"security": {"requireMfa": required}})

    @auth.member(blp, "owner", tenant_arg="tenantId", step_up=True)
    @blp.arguments(SecuritySchema)
    @blp.response(200, SecurityEnvelopeSchema)
    @blp.alt_response(404, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[404])
    @blp.alt_response(
        409, schema=ErrorSchema, description="conflict: turn on your own two-factor sign-in first"
    )
    @blp.alt_response(413, schema=ErrorSchema, description=ERROR_DESCRIPTIONS[413])
    def put(self, args: dict[str, Any], tenantId: str) -> Response:
        """Require (or stop requiring) two-factor sign-in of every member (owners only).

        Members without it are asked to enrol at their next request; the owner turning
        it on must have it already."""
        principal = auth.current_principal()
        required = args["require_mfa"]
        with auth.identity_db().transaction() as session:
            tenant = session.get(Tenant, principal.tenant_id, with_for_update=True)
            assert tenant is not None
            if required and not _me(session).mfa_enabled:
                raise Conflict(
                    "turn on your own two-factor sign-in first (POST /v1/me/mfa/enrolment)"
                )
            before, tenant.require_mfa = tenant.require_mfa, required
            change = Change(
                "tenant.mfa_requirement_changed",
                "tenant",
                tenant.id,
                {"requireMfa": before},
                {"requireMfa": required},
            )
            record_request(session, change)
        return json_response({"security": {"requireMfa": required}})
