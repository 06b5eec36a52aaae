"""Roles and scopes: every scope maps to the role a session needs for it."""

from __future__ import annotations

from shared.identity.models import ROLES, SCOPE_ROLES, SCOPES, role_at_least


def test_every_scope_has_a_role_and_only_scopes_do() -> None:
    assert set(SCOPE_ROLES) == set(SCOPES)
    assert set(SCOPE_ROLES.values()) <= set(ROLES)


def test_roles_rank_lowest_first() -> None:
    assert role_at_least("owner", "viewer") and role_at_least("developer", "developer")
    assert not role_at_least("viewer", "developer")
    # A role the code does not know (a row written by something else) is nothing
    assert not role_at_least("root", "viewer") and not role_at_least("", "viewer")
