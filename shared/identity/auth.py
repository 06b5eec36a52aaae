"""Who is calling: API keys (Bearer) and portal sessions (cookie + CSRF header).

A tenant route declares its scope with `requires(blp, scope)`: an API key needs that
scope, a signed-in member the role `SCOPE_ROLES` maps it to. Routes only members reach
(their own session, `/v1/tenants/{tenantId}/...`) use `member(blp, role)`. The
decorator authenticates, checks, documents the requirement in OpenAPI and puts the
`Principal` on `flask.g`. Both services run it against identity's tables, so the
notifier validates core's session cookie without calling core.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import wraps
from typing import Any, TypeVar

from flask import current_app, g, request

from shared.api import Blueprint, ErrorSchema
from shared.db import Database
from shared.errors import (
    Forbidden,
    InsufficientScope,
    MfaEnrolmentRequired,
    NotFound,
    StepUpRequired,
    Unauthorized,
)
from shared.identity import service
from shared.identity.models import LINK_SCOPES, ROLES, SCOPE_ROLES, role_at_least
from shared.identity.principal import Principal
from shared.identity.secrets import same_hash, token_hash
from shared.timefmt import utcnow

F = TypeVar("F", bound=Callable[..., Any])

SESSION_COOKIE = "settle_session"
CSRF_HEADER = "X-CSRF-Token"
#: Methods that change nothing, so need no CSRF token.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Extension key under which an app keeps the identity database.
IDENTITY_DB = "settle.identity_db"
#: How long a password or code given on a session covers sensitive changes (step-up).
STEP_UP_WINDOW = timedelta(minutes=5)


def identity_db() -> Database:
    db: Database = current_app.extensions[IDENTITY_DB]
    return db


def current_principal() -> Principal:
    principal: Principal = g.principal
    return principal


def _bearer_token() -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send Authorization: Bearer <API key>")
    return token.strip()


def authenticate_api_key(scope: str | None) -> Principal:
    """The caller of a Bearer API key, read from the database on every request.

    No cache: a revocation applies to the next request. The lookup is one indexed
    statement outside a transaction (no BEGIN/ROLLBACK), so it costs one round trip.
    """
    token = _bearer_token()
    key = service.authenticate_key(identity_db(), token)
    if key is None:
        raise Unauthorized("the API key is unknown or revoked")
    principal = Principal(
        tenant_id=key.tenant_id, sandbox=key.sandbox, api_key_id=key.id, scopes=key.scopes
    )
    if scope is not None and scope not in principal.scopes:
        raise InsufficientScope(f"this API key lacks the scope {scope}")
    return principal


def authenticate_session(
    min_role: str,
    tenant_id: str | None = None,
    *,
    links: bool = False,
    enrolling: bool = False,
) -> Principal:
    """The caller of the session cookie, of at least `min_role`.

    Unsafe methods must carry the session's own CSRF token. When `tenant_id` is given
    (a path parameter) it must be the session's tenant: another tenant's id answers
    404 exactly as one that does not exist. A session a portal link opened is
    refused unless `links` (the webhook pages and the session itself). A member of a
    tenant that requires a second factor, who has none yet, reaches only the routes
    that let them enrol (`enrolling`): elsewhere 403 `mfa_enrolment_required`.
    """
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise Unauthorized("sign in first (POST /v1/sessions)")
    live = service.authenticate_session(identity_db(), token)
    if live is None:
        raise Unauthorized("the session has ended; sign in again")
    if request.method not in SAFE_METHODS:
        csrf = request.headers.get(CSRF_HEADER, "")
        if not csrf or not same_hash(token_hash(csrf), live.csrf_hash):
            raise Forbidden(f"send the {CSRF_HEADER} header the session response gave")
    if tenant_id is not None and tenant_id != live.tenant_id:
        raise NotFound("no such tenant")
    if live.link_id is not None and not links:
        raise Forbidden("a portal link opens the webhook pages only")
    if live.needs_enrolment and not enrolling:
        raise MfaEnrolmentRequired(
            "your tenant requires two-factor sign-in: enrol first (POST /v1/me/mfa/enrolment)"
        )
    if not role_at_least(live.role, min_role):
        raise Forbidden(f"this needs the {min_role} role or higher; you are {live.role}")
    return Principal(
        tenant_id=live.tenant_id,
        sandbox=live.sandbox,
        member_id=live.member_id,
        role=live.role,
        session_id=live.id,
        link_id=live.link_id,
        factor_at=live.factor_at,
    )


def require_fresh_factor(principal: Principal, *, now: datetime | None = None) -> None:
    """Refuse a sensitive change on a session whose last password or code is older than
    STEP_UP_WINDOW (403 `step_up_required`). API keys are never asked."""
    if principal.api_key_id is not None:
        return
    now = now or utcnow()
    if principal.factor_at is None or now - principal.factor_at > STEP_UP_WINDOW:
        raise StepUpRequired(
            "this change needs your password or a code given within the last "
            f"{STEP_UP_WINDOW.seconds // 60} minutes: POST /v1/sessions/current/step-up, "
            "then try again"
        )


def authenticate(scope: str) -> Principal:
    """A Bearer API key with `scope`, or else a session whose role implies `scope`.

    A request that sends an Authorization header is judged by it alone: a wrong key
    is 401 even when a valid session cookie rides along, so a key never borrows a
    browser's session.
    """
    if "Authorization" in request.headers:
        return authenticate_api_key(scope)
    if SESSION_COOKIE in request.cookies:
        return authenticate_session(SCOPE_ROLES[scope], links=scope in LINK_SCOPES)
    raise Unauthorized("send Authorization: Bearer <API key>, or sign in (POST /v1/sessions)")


def _documented(
    blp: Blueprint,
    fn: Callable[..., Any],
    security: tuple[str, ...],
    forbidden: bool,
    note: str,
) -> Callable[..., Any]:
    """`fn` wrapped with its OpenAPI security, 401/403 and `note` after the docstring's body.

    flask-smorest's doc decorators return a new wrapper that carries the docs, so the
    result must be the function that gets registered.
    """
    body = inspect.cleandoc(fn.__doc__ or "").partition("\n")[2].strip()
    security_doc = [{scheme: []} for scheme in security]
    fn = blp.doc(security=security_doc, description=f"{body}\n\n{note}" if body else note)(fn)
    fn = blp.alt_response(401, schema=ErrorSchema, description="Not authenticated")(fn)
    if forbidden:
        fn = blp.alt_response(403, schema=ErrorSchema, description="Not allowed")(fn)
    return fn


#: What `step_up=True` adds to a route's description.
STEP_UP_NOTE = (
    "On a session this is a sensitive change: it needs the member's password or a code "
    "given within the last 5 minutes (signing in, or `POST /v1/sessions/current/step-up`), "
    "else 403 `step_up_required`. API keys are not asked."
)


def requires(blp: Blueprint, scope: str, *, step_up: bool = False) -> Callable[[F], F]:
    """Require an API key with `scope`, or a session of the role `SCOPE_ROLES` maps it to.

    With `step_up`, a session must also have given a factor lately (`require_fresh_factor`).
    """
    min_role = SCOPE_ROLES[scope]

    def decorator(fn: F) -> F:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            g.principal = authenticate(scope)
            if step_up:
                require_fresh_factor(g.principal)
            return fn(*args, **kwargs)

        note = (
            f"Scope: `{scope}`. Or a session of role `{min_role}` or higher; on a session, "
            f"unsafe methods need the `{CSRF_HEADER}` header."
        )
        if step_up:
            note = f"{note} {STEP_UP_NOTE}"
        return _documented(blp, wrapper, ("apiKey", "session"), True, note)  # type: ignore[return-value]

    return decorator


def member(
    blp: Blueprint,
    min_role: str = "viewer",
    tenant_arg: str | None = None,
    *,
    links: bool = False,
    enrolling: bool = False,
    step_up: bool = False,
) -> Callable[[F], F]:
    """Require a signed-in portal member of at least `min_role`.

    When `tenant_arg` names a path parameter, it must be the member's tenant. With
    `links`, a session a portal link opened passes too; with `enrolling`, a member who
    must enrol a second factor first passes too; with `step_up`, the session must have
    given a factor lately.
    """
    if min_role not in ROLES:
        raise ValueError(min_role)

    def decorator(fn: F) -> F:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            tenant_id = kwargs.get(tenant_arg) if tenant_arg else None
            g.principal = authenticate_session(
                min_role,
                str(tenant_id) if tenant_id else None,
                links=links,
                enrolling=enrolling,
            )
            if step_up:
                require_fresh_factor(g.principal)
            return fn(*args, **kwargs)

        note = (
            f"Session; role `{min_role}` or higher; unsafe methods need the `{CSRF_HEADER}` header."
        )
        if step_up:
            note = f"{note} {STEP_UP_NOTE}"
        # 403 is a role below min_role or, on unsafe methods, a missing CSRF token: a
        # viewer's GET meets neither, so its OpenAPI entry does not list 403.
        forbidden = min_role != ROLES[0] or fn.__name__ not in ("get", "head") or step_up
        return _documented(blp, wrapper, ("session",), forbidden, note)  # type: ignore[return-value]

    return decorator
