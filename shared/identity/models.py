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
}


def role_at_least(role: str, minimum: str) -> bool:
    """Whether `role` is `minimum` or higher (an unknown role is nothing)."""
    return role in ROLES and ROLES.index(role) >= ROLES.index(minimum)


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


class PortalSession(IdentityBase):
    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    csrf_hash: Mapped[str] = mapped_column(sa.String(64))
    member_id: Mapped[str] = mapped_column(sa.ForeignKey("members.id"), index=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
