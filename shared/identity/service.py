"""Identity use cases: tenants, API keys, members, sessions. Callers own the transaction."""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from shared.api import Page, field_error, keyset_page
from shared.db import Database
from shared.errors import Conflict, Forbidden, InvalidRequest, MfaRequired, NotFound, Unauthorized
from shared.identity import mfa
from shared.identity.models import (
    ROLES,
    SCOPES,
    ApiKey,
    Member,
    PortalLink,
    PortalSession,
    Tenant,
)
from shared.identity.principal import Principal
from shared.identity.secrets import (
    check_password,
    hash_password,
    new_api_key,
    new_csrf_token,
    new_session_token,
    token_hash,
)
from shared.ids import new_id
from shared.secretbox import SecretBox
from shared.timefmt import utcnow

#: How long a portal session lasts without signing in again.
SESSION_TTL = timedelta(hours=12)


@dataclass(frozen=True)
class IssuedKey:
    """An API key as created: the plain key exists only here."""

    api_key: str
    record: ApiKey


@dataclass(frozen=True)
class IssuedSession:
    """A session as created: the token and CSRF token exist only here."""

    token: str
    csrf_token: str
    record: PortalSession
    #: None for a session a portal link opened.
    member: Member | None
    #: The second factor signing in used (mfa.TOTP, mfa.RECOVERY_CODE), if any.
    second_factor: str | None = None


def check_scopes(scopes: Iterable[str]) -> list[str]:
    wanted = list(dict.fromkeys(scopes))
    unknown = [s for s in wanted if s not in SCOPES]
    if unknown:
        raise InvalidRequest(f"unknown scope(s): {', '.join(unknown)}; known: {', '.join(SCOPES)}")
    return wanted


def create_tenant(
    session: Session, name: str, *, sandbox: bool = False
) -> tuple[Tenant, IssuedKey]:
    """A tenant and a first API key with every scope."""
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidRequest("name must be 1..200 characters")
    tenant = Tenant(id=str(uuid.uuid4()), name=name, sandbox=sandbox, created_at=utcnow())
    session.add(tenant)
    session.flush()
    return tenant, create_api_key(session, tenant.id, SCOPES)


def create_api_key(
    session: Session, tenant_id: str, scopes: Iterable[str], *, name: str | None = None
) -> IssuedKey:
    scope_list = check_scopes(scopes)
    if session.get(Tenant, tenant_id) is None:
        raise NotFound(f"no tenant {tenant_id}")
    plain = new_api_key()
    record = ApiKey(
        id=new_id("key"),
        tenant_id=tenant_id,
        key_hash=token_hash(plain),
        key_prefix=plain[:10],
        name=name,
        scopes=scope_list,
        created_at=utcnow(),
    )
    session.add(record)
    session.flush()
    return IssuedKey(plain, record)


def list_api_keys(
    session: Session, tenant_id: str, *, limit: int, cursor: str | None = None
) -> Page[ApiKey]:
    """The tenant's keys, revoked ones too, newest first."""
    query = sa.select(ApiKey).where(ApiKey.tenant_id == tenant_id)
    return keyset_page(session, query, ApiKey.id, limit=limit, cursor=cursor)


def revoke_api_key(
    session: Session, key_id: str, *, tenant_id: str | None = None
) -> tuple[ApiKey, bool]:
    """Revoke a key; returns (key, newly_revoked). Revoking twice changes nothing.

    With `tenant_id`, another tenant's key answers 404 as one that does not exist.
    """
    query = sa.select(ApiKey).where(ApiKey.id == key_id)
    if tenant_id is not None:
        query = query.where(ApiKey.tenant_id == tenant_id)
    key = session.execute(query.with_for_update()).scalar_one_or_none()
    if key is None:
        raise NotFound(f"no API key {key_id}")
    if key.revoked_at is not None:
        return key, False
    key.revoked_at = utcnow()
    end_grants(session, key.id, now=key.revoked_at)
    session.flush()
    return key, True


def end_grants(session: Session, grantor_id: str, *, now: datetime | None = None) -> None:
    """End at once what a key or member handed out: its portal links, and the sessions
    they opened. A revoked key's (or removed member's) links must not outlive it.

    An unopened link expires now; opening it races this UPDATE on the link's row and
    rereads `expires_at` (open_link's WHERE), so it never opens after this commits.
    """
    now = now or utcnow()
    links = sa.select(PortalLink.id).where(PortalLink.created_by == grantor_id)
    session.execute(
        sa.update(PortalLink)
        .where(PortalLink.created_by == grantor_id, PortalLink.expires_at > now)
        .values(expires_at=now)
    )
    session.execute(
        sa.update(PortalSession)
        .where(PortalSession.portal_link_id.in_(links), PortalSession.revoked_at.is_(None))
        .values(revoked_at=now)
    )


@dataclass(frozen=True)
class ActiveKey:
    """What a request needs of an unrevoked API key and its tenant."""

    id: str
    tenant_id: str
    scopes: frozenset[str]
    sandbox: bool


#: One statement for the key and its tenant: one round trip per authenticated request.
#: The scopes come as their JSON text (`_scopes` parses each distinct text once).
_ACTIVE_KEY = (
    sa.select(ApiKey.id, ApiKey.tenant_id, sa.cast(ApiKey.scopes, sa.Text), Tenant.sandbox)
    .join(Tenant, Tenant.id == ApiKey.tenant_id)
    .where(ApiKey.key_hash == sa.bindparam("key_hash"), ApiKey.revoked_at.is_(None))
)


def authenticate_key(db: Database, plain: str) -> ActiveKey | None:
    """The unrevoked key with this value and its tenant's sandbox flag, or None.

    Every authenticated request runs it: one autocommitted statement on the fast
    executor (compiled once), as SQLAlchemy's layers cost more than the query itself.
    """
    if not _could_be_key(plain):
        return None
    lookup = db.attachment("identity.active_key", lambda d: d.driver_statement(_ACTIVE_KEY))
    with db.driver_autocommit(writes=False) as conn:
        row = conn.execute(lookup.sql, lookup.bind({"key_hash": token_hash(plain)})).fetchone()
    return None if row is None else _active_key(row)


def _could_be_key(plain: str) -> bool:
    return plain.startswith("sk_") and len(plain) <= 200


def _active_key(row: Any) -> ActiveKey:
    key_id, tenant_id, scopes, sandbox = row
    return ActiveKey(id=key_id, tenant_id=tenant_id, scopes=_scopes(scopes), sandbox=sandbox)


@functools.lru_cache(maxsize=256)
def _scopes(text: str) -> frozenset[str]:
    """A key's scopes from their stored JSON text.

    Cached by the text alone, so no key and no revocation state is kept: the lookup
    still reads the key on every request. psycopg's JSON loader (built per statement)
    and the parse cost a tenth of the lookup's CPU, for the few distinct scope sets
    there are.
    """
    return frozenset(json.loads(text))


def add_member(session: Session, tenant_id: str, email: str, role: str, password: str) -> Member:
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}")
    email = email.strip().lower()
    if "@" not in email or len(email) > 320:
        raise InvalidRequest("email is not an email address")
    if len(password) < 12:
        raise InvalidRequest("password must be at least 12 characters")
    if session.get(Tenant, tenant_id) is None:
        raise NotFound(f"no tenant {tenant_id}")
    # Within this tenant only: another tenant's members are not this tenant's business.
    taken = sa.select(Member.id).where(Member.tenant_id == tenant_id, Member.email == email)
    if session.execute(taken).first():
        raise Conflict(f"{email} is already a member")
    member = Member(
        id=new_id("mem"),
        tenant_id=tenant_id,
        email=email,
        password_hash=hash_password(password),
        role=role,
        created_at=utcnow(),
    )
    session.add(member)
    session.flush()
    return member


def list_members(
    session: Session, tenant_id: str, *, limit: int, cursor: str | None = None
) -> Page[Member]:
    """The tenant's members, newest first."""
    query = sa.select(Member).where(Member.tenant_id == tenant_id)
    return keyset_page(session, query, Member.id, limit=limit, cursor=cursor)


def get_member(session: Session, tenant_id: str, member_id: str, *, lock: bool = False) -> Member:
    """The tenant's member; another tenant's answers 404 as one that does not exist."""
    query = sa.select(Member).where(Member.id == member_id, Member.tenant_id == tenant_id)
    member = session.execute(query.with_for_update() if lock else query).scalar_one_or_none()
    if member is None:
        raise NotFound(f"no member {member_id}")
    return member


def change_role(
    session: Session, actor: Principal, member_id: str, role: str
) -> tuple[Member, str]:
    """Give a member of the actor's tenant another role; (the member, the role it had).

    The actor must be allowed both the member's current role and the new one (an
    admin neither makes nor unmakes an owner), and a tenant keeps at least one owner.
    """
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}")
    actor = _lock_tenant(session, actor)
    member = get_member(session, actor.tenant_id, member_id, lock=True)
    _may_handle(actor, member.role)
    _may_handle(actor, role)
    if member.role == "owner" and role != "owner":
        _keep_an_owner(session, actor.tenant_id)
    before, member.role = member.role, role
    session.flush()
    return member, before


def remove_member(session: Session, actor: Principal, member_id: str) -> Member:
    """Remove a member of the actor's tenant and end their sessions at once; the member."""
    actor = _lock_tenant(session, actor)
    member = get_member(session, actor.tenant_id, member_id, lock=True)
    _may_handle(actor, member.role)
    if member.role == "owner":
        _keep_an_owner(session, actor.tenant_id)
    session.execute(sa.delete(PortalSession).where(PortalSession.member_id == member.id))
    end_grants(session, member.id)
    session.delete(member)
    session.flush()
    return member


def grant_member(
    session: Session, actor: Principal, email: str, role: str, password: str
) -> Member:
    """`add_member` to the actor's tenant, with a role the actor may give."""
    if role in ROLES:
        _may_handle(_lock_tenant(session, actor), role)
    return add_member(session, actor.tenant_id, email, role, password)


def _may_handle(actor: Principal, role: str) -> None:
    if not actor.may_grant_role(role):
        raise Forbidden(f"you may not give or change the {role} role")


def _lock_tenant(session: Session, actor: Principal) -> Principal:
    """Serialise changes to one tenant's members; the actor as of now.

    The last-owner rule reads every member, so changes take turns. A member acting is
    judged by their role once the lock is held: one demoted a moment ago by a
    request that ran first no longer acts as what they were.
    """
    session.execute(sa.select(Tenant.id).where(Tenant.id == actor.tenant_id).with_for_update())
    if actor.member_id is None:
        return actor
    role = session.scalar(sa.select(Member.role).where(Member.id == actor.member_id))
    if role is None:
        raise Unauthorized("the session has ended; sign in again")
    return dataclasses.replace(actor, role=role)


def _keep_an_owner(session: Session, tenant_id: str) -> None:
    """Refuse the change if it would leave the tenant without an owner (409)."""
    owners = session.scalar(
        sa.select(sa.func.count())
        .select_from(Member)
        .where(Member.tenant_id == tenant_id, Member.role == "owner")
    )
    if (owners or 0) <= 1:
        raise Conflict("a tenant keeps at least one owner; make another owner first")


class SignInRefused(Unauthorized):
    """A refused sign-in or step-up, saying whose (when known) and why, for the audit log.

    `reason`: wrong_password, wrong_code, code_reused. The message a client reads does
    not tell an unknown email from a wrong password.
    """

    def __init__(self, message: str, member: Member | None, reason: str) -> None:
        super().__init__(message)
        self.member_id = member.id if member else None
        self.tenant_id = member.tenant_id if member else None
        self.reason = reason


def sign_in(
    session: Session,
    email: str,
    password: str,
    *,
    tenant_id: str | None = None,
    code: str | None = None,
    box: SecretBox | None = None,
    now: datetime | None = None,
) -> IssuedSession:
    """Check the password (and, for a member with a second factor, `code`) and open a
    session. The same 401 for every wrong email or password; 401 `mfa_required` when
    the password is right and a code is needed but missing.
    """
    member = _member_signing_in(session, email.strip().lower(), password, tenant_id)
    factor = second_factor(session, member, code, box, now=now)
    return open_session(session, member, now=now, second_factor=factor)


#: Members of one email checked at most (one person in more tenants than this signs in
#: with `tenantId`): bounds the password checks a sign-in costs.
MAX_MEMBERS_PER_EMAIL = 5


def _member_signing_in(
    session: Session, email: str, password: str, tenant_id: str | None
) -> Member:
    """The one member this email and password open, in `tenant_id` when given.

    An email is unique per tenant, so one person may be a member of several tenants. Each
    candidate's password is checked; when two or more match, the caller must say which
    tenant (400 naming `tenantId`, told only to whoever knows such a password). Refusals
    name the member only when there was one candidate (for that tenant's audit log).
    """
    query = sa.select(Member).where(Member.email == email).order_by(Member.id)
    if tenant_id is not None:
        query = query.where(Member.tenant_id == tenant_id)
    candidates = list(session.execute(query.limit(MAX_MEMBERS_PER_EMAIL)).scalars())
    if not candidates:
        check_password(None, password)  # the same time as a wrong password
    matching = [m for m in candidates if check_password(m.password_hash, password)]
    if not matching:
        only = candidates[0] if len(candidates) == 1 else None
        raise SignInRefused("email or password is wrong", only, "wrong_password")
    if len(matching) > 1:
        raise field_error(
            "tenantId", "this email and password are a member of several tenants: say which"
        )
    return matching[0]


def second_factor(
    session: Session,
    member: Member,
    code: str | None,
    box: SecretBox | None,
    *,
    now: datetime | None = None,
) -> str | None:
    """The member's second factor checked and used up: its kind, or None when they have
    none. Raises MfaRequired without a code, SignInRefused for a wrong or reused one."""
    if not member.mfa_enabled:
        return None
    if not code:
        raise MfaRequired(
            "enter the code your authenticator app shows (or a recovery code) as `code`"
        )
    assert box is not None, "a member with a second factor needs the TOTP box"
    checked = mfa.use_second_factor(session, member, box, code, now=now)
    if not checked.ok:
        assert checked.reason is not None
        raise SignInRefused("the code is wrong or was used already", member, checked.reason)
    return checked.used


def step_up(
    session: Session,
    member: Member,
    *,
    password: str | None,
    code: str | None,
    box: SecretBox,
    now: datetime | None = None,
) -> str:
    """Check the factor a signed-in member gives again; which one it was.

    A member with two-factor sign-in steps up with a code (their password alone is what
    a stolen cookie's thief may also have phished); others with their password.
    """
    if member.mfa_enabled:
        if code is None:
            raise MfaRequired("give a code from your authenticator app (or a recovery code)")
        factor = second_factor(session, member, code, box, now=now)
        assert factor is not None
        return factor
    if password is None:
        raise field_error("code", "you have no second factor: give your password")
    if not check_password(member.password_hash, password):
        raise SignInRefused("the password is wrong", member, "wrong_password")
    return "password"


def open_session(
    session: Session,
    member: Member,
    *,
    now: datetime | None = None,
    second_factor: str | None = None,
) -> IssuedSession:
    """A new session for `member`, who has proven who they are (just now: a step-up
    is not asked for the next five minutes)."""
    issued = issue_session(session, member.tenant_id, member=member, now=now)
    return dataclasses.replace(issued, second_factor=second_factor)


def issue_session(
    session: Session,
    tenant_id: str,
    *,
    member: Member | None = None,
    link: PortalLink | None = None,
    ttl: timedelta = SESSION_TTL,
    now: datetime | None = None,
) -> IssuedSession:
    """A new session of a member, or of a portal link (with the link's role)."""
    now = now or utcnow()
    token, csrf = new_session_token(), new_csrf_token()
    record = PortalSession(
        id=new_id("ses"),
        token_hash=token_hash(token),
        csrf_hash=token_hash(csrf),
        member_id=member.id if member else None,
        tenant_id=tenant_id,
        role=link.role if link else None,
        portal_link_id=link.id if link else None,
        created_at=now,
        expires_at=now + ttl,
        # A password (a member) or a one-time token (a link) was given just now.
        factor_at=now,
    )
    session.add(record)
    session.flush()
    return IssuedSession(token, csrf, record, member)


@dataclass(frozen=True)
class LiveSession:
    """What a request needs of a live portal session: who, with which role, of which tenant.

    A member's session has `member_id` and the member's current role; a session a
    portal link opened has `link_id` and the link's role.
    """

    id: str
    tenant_id: str
    sandbox: bool
    member_id: str | None
    link_id: str | None
    role: str
    csrf_hash: str
    factor_at: datetime | None
    #: The tenant requires a second factor, and this member has none yet.
    needs_enrolment: bool


#: The session, its member (if any) and its tenant in one statement: one round trip.
#: A member's session whose member is gone matches nothing (no member, no link).
_LIVE_SESSION = (
    sa.select(
        PortalSession.id,
        PortalSession.tenant_id,
        Tenant.sandbox,
        Member.id,
        PortalSession.portal_link_id,
        sa.func.coalesce(Member.role, PortalSession.role),
        PortalSession.csrf_hash,
        PortalSession.factor_at,
        sa.and_(Tenant.require_mfa, Member.id.is_not(None), Member.totp_secret.is_(None)),
    )
    .outerjoin(Member, Member.id == PortalSession.member_id)
    .join(Tenant, Tenant.id == PortalSession.tenant_id)
    .where(
        PortalSession.token_hash == sa.bindparam("token_hash"),
        PortalSession.revoked_at.is_(None),
        PortalSession.expires_at > sa.bindparam("now"),
        sa.or_(Member.id.is_not(None), PortalSession.portal_link_id.is_not(None)),
    )
)


def authenticate_session(db: Database, token: str) -> LiveSession | None:
    """The live (unrevoked, unexpired) session of a cookie token, read on every request.

    Read-only, so the notifier can run it on its read-only view of identity. No cache:
    signing out, a role change or a removal applies to the next request.
    """
    if not _could_be_session(token):
        return None
    with db.autocommit() as conn:
        row = conn.execute(
            _LIVE_SESSION, {"token_hash": token_hash(token), "now": utcnow()}
        ).first()
    return None if row is None else LiveSession(*row)


def _could_be_session(token: str) -> bool:
    return token.startswith("sst_") and len(token) <= 200


def stepped_up(session: Session, session_id: str, *, now: datetime | None = None) -> datetime:
    """The session gave its password or a code now: sensitive changes for 5 minutes."""
    now = now or utcnow()
    session.execute(
        sa.update(PortalSession).where(PortalSession.id == session_id).values(factor_at=now)
    )
    return now


def end_session(session: Session, session_id: str) -> None:
    session.execute(
        sa.update(PortalSession)
        .where(PortalSession.id == session_id, PortalSession.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
