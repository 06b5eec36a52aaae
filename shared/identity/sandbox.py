"""Which tenants are sandbox tenants: every event of theirs is a test (`livemode: false`).

One answer for every event maker: core's outbox (services/core/outbox.py) and the
notifier's operational events (services/notifier/operational_events.py). The flag is
identity's (`tenants.sandbox`, set when the tenant is made). The request's caller
answers for its own tenant (its key or session was read with the flag); any other
tenant is read from identity's table.
"""

from __future__ import annotations

from collections.abc import Collection

import sqlalchemy as sa
from flask import g, has_request_context
from sqlalchemy.orm import Session

from shared.db import Database, database_of
from shared.identity.models import Tenant


def _callers_answer(tenant_id: str) -> bool | None:
    """Whether the request's caller, a principal of `tenant_id`, is a sandbox tenant's;
    None outside a request, before authentication, or for another tenant."""
    if not has_request_context():
        return None
    principal = g.get("principal")
    if principal is None or principal.tenant_id != tenant_id:
        return None
    return bool(principal.sandbox)


def caller_is_sandbox(tenant_id: str) -> bool:
    """Whether the request being served is a sandbox tenant's (False outside one)."""
    return _callers_answer(tenant_id) is True


def sandbox_tenants(session: Session, tenant_ids: Collection[str]) -> set[str]:
    """Which of these tenants are sandbox tenants; `session` is one of identity's
    database (an unknown tenant is not a sandbox tenant)."""
    if len(tenant_ids) == 1:
        (tenant_id,) = tenant_ids
        answer = _callers_answer(tenant_id)
        if answer is not None:
            return {tenant_id} if answer else set()
    found = session.scalars(
        sa.select(Tenant.id).where(Tenant.id.in_(sorted(tenant_ids)), Tenant.sandbox.is_(True))
    )
    return set(found)


def is_sandbox(identity: Database, tenant_id: str, *, within: Session) -> bool:
    """`sandbox_tenants` for a process whose own database may not be identity's (the
    notifier reads identity where it lives: DESIGN.md, SETTLE_IDENTITY_DATABASE_URL).

    Read in `within` when that is a session of identity's database (one connection: a
    worker thread holding two from one pool could wait on itself), else in a reader of
    identity's own.
    """
    if database_of(within) is identity:
        return bool(sandbox_tenants(within, {tenant_id}))
    with identity.reader() as session:
        return bool(sandbox_tenants(session, {tenant_id}))
