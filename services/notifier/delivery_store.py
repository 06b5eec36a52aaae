"""The delivery row's SQL on the worker's hot path: claim, record, put back, stop, streak.

Every statement is compiled once per database and runs on the fast executor
(`shared.db.Database.driver_autocommit`: psycopg directly, no SQLAlchemy layers per
statement; see DriverStatement). An attempt makes three round trips: the claim (one
autocommitted UPDATE ... RETURNING in a CTE that takes the lease, read with the
endpoint, committed before the HTTP request), the event's body (from the one partition
the claim named), then one autocommitted statement recording the attempt and the
delivery's new state together (a CTE). An ordered delivery's claim takes two more
(`Deliveries.claim`). Only
when the endpoint's failure streak changes do the record and the streak updates run
in one explicit transaction.

The claim takes the lease and the next attempt number together; every write after
it is conditional on that number: once another worker has taken the delivery over
(after the lease lapsed) the number has moved on and the write changes nothing, but a
lease that merely lapsed, with nobody taking over, loses nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from services.notifier import ordering
from services.notifier.models import (
    DISABLED,
    ENABLED,
    FAILED,
    PENDING,
    RETRYING,
    Attempt,
    Delivery,
    Endpoint,
    StoredEvent,
    StoredEventId,
)
from shared.db import Database, DriverStatement

log = logging.getLogger(__name__)

#: Why an endpoint was disabled by the engine (see webhook_endpoints.DISABLED_MANUAL).
DISABLED_FAILING = "failing"

Connection = psycopg.Connection[Any]


@dataclass(frozen=True, slots=True)
class Claim:
    """A delivery this worker holds the lease of, with what its attempt needs.

    The endpoint's columns are read with the claim, in the same statement; the
    secret columns make it a `webhook_endpoints.SecretFields`. Times are aware
    (timestamptz, as psycopg reads them).
    """

    delivery_id: str
    lease_until: datetime
    #: This attempt's number, taken with the lease (attempts started before + 1).
    attempt_number: int
    event_id: str
    event_body: str
    event_created_at: datetime
    endpoint_id: str
    tenant_id: str
    url: str
    endpoint_status: str
    deleted_at: datetime | None
    failing_since: datetime | None
    secret_encrypted: str
    previous_secret_encrypted: str | None
    previous_secret_expires_at: datetime | None
    #: The endpoint's own cap on attempts per second (None: none).
    rate_limit_per_second: float | None = None
    #: The API request that caused the event (its attempts log under it), if any.
    request_id: str | None = None
    #: The endpoint's signatureScheme (`settle` or `standard`).
    signature_scheme: str = "settle"
    #: The account and number it is ordered by (ordering.py), when its endpoint orders.
    order_key: str | None = None
    order_seq: int | None = None


@dataclass(frozen=True, slots=True)
class FailureRun:
    """An endpoint's run of failed attempts, as it stood when it changed."""

    failing_since: datetime
    failed_attempts: int


@dataclass(frozen=True, slots=True)
class Recorded:
    """What recording an attempt changed."""

    #: False when another worker took the delivery over: its record wins.
    updated: bool
    #: The endpoint was disabled by this failure (its streak grew too long).
    disabled: bool = False
    #: This failure made the endpoint's run long enough to tell the tenant (once a run).
    failing: FailureRun | None = None
    #: This success ended a run the tenant was told about.
    recovered: FailureRun | None = None


def _claim_statement(*, ordered: bool) -> sa.Select[Any]:
    """Take the lease and the next attempt number of a due, unfinished, unleased delivery;
    read the endpoint and where its event is stored.

    The number is taken with the lease, so an attempt that outlives its lease and the
    one that takes the delivery over never share a number, and both count toward the
    retry schedule. Zero rows means someone else holds it, it is done, it is not due,
    it is not of this kind (`ordered`) or (ordered) not its turn yet (ordering.may_start).

    Each statement of the hot path reads one partition of each partitioned table, named
    by a value the statement is given: the planner prunes the others before it plans
    (a custom plan). The UPDATE names its delivery by id; the endpoint and the event's
    id row are plain tables read by key; the event's body is read next, by its id and
    received_at (`_EVENT`). A condition that a joined or correlated value decides (the
    event joined by the received_at read here; ordering's subqueries) cannot prune:
    PostgreSQL opens every partition's index for it on each execution (a day's
    partition each, 30-90 in all at the default retention), which is why an unordered
    delivery's claim carries none of them and the ordered rule has a statement of its
    own.
    """
    now = sa.bindparam("now")
    conditions: list[sa.ColumnElement[bool]] = [
        Delivery.id == sa.bindparam("delivery_id"),
        # Not in_(): an expanding IN re-renders the SQL on every execution.
        sa.or_(Delivery.status == PENDING, Delivery.status == RETRYING),
        sa.or_(Delivery.lease_until.is_(None), Delivery.lease_until < now),
        sa.or_(
            Delivery.next_attempt_at.is_(None),
            Delivery.next_attempt_at <= sa.bindparam("due_by"),
        ),
        # Its event is stored (a lease taken on a delivery whose event is gone would
        # read nothing and hold the delivery for a lease's length).
        sa.exists().where(StoredEventId.id == Delivery.event_id),
    ]
    if ordered:
        event_received_at = (
            sa.select(StoredEventId.received_at)
            .where(StoredEventId.id == Delivery.event_id)
            .scalar_subquery()
        )
        conditions += [Delivery.order_key.is_not(None), ordering.may_start(event_received_at)]
    else:
        conditions.append(Delivery.order_key.is_(None))
    claimed = (
        sa.update(Delivery)
        .where(*conditions)
        .values(lease_until=sa.bindparam("lease"), attempt_count=Delivery.attempt_count + 1)
        .returning(
            Delivery.attempt_count,
            Delivery.event_id,
            Delivery.endpoint_id,
            Delivery.tenant_id,
            Delivery.order_key,
            Delivery.order_seq,
        )
        .cte("claimed")
    )
    return (
        sa.select(
            claimed.c.attempt_count,
            claimed.c.event_id,
            StoredEventId.received_at,
            claimed.c.endpoint_id,
            claimed.c.tenant_id,
            Endpoint.url,
            Endpoint.status,
            Endpoint.deleted_at,
            Endpoint.failing_since,
            Endpoint.secret_encrypted,
            Endpoint.previous_secret_encrypted,
            Endpoint.previous_secret_expires_at,
            Endpoint.rate_limit_per_second,
            Endpoint.signature_scheme,
            claimed.c.order_key,
            claimed.c.order_seq,
        )
        .select_from(claimed)
        .join(StoredEventId, StoredEventId.id == claimed.c.event_id)
        .join(Endpoint, Endpoint.id == claimed.c.endpoint_id)
    )


#: When the unordered claim took nothing: whether the delivery is ordered, and whether
#: its event's id row is still there (one key read for both).
_UNCLAIMED = sa.select(
    Delivery.order_key.is_not(None),
    sa.exists().where(StoredEventId.id == Delivery.event_id),
).where(Delivery.id == sa.bindparam("delivery_id"))

#: Why nothing can be sent: the delivery's event is no longer stored.
EVENT_GONE = "its event is no longer stored (retention)"

#: End an unfinished, unleased delivery whose event's id row is gone: no claim can
#: take it again (the claim asks for that row), and left open it would be swept every
#: round and, ordered, hold its account's later events for good.
_END_EVENT_GONE = (
    sa.update(Delivery)
    .where(
        Delivery.id == sa.bindparam("delivery_id"),
        sa.or_(Delivery.status == PENDING, Delivery.status == RETRYING),
        sa.or_(Delivery.lease_until.is_(None), Delivery.lease_until < sa.bindparam("now")),
        ~sa.exists().where(StoredEventId.id == Delivery.event_id),
    )
    .values(
        status=FAILED,
        next_attempt_at=None,
        lease_until=None,
        last_error=EVENT_GONE,
        updated_at=sa.bindparam("now"),
    )
)

#: The claimed delivery's event, in the one partition its received_at names.
_EVENT = sa.select(StoredEvent.body, StoredEvent.created_at, StoredEvent.request_id).where(
    StoredEvent.id == sa.bindparam("event_id"),
    StoredEvent.received_at == sa.bindparam("received_at"),
)


#: The delivery is still the one this worker claimed: nobody took it over since.
_STILL_OURS = (
    Delivery.id == sa.bindparam("delivery_id"),
    Delivery.attempt_count == sa.bindparam("attempt_count"),
    sa.or_(Delivery.status == PENDING, Delivery.status == RETRYING),
)


def _record_statement() -> sa.Update:
    """The attempt row and the delivery's new state in one statement (a CTE)."""
    attempt = sa.insert(Attempt).values(
        delivery_id=sa.bindparam("delivery_id"),
        number=sa.bindparam("attempt_count"),
        attempted_at=sa.bindparam("last_attempt_at"),
        response_status=sa.bindparam("last_response_status"),
        latency_ms=sa.bindparam("latency_ms"),
        error=sa.bindparam("last_error"),
        response_body=sa.bindparam("response_body"),
        signature_header=sa.bindparam("signature_header"),
        webhook_signature=sa.bindparam("webhook_signature"),
    )
    return (
        sa.update(Delivery)
        .where(*_STILL_OURS)
        .values(
            status=sa.bindparam("status"),
            next_attempt_at=sa.bindparam("next_attempt_at"),
            last_attempt_at=sa.bindparam("last_attempt_at"),
            last_response_status=sa.bindparam("last_response_status"),
            last_error=sa.bindparam("last_error"),
            succeeded_at=sa.bindparam("succeeded_at"),
            lease_until=None,
            updated_at=sa.bindparam("updated_at"),
        )
        .add_cte(attempt.cte("new_attempt"))
    )


#: No attempt is made after all: the number taken with the lease goes back.
_NUMBER_BACK = Delivery.attempt_count - 1
#: Let go of the lease and be due later (the endpoint is saturated here).
_PUT_BACK = (
    sa.update(Delivery)
    .where(*_STILL_OURS)
    .values(
        lease_until=None,
        next_attempt_at=sa.bindparam("next_attempt_at"),
        attempt_count=_NUMBER_BACK,
    )
)
#: Keep the lease but give the number back (the attempt could not be signed).
_GIVE_BACK = sa.update(Delivery).where(*_STILL_OURS).values(attempt_count=_NUMBER_BACK)
#: End the delivery with no attempt: failed (its endpoint was deleted) or skipped (disabled).
_STOP = (
    sa.update(Delivery)
    .where(*_STILL_OURS)
    .values(
        status=sa.bindparam("status"),
        next_attempt_at=None,
        lease_until=None,
        last_error=sa.bindparam("reason"),
        updated_at=sa.bindparam("now"),
        attempt_count=_NUMBER_BACK,
    )
)
#: Say on an attempt's row that another worker took its delivery over (rare).
_MARK_LOST = (
    sa.update(Attempt)
    .where(
        Attempt.delivery_id == sa.bindparam("lost_delivery_id"),
        Attempt.number == sa.bindparam("lost_number"),
    )
    .values(error=sa.bindparam("lost_error"))
)
#: The endpoint's failure streak: cleared by a success, started (and counted) by a
#: failure, and the endpoint disabled once it has lasted until `cutoff`. A success
#: while nothing is failing never runs these (see Deliverer._record).
_STREAK_CLEAR = (
    sa.update(Endpoint)
    .where(
        Endpoint.id == sa.bindparam("endpoint_id"),
        sa.or_(Endpoint.failing_since.is_not(None), Endpoint.failed_attempts > 0),
    )
    .values(failing_since=None, failed_attempts=0)
)
#: The run the tenant was told about ends: the values before the clear (RETURNING
#: reads the row as this statement leaves it, and it leaves these two alone).
_STREAK_RECOVERED = (
    sa.update(Endpoint)
    .where(Endpoint.id == sa.bindparam("endpoint_id"), Endpoint.failing_notified_at.is_not(None))
    .values(failing_notified_at=None)
    .returning(Endpoint.failing_since, Endpoint.failed_attempts)
)
_STREAK_FAIL = (
    sa.update(Endpoint)
    .where(Endpoint.id == sa.bindparam("endpoint_id"))
    .values(
        failing_since=sa.func.coalesce(Endpoint.failing_since, sa.bindparam("now")),
        failed_attempts=Endpoint.failed_attempts + 1,
    )
)
#: The run is long enough, and the tenant not yet told: it is, once (the row's lock
#: orders concurrent failures; exactly one of them sets the mark).
_STREAK_FAILING = (
    sa.update(Endpoint)
    .where(
        Endpoint.id == sa.bindparam("endpoint_id"),
        Endpoint.failing_notified_at.is_(None),
        Endpoint.failed_attempts >= sa.bindparam("failing_after"),
    )
    .values(failing_notified_at=sa.bindparam("now"))
    .returning(Endpoint.failing_since, Endpoint.failed_attempts)
)
_STREAK_DISABLE = (
    sa.update(Endpoint)
    .where(
        Endpoint.id == sa.bindparam("endpoint_id"),
        Endpoint.status == ENABLED,
        Endpoint.failing_since <= sa.bindparam("cutoff"),
    )
    .values(status=DISABLED, disabled_reason=DISABLED_FAILING, updated_at=sa.bindparam("now"))
)

#: Deliveries waiting in a worker for a slot, unleased and due since `stale_before`: due
#: now (the array of ids is one parameter).
_KEEP_DUE = (
    sa.update(Delivery)
    .where(
        Delivery.id == sa.any_(sa.bindparam("keep_ids", type_=ARRAY(sa.String()))),
        sa.or_(Delivery.status == PENDING, Delivery.status == RETRYING),
        sa.or_(Delivery.lease_until.is_(None), Delivery.lease_until < sa.bindparam("now")),
        Delivery.next_attempt_at <= sa.bindparam("stale_before"),
    )
    .values(next_attempt_at=sa.bindparam("now"))
)


class DeliveryStore:
    """The hot path's statements, compiled once for `db`."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._claim = db.driver_statement(_claim_statement(ordered=False))
        self._claim_ordered = db.driver_statement(_claim_statement(ordered=True))
        self._unclaimed = db.driver_statement(_UNCLAIMED)
        self._end_event_gone = db.driver_statement(_END_EVENT_GONE)
        self._event = db.driver_statement(_EVENT)
        self._next_in_line = db.driver_statement(ordering.NEXT_IN_LINE)
        self._record = db.driver_statement(_record_statement())
        self._put_back = db.driver_statement(_PUT_BACK)
        self._give_back = db.driver_statement(_GIVE_BACK)
        self._stop = db.driver_statement(_STOP)
        self._mark_lost = db.driver_statement(_MARK_LOST)
        self._streak_clear = db.driver_statement(_STREAK_CLEAR)
        self._streak_recovered = db.driver_statement(_STREAK_RECOVERED)
        self._streak_fail = db.driver_statement(_STREAK_FAIL)
        self._streak_failing = db.driver_statement(_STREAK_FAILING)
        self._streak_disable = db.driver_statement(_STREAK_DISABLE)
        self._keep_due = db.driver_statement(_KEEP_DUE)

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """One pooled connection for an attempt, each statement its own transaction."""
        with self.db.driver_autocommit() as conn:
            yield conn

    def claim(
        self,
        conn: Connection,
        delivery_id: str,
        *,
        now: datetime,
        lease: datetime,
        due_by: datetime,
        gap_cutoff: datetime,
    ) -> Claim | None:
        """The lease until `lease` if the delivery is due by `due_by`, nobody holds it and
        (ordered) it is its turn; an event received before `gap_cutoff` no longer waits
        for the events numbered before it to arrive (ordering.py)."""
        params = {
            "delivery_id": delivery_id,
            "now": now,
            "due_by": due_by,
            "lease": lease,
            "gap_cutoff": gap_cutoff,
        }
        row = _run(conn, self._claim, params).fetchone()
        if row is None:
            state = _run(conn, self._unclaimed, {"delivery_id": delivery_id}).fetchone()
            if state is None:
                return None
            ordered, event_stored = state
            if not event_stored:
                gone = {"delivery_id": delivery_id, "now": now}
                if _run(conn, self._end_event_gone, gone).rowcount:
                    log.warning("delivery %s failed: %s", delivery_id, EVENT_GONE)
                return None
            if not ordered:
                return None
            row = _run(conn, self._claim_ordered, params).fetchone()
            if row is None:
                return None
        (
            number,
            event_id,
            received_at,
            endpoint_id,
            tenant_id,
            *endpoint,
            scheme,
            order_key,
            order_seq,
        ) = row
        event = _run(
            conn, self._event, {"event_id": event_id, "received_at": received_at}
        ).fetchone()
        if event is None:
            # Its partition was dropped since the claim saw the id row (retention keeps
            # events at least as long as deliveries: WebhookRetention; the id rows are
            # pruned after the drop). Nothing can ever be sent: the delivery ends
            # failed, with no attempt (the number goes back: attemptCount counts
            # attempts started), and no longer holds an ordered account.
            log.warning("delivery %s failed: %s", delivery_id, EVENT_GONE)
            stop = {
                "delivery_id": delivery_id,
                "attempt_count": number,
                "status": FAILED,
                "reason": EVENT_GONE,
                "now": now,
            }
            _run(conn, self._stop, stop)
            return None
        body, created_at, request_id = event
        return Claim(
            delivery_id,
            lease,
            number,
            event_id,
            body,
            created_at,
            endpoint_id,
            tenant_id,
            *endpoint,
            request_id,
            scheme,
            order_key,
            order_seq,
        )

    def next_in_line(self, conn: Connection, claim: Claim) -> tuple[str, str, str] | None:
        """(id, endpoint id, tenant id) of the ordered delivery after `claim`'s, now that
        `claim`'s is finished; None when it is not ordered or none waits."""
        if claim.order_key is None:
            return None
        params = {
            "endpoint_id": claim.endpoint_id,
            "order_key": claim.order_key,
            "order_seq": claim.order_seq,
        }
        row = _run(conn, self._next_in_line, params).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def record(
        self,
        conn: Connection,
        values: Mapping[str, Any],
        *,
        streak: bool,
        ok: bool,
        endpoint_id: str,
        now: datetime,
        disable_cutoff: datetime,
        failing_after: int,
    ) -> Recorded:
        """The attempt and the delivery's new state (`values`: the record statement's binds).

        With `streak`, the endpoint's failure streak too, in the same transaction: a
        success (`ok`) ends it (`recovered` when the tenant had been told it was
        failing); a failure starts or extends it, says `failing` when it has just
        reached `failing_after` attempts untold, and disables the endpoint when it
        began at or before `disable_cutoff`.
        """
        if not streak:
            return Recorded(_run(conn, self._record, values).rowcount > 0)
        binds = {
            "endpoint_id": endpoint_id,
            "now": now,
            "cutoff": disable_cutoff,
            "failing_after": failing_after,
        }
        with conn.transaction():
            updated = _run(conn, self._record, values).rowcount > 0
            if ok:
                recovered = _run(conn, self._streak_recovered, binds).fetchone()
                _run(conn, self._streak_clear, binds)
                return Recorded(updated, recovered=_run_of(recovered))
            _run(conn, self._streak_fail, binds)
            failing = _run(conn, self._streak_failing, binds).fetchone()
            disabled = _run(conn, self._streak_disable, binds).rowcount > 0
        return Recorded(updated, disabled, failing=_run_of(failing))

    def put_back(self, conn: Connection, claim: Claim, next_attempt_at: datetime) -> None:
        """Let go of the lease; the delivery is due again at `next_attempt_at`."""
        params = {
            "delivery_id": claim.delivery_id,
            "attempt_count": claim.attempt_number,
            "next_attempt_at": next_attempt_at,
        }
        _run(conn, self._put_back, params)

    def give_back(self, conn: Connection, claim: Claim) -> None:
        """No attempt after all (it could not be signed): keep the lease, return the number."""
        params = {"delivery_id": claim.delivery_id, "attempt_count": claim.attempt_number}
        _run(conn, self._give_back, params)

    def mark_lost(self, conn: Connection, claim: Claim, error: str) -> None:
        """Set `error` on the claim's attempt row (it lost its delivery to another worker)."""
        params = {
            "lost_delivery_id": claim.delivery_id,
            "lost_number": claim.attempt_number,
            "lost_error": error,
        }
        _run(conn, self._mark_lost, params)

    def stop(
        self, conn: Connection, claim: Claim, reason: str, now: datetime, *, status: str = FAILED
    ) -> None:
        """End the delivery (`status`) with `reason` as its last error, without an attempt."""
        params = {
            "delivery_id": claim.delivery_id,
            "attempt_count": claim.attempt_number,
            "status": status,
            "reason": reason,
            "now": now,
        }
        _run(conn, self._stop, params)

    def keep_due(
        self, delivery_ids: Sequence[str], now: datetime, *, stale_before: datetime | None = None
    ) -> int:
        """Make each of these deliveries that is still unleased and was due at or before
        `stale_before` (default `now`) due `now` (see actors.Deliverer.keep_waiting);
        returns how many rows were kept. `next_attempt_at` is indexed, so each rewrite
        is a new index entry: rows kept lately are left as they are.

        One statement with the ids as one array parameter: an expanding IN of a few
        hundred binds took the worker's GIL for ~90 ms per round."""
        with self.db.driver_autocommit() as conn:
            params = {
                "keep_ids": list(delivery_ids),
                "now": now,
                "stale_before": now if stale_before is None else min(stale_before, now),
            }
            return int(_run(conn, self._keep_due, params).rowcount)


def _run_of(row: Any) -> FailureRun | None:
    return None if row is None else FailureRun(row[0], row[1])


def _run(conn: Connection, statement: DriverStatement, values: Mapping[str, Any]) -> Any:
    return conn.execute(statement.sql, statement.bind(values))
