"""API key scopes and portal roles: plain names, importable without the database layer
(the CLI's `--scope` choices are read for `settle api-keys --help`)."""

from __future__ import annotations

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
    "audit:read",
)

__all__ = ["ROLES", "SCOPES"]
