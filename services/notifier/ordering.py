"""Ordered delivery per deposit account: when an ordered delivery may start.

An endpoint with `ordering: per_account` gets, on each delivery of an event about a
deposit account, the account (`order_key`) and the event's `sequence` (`order_seq`,
fanout.pending). Order is a property of the claim (delivery_store.py: an ordered
delivery's claim statement), not a mechanism of its own: a delivery is claimable only when

1. no delivery of the same endpoint and account with a lower number is unfinished
   (pending or retrying: in flight, waiting for its retry, or waiting for a slot), so
   one is in flight per account, in commit order, and a failing one holds only its
   account's later events, until it succeeds or gives up (failed); and
2. the events numbered just before it have arrived here (the last `GAP_WINDOW` of
   them), or it has waited `gap_wait_s` since its event arrived: two relays or two
   consumers may store an account's events out of order, and the earlier one's
   delivery must exist before this one may go. The wait is bounded, so an event that
   never comes (one from before this notifier's database) holds nothing for long.

What a claim refused for order does: nothing. The delivery stays due; when the one
before it finishes, the worker that recorded it sends its successor on
(`NEXT_IN_LINE`, after the commit, so that claim sees it finished); the sweeper, which
skips deliveries held by an unfinished predecessor (`held_by_earlier`), finds any
whose nudge was lost. So the waiting room, the keeper, group jobs, breaker notes and
inline runs need no case of their own: an ordered delivery is just a claim that may
say "not yet".
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import aliased

from services.notifier.models import PENDING, RETRYING, Delivery, StoredEvent

#: How many of the events numbered just before an ordered delivery's must have arrived.
GAP_WINDOW = 32

_EARLIER = aliased(Delivery, name="earlier")
_BEFORE = aliased(StoredEvent, name="before")


def _open(delivery: Any) -> sa.ColumnElement[bool]:
    # Not in_(): an expanding IN re-renders the SQL on every execution.
    return sa.or_(delivery.status == PENDING, delivery.status == RETRYING)


def held_by_earlier(delivery: Any = Delivery) -> sa.ColumnElement[bool]:
    """`delivery` (a Delivery entity or alias) has an unfinished predecessor (rule 1)."""
    return (
        sa.select(sa.literal_column("1"))
        .where(
            _EARLIER.endpoint_id == delivery.endpoint_id,
            _EARLIER.order_key == delivery.order_key,
            _EARLIER.order_seq < delivery.order_seq,
            _open(_EARLIER),
        )
        .exists()
    )


def _arrived_before(delivery: Any) -> sa.ColumnElement[bool]:
    """The events numbered just before `delivery`'s (up to GAP_WINDOW of them) are stored."""
    wanted = sa.func.least(delivery.order_seq - 1, GAP_WINDOW)
    stored = (
        sa.select(sa.func.count())
        .where(
            _BEFORE.account_id == delivery.order_key,
            _BEFORE.sequence < delivery.order_seq,
            _BEFORE.sequence >= delivery.order_seq - wanted,
        )
        .scalar_subquery()
    )
    return stored >= wanted


def may_start(event_received_at: Any) -> sa.ColumnElement[bool]:
    """The ordered claim's condition on a Delivery whose event arrived at
    `event_received_at`: rules 1 and 2 (bind `gap_cutoff`: when an event must have
    arrived for its delivery to go without the events before it).

    Its subqueries are correlated with the delivery, so PostgreSQL cannot prune their
    partitions: it opens every partition's index for them on each execution. Hence an
    ordered delivery has a claim statement of its own and an unordered one's carries
    none of this (delivery_store._claim_statement).
    """
    return sa.and_(
        ~held_by_earlier(),
        sa.or_(
            event_received_at < sa.bindparam("gap_cutoff"),
            _arrived_before(Delivery),
        ),
    )


#: The ordered delivery that comes after one that just finished (binds `endpoint_id`,
#: `order_key`, `order_seq`): the lowest unfinished one of the same endpoint and account.
NEXT_IN_LINE = (
    sa.select(Delivery.id, Delivery.endpoint_id, Delivery.tenant_id)
    .where(
        Delivery.endpoint_id == sa.bindparam("endpoint_id"),
        Delivery.order_key == sa.bindparam("order_key"),
        Delivery.order_seq > sa.bindparam("order_seq"),
        _open(Delivery),
    )
    .order_by(Delivery.order_seq)
    .limit(1)
)


def holders(delivery_ids: list[str]) -> sa.Select[Any]:
    """(delivery id, the id of the delivery holding it) for those of `delivery_ids`
    that wait for an unfinished predecessor: the lowest-numbered one (for the API)."""
    held = aliased(Delivery, name="held")
    holder = (
        sa.select(_EARLIER.id)
        .where(
            _EARLIER.endpoint_id == held.endpoint_id,
            _EARLIER.order_key == held.order_key,
            _EARLIER.order_seq < held.order_seq,
            _open(_EARLIER),
        )
        .order_by(_EARLIER.order_seq)
        .limit(1)
        .scalar_subquery()
    )
    return sa.select(held.id, holder.label("holder")).where(
        held.id.in_(delivery_ids), held.order_key.is_not(None), _open(held)
    )
