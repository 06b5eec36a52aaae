"""Portal links: a one-time URL that opens the portal's webhook pages for a tenant.

A tenant's server asks for a link (`POST /v1/portal-links`) and hands it to its own
support staff, who are not members. Opening the link trades its token for a session
with the link's role that reaches the webhook routes only (`LINK_SCOPES`). The token
is stored hashed, works once (the first open marks it used, atomically), and expires
within 15 minutes whether used or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from shared.errors import Forbidden, InvalidRequest, Unauthorized
from shared.identity.models import LINK_ROLES, PortalLink
from shared.identity.principal import Principal
from shared.identity.secrets import new_link_token, token_hash
from shared.identity.service import IssuedSession, issue_session
from shared.ids import new_id
from shared.timefmt import utcnow

#: The longest a link may wait to be opened (the issue's bound), and the shortest.
LINK_TTL_MAX = timedelta(minutes=15)
LINK_TTL_MIN = timedelta(seconds=30)
#: How long the session a link opens lasts (a member's lasts 12 h).
LINK_SESSION_TTL = timedelta(hours=1)


@dataclass(frozen=True)
class IssuedLink:
    """A link as created: the token exists only here."""

    token: str
    record: PortalLink


def create_link(
    session: Session,
    actor: Principal,
    role: str,
    ttl: timedelta = LINK_TTL_MAX,
    *,
    now: datetime | None = None,
) -> IssuedLink:
    """A one-time link for the actor's tenant with `role` (one the actor may give)."""
    if role not in LINK_ROLES:
        raise InvalidRequest(f"role: a portal link carries one of {', '.join(LINK_ROLES)}")
    if not LINK_TTL_MIN <= ttl <= LINK_TTL_MAX:
        raise InvalidRequest(
            f"expiresInSeconds: {int(LINK_TTL_MIN.total_seconds())}.."
            f"{int(LINK_TTL_MAX.total_seconds())}"
        )
    if not actor.may_grant_link(role):
        raise Forbidden(f"a {role}'s link would do what you may not (webhooks:read/write)")
    now = now or utcnow()
    token = new_link_token()
    record = PortalLink(
        id=new_id("pl"),
        tenant_id=actor.tenant_id,
        token_hash=token_hash(token),
        role=role,
        created_by=actor.actor_id,
        created_at=now,
        expires_at=now + ttl,
    )
    session.add(record)
    session.flush()
    return IssuedLink(token, record)


def open_link(session: Session, token: str, *, now: datetime | None = None) -> IssuedSession:
    """Trade a link's token for a session, once; an expired or used link is 401.

    The link is marked used by one conditional UPDATE, so of two opens racing with
    the same token exactly one gets a session.
    """
    if not token.startswith("plk_") or len(token) > 200:
        raise Unauthorized("the portal link has expired or was already used")
    # The row first, then the clock: a revocation holding the row (service.end_grants)
    # has committed its expires_at by then, and a clock read earlier would be before it.
    session.execute(
        sa.select(PortalLink.id).where(PortalLink.token_hash == token_hash(token)).with_for_update()
    )
    now = now or utcnow()
    link = session.execute(
        sa.update(PortalLink)
        .where(
            PortalLink.token_hash == token_hash(token),
            PortalLink.used_at.is_(None),
            PortalLink.expires_at > now,
        )
        .values(used_at=now)
        .returning(PortalLink)
    ).scalar_one_or_none()
    if link is None:
        raise Unauthorized("the portal link has expired or was already used")
    return issue_session(session, link.tenant_id, link=link, ttl=LINK_SESSION_TTL, now=now)
