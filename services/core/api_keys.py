"""API keys as core manages them: revoking one emits `tenant.api_key_revoked`.

Identity lives in core's database, so the revocation and its outbox event commit in
one transaction (the CLI and `DELETE /v1/api-keys/{apiKeyId}` both come here).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from services.core.outbox import emit
from shared import events
from shared.identity import service as identity
from shared.identity.models import ApiKey
from shared.timefmt import iso_ms


def revoke_key(
    session: Session, key_id: str, *, tenant_id: str | None = None
) -> tuple[ApiKey, bool]:
    """Revoke a key (of `tenant_id`, when given); the first revocation emits the event.

    Returns (key, newly_revoked): revoking twice changes nothing and emits nothing.
    """
    key, newly = identity.revoke_api_key(session, key_id, tenant_id=tenant_id)
    if newly:
        assert key.revoked_at is not None
        emit(
            session,
            events.API_KEY_REVOKED,
            key.tenant_id,
            {"apiKeyId": key.id, "revokedAt": iso_ms(key.revoked_at)},
        )
    return key, newly
