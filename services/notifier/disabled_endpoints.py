"""A disabled endpoint is visible and recoverable.

- Events for a disabled endpoint are kept as **skipped** deliveries (fanout.skipped;
  the worker skips a due delivery whose endpoint was disabled meanwhile).
- **Enabling** the endpoint again makes its skipped deliveries due now (`resume`).
- **Disabling** it, by PATCH (`manual`) or because every attempt failed for days
  (`failing`), sends `webhook.endpoint_disabled` `{webhookEndpoint, reason}` to the
  tenant's other endpoints subscribed to that type, never to the disabled one
  (`notice`; operational_events.py).

`status_changed` is the one entry for every path that changes an endpoint's status
(the API's PATCH, the CLI, the worker); it returns the deliveries to hand to the
workers once the caller's transaction commits.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.notifier import operational_events
from services.notifier.models import DISABLED, ENABLED, PENDING, SKIPPED, Delivery, Endpoint
from shared.db import Database

#: Most skipped deliveries handed to the workers at once when an endpoint is enabled
#: again; the rest are due too, and the sweeper sends them.
MAX_RESUMED_AT_ONCE = 1000


def status_changed(
    session: Session, endpoint: Endpoint, was: str, now: datetime, *, identity: Database
) -> list[str]:
    """What follows a status change from `was`: the ids of deliveries to hand off
    (`identity`: where the tenant's sandbox flag is read, operational_events.tell)."""
    if was == DISABLED and endpoint.status == ENABLED:
        return resume(session, endpoint, now)
    if was == ENABLED and endpoint.status == DISABLED:
        return notice(session, endpoint, now, identity=identity)
    return []


def resume(session: Session, endpoint: Endpoint, now: datetime) -> list[str]:
    """The endpoint's skipped deliveries, due now (oldest first); the first ids to send."""
    ids = list(
        session.scalars(
            sa.update(Delivery)
            .where(Delivery.endpoint_id == endpoint.id, Delivery.status == SKIPPED)
            .values(status=PENDING, next_attempt_at=now, last_error=None, updated_at=now)
            .returning(Delivery.id)
            .execution_options(synchronize_session=False)
        )
    )
    return sorted(ids)[:MAX_RESUMED_AT_ONCE]


def notice(session: Session, endpoint: Endpoint, now: datetime, *, identity: Database) -> list[str]:
    """`webhook.endpoint_disabled` for the tenant's other subscribed, enabled endpoints."""
    return operational_events.endpoint_disabled(session, endpoint, now, identity=identity)
