"""Delivery SLA per endpoint: the one query behind the stats API, `settle sla` and the portal.

`GET /v1/webhook-endpoints/{id}/stats?since=...` (a tenant, one endpoint), `settle sla
[--since 7d] [--tenant ID]` (ops, every endpoint) and the portal's overview (through
that API) all read `endpoint_stats`, so the three never disagree.

Over the deliveries made in the window [since, until) (their `created_at`):

- `deliveries` = `succeeded` + `failed` + `pending` (pending or retrying) + `skipped`
  (the delivery statuses); `exhausted`: the failed ones that gave up after the retry
  schedule (the others stopped because their endpoint was deleted);
- `successRate`: succeeded / (succeeded + failed), the finished ones (null: none);
- first-attempt latency: p50/p99 of the attempts numbered 1 (seconds, as measured by
  the sender: connect to the whole answer);
- commit-to-success: p50/p99 of `succeededAt` - the event's `createdAt` (when core
  committed it), over succeeded deliveries that are not replays (a replay, asked for
  days later, measures the tenant, not Settle);
- `oldestPendingAgeSeconds`: how long the oldest still-pending one has waited since it
  was made (null: none pending).

Percentiles are PostgreSQL's `percentile_cont` (linear between the two nearest values).
The window also bounds the ids of deliveries and attempts and the events' `received_at`
(implied by it, see `_query`), so only the partitions it covers are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.notifier.models import (
    FAILED,
    PENDING,
    RETRYING,
    SKIPPED,
    SUCCEEDED,
    Attempt,
    Delivery,
    Endpoint,
    StoredEvent,
)
from services.notifier.retention import DELIVERY_ID_PREFIX
from services.notifier.webhook_endpoints import ENDPOINT_DELETED
from shared.ids import ulid_time_prefix
from shared.timefmt import parse_iso

#: The window when none is given.
DEFAULT_SINCE = "7d"
#: Longest window a duration may name (longer than any retention).
MAX_WINDOW = timedelta(days=3660)
#: How far before its `created_at` a delivery's id may have been minted (the same
#: process's clock, moments apart: an hour is plenty).
CLOCK_SLACK = timedelta(hours=1)

_DURATION = re.compile(r"^([1-9][0-9]{0,6})([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: datetime) -> datetime:
    """`7d`, `12h`, `30m`, `90s`, `2w` back from `now`, or an ISO 8601 time before `now`.

    Raises ValueError with a message for a person.
    """
    text = text.strip()
    match = _DURATION.match(text)
    if match:
        seconds = int(match.group(1)) * _UNITS[match.group(2)]
        if seconds > MAX_WINDOW.total_seconds():
            raise ValueError(f"at most {MAX_WINDOW.days} days back")
        return now - timedelta(seconds=seconds)
    try:
        since = parse_iso(text)
    except ValueError:
        raise ValueError(
            "must be a duration such as 7d, 24h, 30m (s, m, h, d, w) or an ISO 8601 time"
        ) from None
    if since >= now:
        raise ValueError("must be in the past")
    return max(since, now - MAX_WINDOW)


@dataclass(frozen=True, slots=True)
class EndpointStats:
    """One endpoint's delivery figures over a window (see the module's docstring)."""

    tenant_id: str
    endpoint_id: str
    endpoint_name: str
    since: datetime
    until: datetime
    deliveries: int = 0
    succeeded: int = 0
    failed: int = 0
    exhausted: int = 0
    pending: int = 0
    skipped: int = 0
    first_attempt_latency_p50_seconds: float | None = None
    first_attempt_latency_p99_seconds: float | None = None
    commit_to_success_p50_seconds: float | None = None
    commit_to_success_p99_seconds: float | None = None
    oldest_pending_age_seconds: float | None = None

    @property
    def success_rate(self) -> float | None:
        finished = self.succeeded + self.failed
        return None if finished == 0 else self.succeeded / finished


def _count(condition: sa.ColumnElement[bool]) -> sa.ColumnElement[int]:
    return sa.func.count().filter(condition)


def _percentile(fraction: float, value: sa.ColumnElement[Any]) -> sa.ColumnElement[float]:
    # NULLs are left out: a CASE yields them for the rows that do not count.
    return sa.func.percentile_cont(fraction).within_group(value)


def _query(
    since: datetime,
    until: datetime,
    tenant_id: str | None,
    endpoint_id: str | None,
) -> sa.Select[Any]:
    first = sa.orm.aliased(Attempt)
    # Implied by the window (a delivery's id is a ULID minted as it is made), and what
    # the partitions of deliveries and attempts are ranged by: older ones are skipped.
    floor = f"{DELIVERY_ID_PREFIX}{ulid_time_prefix(int((since - CLOCK_SLACK).timestamp() * 1000))}"
    status = Delivery.status
    unfinished = status.in_((PENDING, RETRYING))
    commit_to_success = sa.case(
        (
            sa.and_(status == SUCCEEDED, Delivery.replay_of.is_(None)),
            sa.extract("epoch", Delivery.succeeded_at - StoredEvent.created_at),
        )
    )
    latency = first.latency_ms / 1000.0
    query = (
        sa.select(
            Delivery.tenant_id,
            Delivery.endpoint_id,
            Endpoint.name,
            sa.func.count(),
            _count(status == SUCCEEDED),
            _count(status == FAILED),
            _count(
                sa.and_(status == FAILED, Delivery.last_error.is_distinct_from(ENDPOINT_DELETED))
            ),
            _count(unfinished),
            _count(status == SKIPPED),
            _percentile(0.5, latency),
            _percentile(0.99, latency),
            _percentile(0.5, commit_to_success),
            _percentile(0.99, commit_to_success),
            sa.func.min(sa.case((unfinished, Delivery.created_at))),
        )
        .outerjoin(
            StoredEvent,
            sa.and_(
                StoredEvent.id == Delivery.event_id,
                # Only commit-to-success reads the event, and only a first delivery's,
                # which the consumer makes as it stores the event: bounded so, the
                # event partitions before the window are skipped too.
                Delivery.replay_of.is_(None),
                StoredEvent.received_at >= since - CLOCK_SLACK,
            ),
        )
        .join(Endpoint, Endpoint.id == Delivery.endpoint_id)
        .outerjoin(
            first,
            sa.and_(
                first.delivery_id == Delivery.id,
                first.number == 1,
                first.delivery_id >= floor,
            ),
        )
        .where(Delivery.created_at >= since, Delivery.created_at < until, Delivery.id >= floor)
        .group_by(Delivery.tenant_id, Delivery.endpoint_id, Endpoint.name)
        .order_by(Delivery.tenant_id, Delivery.endpoint_id)
    )
    if tenant_id is not None:
        query = query.where(Delivery.tenant_id == tenant_id)
    if endpoint_id is not None:
        query = query.where(Delivery.endpoint_id == endpoint_id)
    return query


def endpoint_stats(
    session: Session,
    *,
    since: datetime,
    until: datetime,
    tenant_id: str | None = None,
    endpoint_id: str | None = None,
) -> list[EndpointStats]:
    """The figures of each endpoint with deliveries in the window (of one tenant, or one
    endpoint, when given), by tenant then endpoint."""
    out = []
    for row in session.execute(_query(since, until, tenant_id, endpoint_id)):
        tenant, endpoint, name, *counts, p50, p99, c50, c99, oldest = row
        out.append(
            EndpointStats(
                tenant,
                endpoint,
                name,
                since,
                until,
                *counts,
                first_attempt_latency_p50_seconds=_float(p50),
                first_attempt_latency_p99_seconds=_float(p99),
                commit_to_success_p50_seconds=_float(c50),
                commit_to_success_p99_seconds=_float(c99),
                oldest_pending_age_seconds=(
                    None if oldest is None else max(0.0, (until - oldest).total_seconds())
                ),
            )
        )
    return out


def one_endpoint(
    session: Session, endpoint: Endpoint, *, since: datetime, until: datetime
) -> EndpointStats:
    """The figures of one endpoint (zeros when it had no delivery in the window)."""
    found = endpoint_stats(
        session, since=since, until=until, tenant_id=endpoint.tenant_id, endpoint_id=endpoint.id
    )
    if found:
        return found[0]
    return EndpointStats(endpoint.tenant_id, endpoint.id, endpoint.name, since, until)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
