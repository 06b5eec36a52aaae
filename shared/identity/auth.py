"""Who is calling: API keys (Bearer) and portal sessions (cookie + CSRF header).

Views declare what they need with `api_key(blp, scope)` or `member(blp, role)`;
the decorator authenticates, checks, documents the requirement in OpenAPI and puts
the `Principal` on `flask.g`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

from flask import current_app, g, request

from shared.api import Blueprint, ErrorSchema
from shared.db import Database
from shared.errors import Forbidden, InsufficientScope, NotFound, Unauthorized
from shared.identity import service
from shared.identity.models import ROLES, Tenant
from shared.identity.secrets import same_hash, token_hash

F = TypeVar("F", bound=Callable[..., Any])

SESSION_COOKIE = "settle_session"
CSRF_HEADER = "X-CSRF-Token"
#: Extension key under which an app keeps the identity database.
IDENTITY_DB = "settle.identity_db"


@dataclass(frozen=True)
class Principal:
    """The authenticated caller of this request."""

    tenant_id: str
    sandbox: bool
    api_key_id: str | None = None
    scopes: frozenset[str] = frozenset()
    member_id: str | None = None
    role: str | None = None
    session_id: str | None = None


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


def authenticate_session(min_role: str, tenant_id: str | None) -> Principal:
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise Unauthorized("sign in first (POST /v1/sessions)")
    with identity_db().reader() as session:
        found = service.find_session(session, token)
        if found is None:
            raise Unauthorized("the session has ended; sign in again")
        record, member = found
        tenant = session.get(Tenant, record.tenant_id)
        sandbox = bool(tenant and tenant.sandbox)
        # Read inside the session: the reader's rollback expires (then detaches) the rows.
        principal = Principal(
            tenant_id=record.tenant_id,
            sandbox=sandbox,
            member_id=member.id,
            role=member.role,
            session_id=record.id,
        )
        csrf_hash = record.csrf_hash
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        csrf = request.headers.get(CSRF_HEADER, "")
        if not csrf or not same_hash(token_hash(csrf), csrf_hash):
            raise Forbidden(f"send the {CSRF_HEADER} header the session response gave")
    if tenant_id is not None and tenant_id != principal.tenant_id:
        # Another tenant's id answers exactly as an id that does not exist.
        raise NotFound("no such tenant")
    role = principal.role or ""
    if ROLES.index(role) < ROLES.index(min_role):
        raise Forbidden(f"this needs the {min_role} role or higher; you are {role}")
    return principal


def _documented(
    blp: Blueprint, fn: Callable[..., Any], security: str, forbidden: bool, note: str
) -> Callable[..., Any]:
    """`fn` wrapped with its OpenAPI security, 401/403 and `note` after the docstring's body.

    flask-smorest's doc decorators return a new wrapper that carries the docs, so the
    result must be the function that gets registered.
    """
    body = inspect.cleandoc(fn.__doc__ or "").partition("\n")[2].strip()
    fn = blp.doc(security=[{security: []}], description=f"{body}\n\n{note}" if body else note)(fn)
    fn = blp.alt_response(401, schema=ErrorSchema, description="Not authenticated")(fn)
    if forbidden:
        fn = blp.alt_response(403, schema=ErrorSchema, description="Not allowed")(fn)
    return fn


def api_key(blp: Blueprint, scope: str | None = None) -> Callable[[F], F]:
    """Require a Bearer API key (with `scope` when given)."""

    def decorator(fn: F) -> F:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            g.principal = authenticate_api_key(scope)
            return fn(*args, **kwargs)

        note = f"Scope: `{scope}`." if scope else "API key."
        return _documented(blp, wrapper, "apiKey", scope is not None, note)  # type: ignore[return-value]

    return decorator


def member(
    blp: Blueprint, min_role: str = "viewer", tenant_arg: str | None = None
) -> Callable[[F], F]:
    """Require a signed-in portal member of at least `min_role`.

    When `tenant_arg` names a path parameter, it must be the member's tenant.
    """
    if min_role not in ROLES:
        raise ValueError(min_role)

    def decorator(fn: F) -> F:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            tenant_id = kwargs.get(tenant_arg) if tenant_arg else None
            g.principal = authenticate_session(min_role, str(tenant_id) if tenant_id else None)
            return fn(*args, **kwargs)

        note = (
            f"Session; role `{min_role}` or higher; unsafe methods need the `{CSRF_HEADER}` header."
        )
        # 403 is a role below min_role or, on unsafe methods, a missing CSRF token: a
        # viewer's GET meets neither, so its OpenAPI entry does not list 403.
        forbidden = min_role != ROLES[0] or fn.__name__ not in ("get", "head")
        return _documented(blp, wrapper, "session", forbidden, note)  # type: ignore[return-value]

    return decorator
