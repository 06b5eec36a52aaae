"""The audit log's entries of identity's changes, made by the API and the CLI alike."""

from __future__ import annotations

from shared.audit.log import Change
from shared.identity.models import ApiKey, Member
from shared.timefmt import iso_ms


def key_created(key: ApiKey) -> Change:
    """A new key: never the key, only its prefix, name and scopes."""
    after = {"name": key.name, "prefix": key.key_prefix, "scopes": list(key.scopes)}
    return Change("api_key.created", "api_key", key.id, after=after)


def key_revoked(key: ApiKey) -> Change:
    assert key.revoked_at is not None
    return Change(
        "api_key.revoked",
        "api_key",
        key.id,
        before={"revokedAt": None},
        after={"revokedAt": iso_ms(key.revoked_at)},
    )


def member_added(member: Member) -> Change:
    """A new member: never the password."""
    after = {"email": member.email, "role": member.role}
    return Change("member.added", "member", member.id, after=after)
