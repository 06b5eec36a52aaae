"""Identity tables: tenants, API keys, portal members, sessions, second factors, audit log.

They live in core's database; the notifier reads them (SETTLE_IDENTITY_DATABASE_URL)
and appends to the audit log (`audit_events`, shared/audit/).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.db import JSONType, UTCDateTime
from shared.identity.scopes import ROLES as ROLES  # re-exported: defined there, light
from shared.identity.scopes import SCOPES as SCOPES
from shared.timefmt import utcnow

#: The lowest role whose session may do what a key with each scope may do. A viewer
#: reads everything of its tenant; a developer also writes (policy, destinations,
#: endpoints, test sends, replays, recoveries, sandbox deposits).
SCOPE_ROLES: dict[str, str] = {
    "destination_policy:read": "viewer",
    "destination_policy:write": "developer",
    "deposit_accounts:read": "viewer",
    "deposit_accounts:write": "developer",
    "deposits:read": "viewer",
    "fees:read": "viewer",
    "webhooks:read": "viewer",
    "webhooks:write": "developer",
    "sandbox:write": "developer",
    # An admin also hands out access: portal links, API keys, members.
    "portal:write": "admin",
    "api_keys:write": "admin",
    "members:write": "admin",
    # Who did what to the tenant: admins and owners read it.
    "audit:read": "admin",
}

#: What a session opened by a portal link may do: the webhook pages, nothing else.
LINK_SCOPES: frozenset[str] = frozenset({"webhooks:read", "webhooks:write"})
#: Roles a portal link may carry (the webhook pages need no more than a developer).
LINK_ROLES: tuple[str, ...] = ("viewer", "developer")


def role_at_least(role: str | None, minimum: str) -> bool:
    """Whether `role` is `minimum` or higher (an unknown role is nothing)."""
    return role in ROLES and ROLES.index(role) >= ROLES.index(minimum)


def role_scopes(role: str | None) -> frozenset[str]:
    """The scopes a session of `role` acts with."""
    return frozenset(scope for scope, needed in SCOPE_ROLES.items() if role_at_least(role, needed))


class IdentityBase(DeclarativeBase):
    pass


class Tenant(IdentityBase):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    sandbox: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: Every member must sign in with a second factor (an owner's choice).
    require_mfa: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())


class ApiKey(IdentityBase):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"), index=True)
    #: SHA-256 of the whole key; the key itself is shown once and never stored.
    key_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    #: First characters of the key, so people can tell keys apart.
    key_prefix: Mapped[str] = mapped_column(sa.String(16))
    #: A label people give the key ("billing server"); optional.
    name: Mapped[str | None] = mapped_column(sa.String(100), nullable=True)
    scopes: Mapped[list[str]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Member(IdentityBase):
    __tablename__ = "members"
    __table_args__ = (sa.UniqueConstraint("tenant_id", "email", name="uq_members_tenant_email"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"), index=True)
    #: Lower-cased; unique within the tenant (identity_0004): one tenant can neither
    #: learn of nor squat another's member by adding their address.
    email: Mapped[str] = mapped_column(sa.String(320), index=True)
    password_hash: Mapped[str] = mapped_column(sa.String(255))
    role: Mapped[str] = mapped_column(sa.String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: The TOTP secret (encrypted, shared/identity/mfa.py) once enrolment is confirmed.
    totp_secret: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    totp_enabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: The time step of the last code accepted: a code is good once (no replay in its window).
    totp_last_step: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    #: An enrolment started and not yet confirmed with a code (encrypted), and when.
    totp_pending_secret: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    totp_pending_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    @property
    def mfa_enabled(self) -> bool:
        return self.totp_secret is not None


class RecoveryCode(IdentityBase):
    """One of a member's one-time recovery codes (for a lost authenticator), hashed."""

    __tablename__ = "recovery_codes"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    member_id: Mapped[str] = mapped_column(
        sa.ForeignKey("members.id", ondelete="CASCADE"), index=True
    )
    #: SHA-256 of the normalized code (80 random bits: a fast hash is enough).
    code_hash: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class PortalLink(IdentityBase):
    """A one-time URL that opens the portal's webhook pages for a tenant with a role."""

    __tablename__ = "portal_links"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"))
    #: SHA-256 of the link's token; the token is in the URL handed out once.
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    role: Mapped[str] = mapped_column(sa.String(20))
    #: The API key or member that made the link (indexed: revoking it ends its links).
    created_by: Mapped[str] = mapped_column(sa.String(40), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: Set when the link opened its session: a link opens one, once.
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class PortalSession(IdentityBase):
    """A signed-in member's session, or (no member) one a portal link opened."""

    __tablename__ = "sessions"
    __table_args__ = (
        sa.CheckConstraint(
            "(member_id IS NOT NULL) <> (portal_link_id IS NOT NULL)",
            name="ck_sessions_member_or_link",
        ),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    csrf_hash: Mapped[str] = mapped_column(sa.String(64))
    member_id: Mapped[str | None] = mapped_column(
        sa.ForeignKey("members.id"), index=True, nullable=True
    )
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"))
    #: The role of a link's session (a member's session has its member's current role).
    role: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    portal_link_id: Mapped[str | None] = mapped_column(
        sa.ForeignKey("portal_links.id"), index=True, nullable=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    #: When this session last gave a factor: the password or a code (signing in, or a
    #: step-up), or a portal link's token. Sensitive changes need it recent (step-up).
    factor_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class AuditEvent(IdentityBase):
    """One entry of a tenant's audit log: who changed what, when, from where.

    Append-only (a trigger refuses UPDATE, DELETE and TRUNCATE) and chained: `hash` is
    the SHA-256 of the entry's canonical form, which includes `prev_hash`, the hash of
    the tenant's entry before it (shared/audit/chain.py).
    """

    __tablename__ = "audit_events"
    __table_args__ = (
        sa.UniqueConstraint("tenant_id", "sequence", name="uq_audit_events_tenant_sequence"),
        sa.Index("ix_audit_events_tenant_actor", "tenant_id", "actor_id", "sequence"),
        sa.Index("ix_audit_events_tenant_action", "tenant_id", "action", "sequence"),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"))
    #: Position in the tenant's chain: 1, 2, 3 ... without gaps.
    sequence: Mapped[int] = mapped_column(sa.BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    action: Mapped[str] = mapped_column(sa.String(64))
    #: api_key, member, portal_link, ops or anonymous (a failed sign-in).
    actor_type: Mapped[str] = mapped_column(sa.String(20))
    actor_id: Mapped[str | None] = mapped_column(sa.String(200), nullable=True)
    #: What people read: a member's email, ops' OS user and host.
    actor_name: Mapped[str | None] = mapped_column(sa.String(320), nullable=True)
    target_type: Mapped[str] = mapped_column(sa.String(40))
    target_id: Mapped[str | None] = mapped_column(sa.String(300), nullable=True)
    before: Mapped[Any] = mapped_column(JSONType, nullable=True)
    after: Mapped[Any] = mapped_column(JSONType, nullable=True)
    ip: Mapped[str | None] = mapped_column(sa.String(64), nullable=True)
    request_id: Mapped[str | None] = mapped_column(sa.String(128), nullable=True)
    prev_hash: Mapped[str] = mapped_column(sa.String(64))
    hash: Mapped[str] = mapped_column(sa.String(64))
