"""The tenant destination policy: the default destination of accounts created without one.

One policy per tenant. PUT creates or replaces it (createdAt kept, updatedAt
moved). Accounts copy it at creation time; changing it later leaves them alone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from services.core.chains import ChainRegistry
from services.core.destinations import Destination, validate_destination
from services.core.models import DestinationPolicy
from shared.api import field_error
from shared.timefmt import iso_ms, utcnow

#: Longest venue label (interface: at most 120 characters).
VENUE_MAX = 120


def get_policy(session: Session, tenant_id: str) -> DestinationPolicy | None:
    return session.get(DestinationPolicy, tenant_id)


def policy_destination(policy: DestinationPolicy) -> Destination:
    return Destination(policy.chain_id, policy.address, policy.token_address)


def put_policy(
    session: Session,
    registry: ChainRegistry,
    tenant_id: str,
    destination: Destination,
    venue: str | None,
    *,
    now: datetime | None = None,
) -> DestinationPolicy:
    """Create or replace the tenant's policy in one statement (safe under concurrent PUTs)."""
    validate_destination(registry, destination)
    if venue is not None and len(venue) > VENUE_MAX:
        raise field_error("venue", f"at most {VENUE_MAX} characters")
    now = now or utcnow()
    values = {
        "tenant_id": tenant_id,
        "chain_id": destination.chain_id,
        "address": destination.address,
        "token_address": destination.token_address,
        "venue": venue,
        "created_at": now,
        "updated_at": now,
    }
    insert = postgresql.insert(DestinationPolicy)
    statement = (
        insert.values(values)
        .on_conflict_do_update(
            index_elements=[DestinationPolicy.tenant_id],
            set_={k: insert.excluded[k] for k in values if k not in ("tenant_id", "created_at")},
        )
        .returning(DestinationPolicy)
    )
    policy: DestinationPolicy = session.scalars(
        statement, execution_options={"populate_existing": True}
    ).one()
    return policy


def policy_document(policy: DestinationPolicy) -> dict[str, Any]:
    """The wire form of a policy."""
    return {
        "tenantId": policy.tenant_id,
        "destination": policy_destination(policy).document(),
        "venue": policy.venue,
        "createdAt": iso_ms(policy.created_at),
        "updatedAt": iso_ms(policy.updated_at),
    }
