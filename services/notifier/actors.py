"""The delivery actors: claim a delivery, sign, POST, record the attempt, schedule the next.

`deliver(delivery_id)` runs on queue `webhooks` (first attempts, sweeper re-sends)
and the same logic on `webhooks.retry` (scheduled retries, delayed messages), so a
backlog of retries never holds up fresh events.

The database row is the truth, the message only a nudge: an actor claims the
delivery with a lease (`lease_until`) in one conditional UPDATE, so duplicate or
stale messages are no-ops, and a worker killed mid-attempt leaves a lease that
lapses, after which the sweeper enqueues the delivery again (at least once, never
lost). HTTP failures never raise: the actor records them and schedules the retry
itself, and returns, so Dramatiq acks the message only after the attempt is
recorded. Dramatiq's own retries are off (`max_retries=0`).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import dramatiq
import sqlalchemy as sa

from services.notifier.context import NotifierContext
from services.notifier.endpoints import ENDPOINT_DELETED, signing_secrets
from services.notifier.metrics import NotifierMetrics
from services.notifier.models import (
    DISABLED,
    ENABLED,
    FAILED,
    PENDING,
    RETRYING,
    SUCCEEDED,
    Attempt,
    Delivery,
    Endpoint,
    StoredEvent,
)
from services.notifier.secrets import SecretDecryptError
from services.notifier.sender import Sender, SendResult
from shared import signing
from shared.bus import BusNames
from shared.db import UTCDateTime
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

#: Queue names before the SETTLE_AMQP_PREFIX.
QUEUE = "webhooks"
RETRY_QUEUE = "webhooks.retry"
#: Why an endpoint was disabled by the engine (see endpoints.DISABLED_MANUAL for PATCH).
DISABLED_FAILING = "failing"
#: `last_error` of a delivery stopped because its endpoint is disabled.
ENDPOINT_DISABLED = "endpoint_disabled"
#: Longest `last_error` kept (the column holds 500).
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class DeliveryTuning:
    """Knobs of the attempt logic beyond NotifierConfig (see engine.EngineSettings)."""

    #: Added to the HTTP timeout to make the lease: the attempt must be recorded by then.
    lease_margin_s: float = 5.0
    #: A message may claim a delivery due this much later (clock skew, early delayed messages).
    due_slack_s: float = 0.25
    #: First and longest wait before a delivery whose endpoint is saturated is tried again.
    saturated_first_s: float = 0.05
    saturated_max_s: float = 5.0


class Dispatch(Protocol):
    """Sends delivery messages (implemented by DeliveryActors)."""

    def schedule(self, delivery_id: str, delay_s: float, *, bounces: int = 0) -> None: ...


class EndpointLimiter:
    """Per-endpoint concurrency within this process; never blocks."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._busy: dict[str, int] = {}
        self._lock = threading.Lock()

    def try_acquire(self, endpoint_id: str) -> bool:
        with self._lock:
            busy = self._busy.get(endpoint_id, 0)
            if busy >= self.limit:
                return False
            self._busy[endpoint_id] = busy + 1
            return True

    def release(self, endpoint_id: str) -> None:
        with self._lock:
            busy = self._busy.get(endpoint_id, 0) - 1
            if busy <= 0:
                self._busy.pop(endpoint_id, None)
            else:
                self._busy[endpoint_id] = busy

    def busy(self, endpoint_id: str) -> int:
        with self._lock:
            return self._busy.get(endpoint_id, 0)


def retry_delay(
    attempt_number: int,
    schedule: tuple[float, ...],
    *,
    jitter: float,
    retry_after_s: float | None = None,
    retry_after_max_s: float = 3600.0,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """Seconds until the attempt after `attempt_number` (1-based), or None when none is left.

    The schedule step gets +-`jitter` (a fraction). A receiver's Retry-After can
    push the retry later, up to `retry_after_max_s`, never earlier than the step.
    """
    if attempt_number < 1 or attempt_number > len(schedule):
        return None
    step = schedule[attempt_number - 1]
    delay = step * (1.0 + jitter * (2.0 * rand() - 1.0))
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, retry_after_max_s))
    return max(0.0, delay)


#: Endpoint columns an attempt needs (read with the claim, in the same statement).
_ENDPOINT_COLUMNS = (
    Endpoint.url,
    Endpoint.status,
    Endpoint.deleted_at,
    Endpoint.failing_since,
    Endpoint.secret_encrypted,
    Endpoint.previous_secret_encrypted,
    Endpoint.previous_secret_expires_at,
)


@dataclass
class _Claim:
    """What an actor holds after winning the lease."""

    delivery_id: str
    lease_until: datetime
    attempt_number: int
    event_id: str
    event_body: str
    event_created_at: datetime
    endpoint_id: str
    #: The endpoint as read with the claim (url, status, secrets, failure streak).
    endpoint: Endpoint


#: What an attempt reads besides the delivery: the event's body and the endpoint.
_CLAIM_READS = (StoredEvent.body, StoredEvent.created_at, *_ENDPOINT_COLUMNS)


def _claim_statement(*, join: bool) -> sa.Update:
    """Take the lease of a due, unfinished, unleased delivery.

    Zero rows means someone else holds it, it is done, or it is not due yet. With
    `join` (PostgreSQL) the same statement also reads all an attempt needs
    (UPDATE ... FROM ... RETURNING); SQLite's RETURNING sees only the updated table,
    so there a second query reads the event and the endpoint.
    """
    now = sa.bindparam("now", type_=UTCDateTime)
    statement = (
        sa.update(Delivery)
        .where(
            Delivery.id == sa.bindparam("delivery_id"),
            Delivery.status.in_((PENDING, RETRYING)),
            sa.or_(Delivery.lease_until.is_(None), Delivery.lease_until < now),
            sa.or_(
                Delivery.next_attempt_at.is_(None),
                Delivery.next_attempt_at <= sa.bindparam("due_by", type_=UTCDateTime),
            ),
        )
        .values(lease_until=sa.bindparam("lease", type_=UTCDateTime))
    )
    columns = (Delivery.attempt_count, Delivery.event_id, Delivery.endpoint_id)
    if not join:
        return statement.returning(*columns)
    return statement.where(
        StoredEvent.id == Delivery.event_id, Endpoint.id == Delivery.endpoint_id
    ).returning(*columns, *_CLAIM_READS)


def _claim_reads() -> sa.Select[Any]:
    both = sa.join(StoredEvent, Endpoint, sa.true())  # one row each: not a real product
    return (
        sa.select(*_CLAIM_READS)
        .select_from(both)
        .where(
            StoredEvent.id == sa.bindparam("event_id"),
            Endpoint.id == sa.bindparam("endpoint_id"),
        )
    )


class Deliverer:
    """One attempt of one delivery, from claim to the next schedule.

    The hot path runs on SQLAlchemy Core with one pooled connection per attempt: a
    claim statement (committed before the HTTP request), then one transaction
    recording the attempt, the delivery's new state and, on failure, the endpoint's
    failure streak.
    """

    def __init__(
        self,
        ctx: NotifierContext,
        sender: Sender,
        metrics: NotifierMetrics,
        *,
        tuning: DeliveryTuning | None = None,
        limiter: EndpointLimiter | None = None,
    ) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.engine = ctx.db.engine
        self.sender = sender
        self.metrics = metrics
        self.tuning = tuning or DeliveryTuning()
        self.limiter = limiter or EndpointLimiter(ctx.config.per_endpoint_concurrency)
        self.dispatch: Dispatch | None = None
        self._join_claim = self.engine.dialect.name == "postgresql"
        self._claim_stmt = _claim_statement(join=self._join_claim)
        self._claim_reads = _claim_reads()
        self._record_stmt = (
            sa.update(Delivery)
            .where(
                Delivery.id == sa.bindparam("delivery_id"),
                Delivery.lease_until == sa.bindparam("lease", type_=UTCDateTime),
            )
            .values(
                attempt_count=sa.bindparam("attempt_count"),
                status=sa.bindparam("status"),
                next_attempt_at=sa.bindparam("next_attempt_at", type_=UTCDateTime),
                last_attempt_at=sa.bindparam("last_attempt_at", type_=UTCDateTime),
                last_response_status=sa.bindparam("last_response_status"),
                last_error=sa.bindparam("last_error"),
                succeeded_at=sa.bindparam("succeeded_at", type_=UTCDateTime),
                lease_until=None,
                updated_at=sa.bindparam("updated_at", type_=UTCDateTime),
            )
        )
        self._attempt_stmt = sa.insert(Attempt).values(
            delivery_id=sa.bindparam("delivery_id"),
            number=sa.bindparam("attempt_count"),
            attempted_at=sa.bindparam("last_attempt_at", type_=UTCDateTime),
            response_status=sa.bindparam("last_response_status"),
            latency_ms=sa.bindparam("latency_ms"),
            error=sa.bindparam("last_error"),
            response_body=sa.bindparam("response_body"),
            signature_header=sa.bindparam("signature_header"),
        )
        if self._join_claim:
            # PostgreSQL: the attempt and the delivery's new state in one statement.
            self._record_stmt = self._record_stmt.add_cte(self._attempt_stmt.cte("new_attempt"))

    # -- the actor body --------------------------------------------------------------

    def deliver(self, delivery_id: str, bounces: int = 0) -> str:
        """Run one attempt if this call wins the delivery; returns what happened (for tests)."""
        with self.engine.connect() as conn:
            claim = self._claim(conn, delivery_id)
            if claim is None:
                return "not_claimed"
            if not self.limiter.try_acquire(claim.endpoint_id):
                self._put_back(conn, claim, bounces)
                return "saturated"
            try:
                endpoint = claim.endpoint
                if endpoint.deleted_at is not None or endpoint.status != ENABLED:
                    self._stop(conn, claim)
                    return "stopped"
                return self._attempt(conn, claim)
            finally:
                self.limiter.release(claim.endpoint_id)

    def _claim(self, conn: sa.Connection, delivery_id: str) -> _Claim | None:
        now = utcnow()
        lease = now + timedelta(seconds=self.sender.max_duration_s + self.tuning.lease_margin_s)
        due_by = now + timedelta(seconds=self.tuning.due_slack_s)
        params = {"delivery_id": delivery_id, "now": now, "due_by": due_by, "lease": lease}
        with conn.begin():
            claimed = conn.execute(self._claim_stmt, params).one_or_none()
            if claimed is None:
                return None
            row = claimed
            if not self._join_claim:
                row = conn.execute(
                    self._claim_reads,
                    {"event_id": claimed.event_id, "endpoint_id": claimed.endpoint_id},
                ).one()
        endpoint = Endpoint(
            id=claimed.endpoint_id,
            url=row.url,
            status=row.status,
            deleted_at=row.deleted_at,
            failing_since=row.failing_since,
            secret_encrypted=row.secret_encrypted,
            previous_secret_encrypted=row.previous_secret_encrypted,
            previous_secret_expires_at=row.previous_secret_expires_at,
        )
        return _Claim(
            delivery_id=delivery_id,
            lease_until=lease,
            attempt_number=claimed.attempt_count + 1,
            event_id=claimed.event_id,
            event_body=row.body,
            event_created_at=row.created_at,
            endpoint_id=claimed.endpoint_id,
            endpoint=endpoint,
        )

    def _put_back(self, conn: sa.Connection, claim: _Claim, bounces: int) -> None:
        """The endpoint has every slot busy here: let go and try again a little later.

        The row is kept truthful (lease released, due later), so neither the sweeper
        nor a stale message races the delayed message.
        """
        tuning = self.tuning
        delay = min(tuning.saturated_max_s, tuning.saturated_first_s * (2**bounces))
        delay *= random.uniform(1.0, 1.5)
        now = utcnow()
        with conn.begin():
            conn.execute(
                sa.update(Delivery)
                .where(Delivery.id == claim.delivery_id, Delivery.lease_until == claim.lease_until)
                .values(lease_until=None, next_attempt_at=now + timedelta(seconds=delay))
            )
        self.metrics.saturated.inc()
        assert self.dispatch is not None
        self.dispatch.schedule(claim.delivery_id, delay, bounces=min(bounces + 1, 16))

    def _stop(self, conn: sa.Connection, claim: _Claim) -> None:
        """The endpoint was deleted or disabled: the delivery ends failed, with no attempt."""
        reason = ENDPOINT_DELETED if claim.endpoint.deleted_at is not None else ENDPOINT_DISABLED
        now = utcnow()
        with conn.begin():
            conn.execute(
                sa.update(Delivery)
                .where(Delivery.id == claim.delivery_id, Delivery.lease_until == claim.lease_until)
                .values(
                    status=FAILED,
                    next_attempt_at=None,
                    lease_until=None,
                    last_error=reason,
                    updated_at=now,
                )
            )
        self.metrics.deliveries.labels(FAILED).inc()

    def _attempt(self, conn: sa.Connection, claim: _Claim) -> str:
        body = claim.event_body.encode("utf-8")
        try:
            secrets = signing_secrets(claim.endpoint, self.ctx.secret_box, utcnow())
        except SecretDecryptError:
            # A configuration fault, not the receiver's: keep the lease so the sweeper
            # retries once the key is fixed, and say so loudly.
            log.error("cannot decrypt the secret of endpoint %s", claim.endpoint_id)
            raise
        headers = signing.sign_headers(secrets, body, claim.event_id, claim.delivery_id)
        attempted_at = utcnow()
        result = self.sender.send(claim.endpoint.url, body, headers)
        self.metrics.attempt_latency.observe(result.latency_ms / 1000.0)
        self.metrics.attempts.labels(_outcome_label(result)).inc()
        return self._record(conn, claim, result, attempted_at, headers[signing.SIGNATURE_HEADER])

    def _record(
        self,
        conn: sa.Connection,
        claim: _Claim,
        result: SendResult,
        attempted_at: datetime,
        signature: str,
    ) -> str:
        """The attempt, the delivery's new state and the endpoint's streak, in one transaction."""
        config = self.config
        now = utcnow()
        delay: float | None = None
        error = result.error[:MAX_ERROR_CHARS] if result.error else None
        values: dict[str, Any] = {
            "delivery_id": claim.delivery_id,
            "lease": claim.lease_until,
            "attempt_count": claim.attempt_number,
            "last_attempt_at": attempted_at,
            "last_response_status": result.status,
            "last_error": error,
            "updated_at": now,
            "succeeded_at": None,
        }
        if result.ok:
            values.update(status=SUCCEEDED, next_attempt_at=None, succeeded_at=now)
        else:
            delay = retry_delay(
                claim.attempt_number,
                config.retry_schedule,
                jitter=config.retry_jitter,
                retry_after_s=result.retry_after_s,
                retry_after_max_s=config.retry_after_max_s,
            )
            if delay is None:
                values.update(status=FAILED, next_attempt_at=None)
            else:
                values.update(status=RETRYING, next_attempt_at=now + timedelta(seconds=delay))
        values.update(
            latency_ms=result.latency_ms, response_body=result.body, signature_header=signature
        )
        with conn.begin():
            if not self._join_claim:
                conn.execute(self._attempt_stmt, values)
            updated = conn.execute(self._record_stmt, values).rowcount
            # A success ends a failure streak; only touch the row when there is one.
            if not result.ok or claim.endpoint.failing_since is not None:
                self._track_endpoint(conn, claim.endpoint_id, ok=result.ok, now=now)
        if not updated:
            # Our lease lapsed and another worker took the delivery: its record wins.
            log.warning(
                "delivery %s: lease lost before the attempt was recorded", claim.delivery_id
            )
            return "lease_lost"
        if result.ok:
            self.metrics.deliveries.labels(SUCCEEDED).inc()
            self.metrics.end_to_end.observe(
                max(0.0, (now - claim.event_created_at).total_seconds())
            )
            return SUCCEEDED
        if delay is None:
            self.metrics.deliveries.labels(FAILED).inc()
            log.info(
                "delivery %s failed for good after %d attempts",
                claim.delivery_id,
                claim.attempt_number,
            )
            return FAILED
        assert self.dispatch is not None
        try:
            self.dispatch.schedule(claim.delivery_id, delay)
        except Exception:
            # The row says when it is due; the sweeper sends it if this message is lost.
            log.exception("could not schedule the retry of %s; the sweeper will", claim.delivery_id)
        return RETRYING

    def _track_endpoint(
        self, conn: sa.Connection, endpoint_id: str, *, ok: bool, now: datetime
    ) -> None:
        """Failure streak: set on the first failure, cleared by a success, disables when too long.

        Conditional updates, so the common case (no change) locks nothing.
        """
        if ok:
            conn.execute(
                sa.update(Endpoint)
                .where(Endpoint.id == endpoint_id, Endpoint.failing_since.is_not(None))
                .values(failing_since=None)
            )
            return
        conn.execute(
            sa.update(Endpoint)
            .where(Endpoint.id == endpoint_id, Endpoint.failing_since.is_(None))
            .values(failing_since=now)
        )
        cutoff = now - timedelta(seconds=self.config.disable_after_s)
        disabled = conn.execute(
            sa.update(Endpoint)
            .where(
                Endpoint.id == endpoint_id,
                Endpoint.status == ENABLED,
                Endpoint.failing_since <= cutoff,
            )
            .values(status=DISABLED, disabled_reason=DISABLED_FAILING, updated_at=now)
        ).rowcount
        if disabled:
            log.warning(
                "endpoint %s disabled: every attempt failed for %.0fs",
                endpoint_id,
                self.config.disable_after_s,
            )


def _outcome_label(result: SendResult) -> str:
    if result.ok:
        return "success"
    error = result.error or "error"
    return error.split(":", 1)[0]


class DeliveryActors:
    """The two Dramatiq actors, declared on a broker built by the caller (no globals)."""

    def __init__(
        self, broker: dramatiq.Broker, deliverer: Deliverer, names: BusNames | None = None
    ) -> None:
        names = names or BusNames()
        self.queue = names.queue(QUEUE)
        self.retry_queue = names.queue(RETRY_QUEUE)
        options = {"max_retries": 0}

        def deliver(delivery_id: str, bounces: int = 0) -> None:
            deliverer.deliver(delivery_id, bounces)

        def deliver_retry(delivery_id: str, bounces: int = 0) -> None:
            deliverer.deliver(delivery_id, bounces)

        self.deliver = dramatiq.Actor(
            deliver,
            broker=broker,
            actor_name="deliver",
            queue_name=self.queue,
            priority=0,
            options=dict(options),
        )
        self.deliver_retry = dramatiq.Actor(
            deliver_retry,
            broker=broker,
            actor_name="deliver_retry",
            queue_name=self.retry_queue,
            priority=0,
            options=dict(options),
        )
        deliverer.dispatch = self

    def enqueue(self, delivery_ids: list[str]) -> None:
        """First attempts (and sweeper re-sends): due now."""
        for delivery_id in delivery_ids:
            self.deliver.send(delivery_id)

    def schedule(self, delivery_id: str, delay_s: float, *, bounces: int = 0) -> None:
        """A later attempt on the retry queue, delayed by `delay_s`."""
        kwargs = {"bounces": bounces} if bounces else {}
        self.deliver_retry.send_with_options(
            args=(delivery_id,), kwargs=kwargs, delay=max(0, int(delay_s * 1000))
        )
