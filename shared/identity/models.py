"""Identity tables: tenants, API keys, portal members, sessions.

They live in core's database; the notifier reads them (SETTLE_IDENTITY_DATABASE_URL).
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.db import JSONType, UTCDateTime
from shared.timefmt import utcnow

#: Portal roles, lowest first.
ROLES: tuple[str, ...] = ("viewer", "developer", "admin", "owner")

#: Every API key scope.
SCOPES: tuple[str, ...] = (
    "destination_policy:read",
    "destination_policy:write",
    "deposit_accounts:read",
    "deposit_accounts:write",
    "deposits:read",
    "fees:read",
    "webhooks:read",
    "webhooks:write",
    "sandbox:write",
    "portal:write",
    "api_keys:write",
    "members:write",
)

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

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"), index=True)
    #: Lower-cased; a person signs in to one tenant.
    email: Mapped[str] = mapped_column(sa.String(320), unique=True)
    password_hash: Mapped[str] = mapped_column(sa.String(255))
    role: Mapped[str] = mapped_column(sa.String(20))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class PortalLink(IdentityBase):
    """A one-time URL that opens the portal's webhook pages for a tenant with a role."""

    __tablename__ = "portal_links"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"))
    #: SHA-256 of the link's token; the token is in the URL handed out once.
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    role: Mapped[str] = mapped_column(sa.String(20))
    #: The API key or member that made the link.
    created_by: Mapped[str] = mapped_column(sa.String(40))
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
        sa.ForeignKey("portal_links.id"), nullable=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
