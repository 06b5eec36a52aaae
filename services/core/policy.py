"""The tenant destination policy: the default destination of accounts created without one.

One policy per tenant. PUT creates or replaces it (createdAt kept, updatedAt
moved). Accounts copy it at creation time; changing it later leaves them alone.
The use cases own their transaction and return a `Policy`; the API's schema renders it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.dialects import postgresql

from services.core.chains import ChainRegistry
from services.core.destinations import Destination, validate_destination
from services.core.models import DestinationPolicy
from shared.api import field_error
from shared.audit.log import Change, Recorder
from shared.db import Database
from shared.timefmt import utcnow

#: Longest venue label (interface: at most 120 characters).
VENUE_MAX = 120


@dataclass(frozen=True)
class Policy:
    """A tenant's destination policy."""

    tenant_id: str
    destination: Destination
    venue: str | None
    created_at: datetime
    updated_at: datetime

    def audited(self) -> dict[str, object]:
        """What the audit log keeps of it."""
        return {"destination": self.destination.document(), "venue": self.venue}


def _policy(row: DestinationPolicy) -> Policy:
    destination = Destination(row.chain_id, row.address, row.token_address)
    return Policy(row.tenant_id, destination, row.venue, row.created_at, row.updated_at)


def get_policy(db: Database, tenant_id: str) -> Policy | None:
    """The tenant's policy, or None when none is configured."""
    with db.reader() as session:
        row = session.get(DestinationPolicy, tenant_id)
        return None if row is None else _policy(row)


def put_policy(
    db: Database,
    registry: ChainRegistry,
    tenant_id: str,
    destination: Destination,
    venue: str | None,
    *,
    now: datetime | None = None,
    audit: Recorder | None = None,
) -> Policy:
    """Create or replace the tenant's policy in one statement (safe under concurrent PUTs).

    With `audit`, the change is recorded (the policy before and after) in the same
    transaction; the policy row is locked first so `before` is the one replaced.
    """
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
    with db.transaction() as session:
        prior = None
        if audit is not None:
            row = session.get(DestinationPolicy, tenant_id, with_for_update=True)
            prior = None if row is None else _policy(row).audited()
        row = session.scalars(statement, execution_options={"populate_existing": True}).one()
        policy = _policy(row)
        if audit is not None:
            audit(
                session,
                Change(
                    "destination_policy.updated",
                    "destination_policy",
                    tenant_id,
                    before=prior,
                    after=policy.audited(),
                ),
            )
        return policy
