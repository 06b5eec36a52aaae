"""The authenticated caller of a request, and what it may hand out.

No caller grants more than it holds: a key creates keys with its own scopes at most
and members whose role acts within them (never an owner); a member grants roles up
to their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from shared.identity.models import LINK_SCOPES, role_at_least, role_scopes


@dataclass(frozen=True)
class Principal:
    """An API key's caller (`api_key_id`, `scopes`) or a session's (`session_id`, `role`).

    A session is a member's (`member_id`) or one a portal link opened (`link_id`).
    """

    tenant_id: str
    sandbox: bool
    api_key_id: str | None = None
    scopes: frozenset[str] = frozenset()
    member_id: str | None = None
    role: str | None = None
    session_id: str | None = None
    link_id: str | None = None
    #: When the session last gave a password, a code or a link's token (step-up).
    factor_at: datetime | None = None

    @property
    def actor_id(self) -> str:
        """The key or member acting (for records of who made what)."""
        return self.api_key_id or self.member_id or self.link_id or ""

    def holds(self) -> frozenset[str]:
        """The scopes this caller acts with: a key's own, or those its role covers."""
        return self.scopes if self.api_key_id is not None else role_scopes(self.role)

    def may_grant_scopes(self, scopes: Iterable[str]) -> bool:
        return set(scopes) <= self.holds()

    def may_grant_role(self, role: str) -> bool:
        """Whether this caller may give (or take from) a member `role`.

        A member: roles up to their own (an admin never makes or touches an owner). A
        key: roles whose sessions act within the key's scopes, never an owner's: an
        admin may make a key with every scope, and such a key making owners would make
        every admin an owner. Owners are made by owners (or `settle members add`).
        """
        if self.api_key_id is not None:
            return role != "owner" and role_scopes(role) <= self.scopes
        return self.link_id is None and role_at_least(self.role, role)

    def may_grant_link(self, role: str) -> bool:
        """Whether this caller may make a portal link with `role`.

        A link's session acts with the role's webhook scopes only, so those are what
        the caller must hold.
        """
        return (role_scopes(role) & LINK_SCOPES) <= self.holds()
