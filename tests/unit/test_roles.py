"""Roles and scopes: every scope maps to the role a session needs for it."""

from __future__ import annotations

from shared.identity.models import ROLES, SCOPE_ROLES, SCOPES, role_at_least
from shared.identity.principal import Principal


def test_every_scope_has_a_role_and_only_scopes_do() -> None:
    assert set(SCOPE_ROLES) == set(SCOPES)
    assert set(SCOPE_ROLES.values()) <= set(ROLES)


def test_roles_rank_lowest_first() -> None:
    assert role_at_least("owner", "viewer") and role_at_least("developer", "developer")
    assert not role_at_least("viewer", "developer")
    # A role the code does not know (a row written by something else) is nothing
    assert not role_at_least("root", "viewer") and not role_at_least("", "viewer")


def test_nobody_grants_more_than_they_hold() -> None:
    admin = Principal("t", False, member_id="mem_a", role="admin", session_id="s")
    full_key = Principal("t", False, api_key_id="key_f", scopes=frozenset(SCOPES))
    reader = Principal("t", False, api_key_id="key_r", scopes=frozenset({"webhooks:read"}))
    link = Principal("t", False, role="developer", session_id="s", link_id="pl_1")
    # A member gives roles up to their own
    assert admin.may_grant_role("admin") and not admin.may_grant_role("owner")
    # A key gives roles acting within its scopes, and never an owner's
    assert full_key.may_grant_role("admin") and not full_key.may_grant_role("owner")
    assert not reader.may_grant_role("viewer")
    # A portal link's session gives nothing
    assert not link.may_grant_role("viewer")
    # Keys: scopes the caller holds; links: the webhook scopes of their role
    assert admin.may_grant_scopes(SCOPES) and not reader.may_grant_scopes(["webhooks:write"])
    assert reader.may_grant_link("viewer") and not reader.may_grant_link("developer")
