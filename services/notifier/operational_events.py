"""Operational events: the notifier tells a tenant about its own endpoints.

- `webhook.endpoint_disabled` `{webhookEndpoint, reason}`: PATCH or days of failures;
- `webhook.endpoint_failing` `{webhookEndpoint, failingSince, failedAttempts,
  lastAttempt}`: a run of SETTLE_WEBHOOK_FAILING_AFTER_ATTEMPTS failed attempts, once
  per run (the mark is set with the attempt's record: delivery_store.Recorded);
- `webhook.endpoint_recovered` `{webhookEndpoint, failingSince, failedAttempts,
  recoveredAt}`: the first success after such a run;
- `webhook.delivery_exhausted` `{webhookEndpoint, webhookDelivery}`: a delivery gave
  up (its retry schedule ran out), except a delivery of an operational event: two
  failing endpoints would otherwise tell each other about each other without end.

Each is an event the notifier stores itself (like `webhook.test`) and fans out to the
tenant's other enabled endpoints subscribed to its type, never to the endpoint it is
about (`tell`). The callers hand the returned delivery ids to the workers once the
transaction commits. A sandbox tenant's are tests like its other events (`livemode:
false`): `tell` asks identity (`identity`, the notifier's read access to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.notifier import deliveries, fanout
from services.notifier.api.schemas import (
    DeliverySchema,
    EndpointSchema,
    delivery_out,
    endpoint_out,
)
from services.notifier.delivery_store import FailureRun
from services.notifier.models import Delivery, Endpoint
from shared import events
from shared.db import Database
from shared.identity.sandbox import is_sandbox
from shared.timefmt import iso_ms


@dataclass(frozen=True, slots=True)
class AttemptSeen:
    """The failed attempt that made an endpoint's run long enough (`lastAttempt`)."""

    delivery_id: str
    number: int
    attempted_at: datetime
    response_status: int | None
    error: str


def tell(
    session: Session,
    endpoint: Endpoint,
    event_type: str,
    data: dict[str, Any],
    now: datetime,
    *,
    identity: Database,
) -> list[str]:
    """Store an operational event about `endpoint` and make its deliveries to the tenant's
    other enabled endpoints subscribed to `event_type`; returns their ids."""
    livemode = not is_sandbox(identity, endpoint.tenant_id, within=session)
    envelope = events.envelope(
        event_type, endpoint.tenant_id, data, created_at=now, livemode=livemode
    )
    event = deliveries.store_event(session, events.encode(envelope), now=now)
    assert event is not None  # a fresh id cannot collide
    others = session.scalars(
        sa.select(Endpoint).where(
            Endpoint.tenant_id == endpoint.tenant_id,
            Endpoint.id != endpoint.id,
            *fanout.RECEIVING,
        )
    )
    rows = [
        fanout.pending(endpoint.tenant_id, event.id, event.event_type, other.id, now)
        for other in others
        if fanout.subscribes(other.event_types, event_type)
    ]
    return [d.id for d in fanout.create_deliveries(session, rows)]


def _served(endpoint: Endpoint, now: datetime) -> dict[str, Any]:
    """The endpoint as GET /v1/webhook-endpoints serves it."""
    served: dict[str, Any] = EndpointSchema().dump(endpoint_out(endpoint, now))
    return served


def _run(run: FailureRun) -> dict[str, Any]:
    return {"failingSince": iso_ms(run.failing_since), "failedAttempts": run.failed_attempts}


def endpoint_disabled(
    session: Session, endpoint: Endpoint, now: datetime, *, identity: Database
) -> list[str]:
    data = {"webhookEndpoint": _served(endpoint, now), "reason": endpoint.disabled_reason}
    return tell(session, endpoint, events.WEBHOOK_ENDPOINT_DISABLED, data, now, identity=identity)


def endpoint_failing(
    session: Session,
    endpoint: Endpoint,
    run: FailureRun,
    last: AttemptSeen,
    now: datetime,
    *,
    identity: Database,
) -> list[str]:
    data = {
        "webhookEndpoint": _served(endpoint, now),
        **_run(run),
        "lastAttempt": {
            "deliveryId": last.delivery_id,
            "number": last.number,
            "attemptedAt": iso_ms(last.attempted_at),
            "responseStatus": last.response_status,
            "error": last.error,
        },
    }
    return tell(session, endpoint, events.WEBHOOK_ENDPOINT_FAILING, data, now, identity=identity)


def endpoint_recovered(
    session: Session, endpoint: Endpoint, run: FailureRun, now: datetime, *, identity: Database
) -> list[str]:
    data = {"webhookEndpoint": _served(endpoint, now), **_run(run), "recoveredAt": iso_ms(now)}
    return tell(session, endpoint, events.WEBHOOK_ENDPOINT_RECOVERED, data, now, identity=identity)


def delivery_exhausted(
    session: Session, delivery: Delivery, now: datetime, *, identity: Database
) -> list[str]:
    """Nothing for a delivery of an operational event (see the module's docstring)."""
    if delivery.event_type in events.OPERATIONAL_EVENT_TYPES:
        return []
    endpoint = session.get_one(Endpoint, delivery.endpoint_id)
    data = {
        "webhookEndpoint": _served(endpoint, now),
        "webhookDelivery": DeliverySchema().dump(delivery_out(delivery)),
    }
    return tell(session, endpoint, events.WEBHOOK_DELIVERY_EXHAUSTED, data, now, identity=identity)
