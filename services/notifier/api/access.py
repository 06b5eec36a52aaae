"""What the webhook routes require: their scopes, and the caller's tenant."""

from __future__ import annotations

from shared.identity import auth

#: API-key scopes of the webhook routes.
READ, WRITE = "webhooks:read", "webhooks:write"


def tenant_id() -> str:
    """The authenticated caller's tenant (every query of these routes is scoped to it)."""
    return auth.current_principal().tenant_id
