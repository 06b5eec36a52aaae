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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import dramatiq
import psycopg
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
from services.notifier.secrets import SecretBox, SecretDecryptError
from services.notifier.sender import Sender, SendResult
from shared import signing
from shared.bus import BusNames
from shared.db import DriverStatement, UTCDateTime
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


@dataclass(frozen=True, slots=True)
class _EndpointView:
    """The endpoint columns read with the claim (a plain object: no ORM instrumentation)."""

    url: str
    status: str
    deleted_at: datetime | None
    failing_since: datetime | None
    secret_encrypted: str
    previous_secret_encrypted: str | None
    previous_secret_expires_at: datetime | None


class SecretCache:
    """Decrypted endpoint secrets, keyed by their ciphertext, per process.

    A Fernet decrypt (HMAC check + AES) per attempt is a measurable share of the
    worker's CPU. Keying by the stored token, not the endpoint id, means a rotation
    (a new token) applies on the very next attempt: a cached entry can never be
    stale, only unused. Entries expire after `ttl_s` so the plaintext of a deleted
    or rotated secret does not stay in memory for long, and the cache is bounded.
    """

    def __init__(
        self,
        box: SecretBox,
        *,
        ttl_s: float = 300.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.box = box
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def decrypt(self, token: str) -> str:
        """The plaintext of `token`; raises SecretDecryptError like SecretBox.decrypt."""
        now = self._clock()
        entry = self._entries.get(token)
        if entry is not None and entry[1] > now:
            return entry[0]
        secret = self.box.decrypt(token)
        with self._lock:
            if len(self._entries) >= self.max_entries:
                # Rare (more live secrets than entries): start over rather than track LRU.
                self._entries.clear()
            self._entries[token] = (secret, now + self.ttl_s)
        return secret

    def signing_secrets(self, endpoint: _EndpointView, now: datetime) -> list[str]:
        """endpoints.signing_secrets, decrypting through this cache."""
        return signing_secrets(endpoint, self, now)


def _aware_utc(value: datetime | None) -> datetime | None:
    """What UTCDateTime does to a value read (psycopg gives the session's time zone)."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _endpoint_view(columns: Sequence[Any]) -> _EndpointView:
    """The endpoint from the values of `_ENDPOINT_COLUMNS`, in that order."""
    url, status, deleted_at, failing_since, secret, previous, previous_expires = columns
    return _EndpointView(
        url=url,
        status=status,
        deleted_at=_aware_utc(deleted_at),
        failing_since=_aware_utc(failing_since),
        secret_encrypted=secret,
        previous_secret_encrypted=previous,
        previous_secret_expires_at=_aware_utc(previous_expires),
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
    endpoint: _EndpointView


#: What an attempt reads besides the delivery: the event's body and the endpoint.
_CLAIM_READS = (StoredEvent.body, StoredEvent.created_at, *_ENDPOINT_COLUMNS)


def _log_attempt(claim: _Claim, result: SendResult, outcome: str, delay: float | None) -> None:
    """One line per attempt: the endpoint, what it answered, how fast, what happens next."""
    answer = result.status if result.status is not None else result.error
    retry = f"; next try in {delay:.0f} s" if delay is not None and not result.ok else ""
    log.info(
        "delivery %s of %s to %s: attempt %d -> %s (%s) in %.0f ms%s",
        claim.delivery_id,
        claim.event_id,
        claim.endpoint.url,
        claim.attempt_number,
        answer,
        outcome,
        result.latency_ms,
        retry,
    )


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
            # Not in_(): an expanding IN re-renders the SQL on every execution.
            sa.or_(Delivery.status == PENDING, Delivery.status == RETRYING),
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


#: The endpoint's failure streak (bind `endpoint_id`, and `now` / `cutoff`).
_STREAK_CLEAR = (
    sa.update(Endpoint)
    .where(Endpoint.id == sa.bindparam("endpoint_id"), Endpoint.failing_since.is_not(None))
    .values(failing_since=None)
)
_STREAK_START = (
    sa.update(Endpoint)
    .where(Endpoint.id == sa.bindparam("endpoint_id"), Endpoint.failing_since.is_(None))
    .values(failing_since=sa.bindparam("now", type_=UTCDateTime))
)
_STREAK_DISABLE = (
    sa.update(Endpoint)
    .where(
        Endpoint.id == sa.bindparam("endpoint_id"),
        Endpoint.status == ENABLED,
        Endpoint.failing_since <= sa.bindparam("cutoff", type_=UTCDateTime),
    )
    .values(
        status=DISABLED,
        disabled_reason=DISABLED_FAILING,
        updated_at=sa.bindparam("now", type_=UTCDateTime),
    )
)


class Deliverer:
    """One attempt of one delivery, from claim to the next schedule.

    The hot path holds one pooled connection per attempt and, on PostgreSQL, makes
    two round trips: the claim (one autocommitted UPDATE ... FROM ... RETURNING that
    takes the lease and reads the event and the endpoint, committed before the HTTP
    request), then one autocommitted statement recording the attempt and the
    delivery's new state together (a CTE). Only when the endpoint's failure streak
    changes do the record and the streak updates run in an explicit transaction.
    Both statements are compiled once and run on psycopg directly (see DriverStatement).
    On SQLite the same steps run through SQLAlchemy in transactions.
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
        self.secrets = SecretCache(ctx.secret_box)
        self.dispatch: Dispatch | None = None
        self._lease_s = sender.max_duration_s + self.tuning.lease_margin_s
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
            dialect = self.engine.dialect
            self._pg_claim = DriverStatement(self._claim_stmt, dialect)
            self._pg_record = DriverStatement(self._record_stmt, dialect)
            self._pg_streak = {
                stmt: DriverStatement(stmt, dialect)
                for stmt in (_STREAK_CLEAR, _STREAK_START, _STREAK_DISABLE)
            }
            # Each statement of the hot path is its own transaction: no BEGIN/COMMIT trips.
            self._connect = self.engine.execution_options(isolation_level="AUTOCOMMIT").connect
        else:
            self._connect = self.engine.connect
        # Label children looked up once (prometheus_client takes a lock per labels()).
        self._attempts_ok = metrics.attempts.labels("success")
        self._succeeded = metrics.deliveries.labels(SUCCEEDED)

    # -- the actor body --------------------------------------------------------------

    def deliver(self, delivery_id: str, bounces: int = 0) -> str:
        """Run one attempt if this call wins the delivery; returns what happened (for tests)."""
        with self._connect() as conn:
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

    def _execute(
        self, conn: sa.Connection, compiled: DriverStatement, values: Mapping[str, Any]
    ) -> psycopg.Cursor[Any]:
        """`compiled` on the connection's psycopg connection (PostgreSQL only)."""
        driver = conn.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        try:
            return driver.execute(compiled.sql, compiled.bind(values))
        except psycopg.OperationalError:
            # What SQLAlchemy does on a disconnect: never pool this connection again
            # (a statement or lock timeout leaves a live connection, which stays).
            if driver.closed or driver.broken:
                conn.invalidate()
            raise

    def _claim(self, conn: sa.Connection, delivery_id: str) -> _Claim | None:
        now = utcnow()
        lease = now + timedelta(seconds=self._lease_s)
        due_by = now + timedelta(seconds=self.tuning.due_slack_s)
        params = {"delivery_id": delivery_id, "now": now, "due_by": due_by, "lease": lease}
        if self._join_claim:
            row = self._execute(conn, self._pg_claim, params).fetchone()
            if row is None:
                return None
            # attempt_count, event_id, endpoint_id, then _CLAIM_READS
            attempts, event_id, endpoint_id, body, created_at, *endpoint = row
        else:
            with conn.begin():
                claimed = conn.execute(self._claim_stmt, params).one_or_none()
                if claimed is None:
                    return None
                attempts, event_id, endpoint_id = claimed
                read = conn.execute(
                    self._claim_reads, {"event_id": event_id, "endpoint_id": endpoint_id}
                ).one()
            body, created_at, *endpoint = read
        return _Claim(
            delivery_id=delivery_id,
            lease_until=lease,
            attempt_number=attempts + 1,
            event_id=event_id,
            event_body=body,
            event_created_at=_aware_utc(created_at) or now,
            endpoint_id=endpoint_id,
            endpoint=_endpoint_view(endpoint),
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
            secrets = self.secrets.signing_secrets(claim.endpoint, utcnow())
        except SecretDecryptError:
            # A configuration fault, not the receiver's: keep the lease so the sweeper
            # retries once the key is fixed, and say so loudly.
            log.error("cannot decrypt the secret of endpoint %s", claim.endpoint_id)
            raise
        attempted_at = utcnow()
        # Signed with the attempt's own time, so the API can show the timestamp header
        # exactly as sent (the signature sent is recorded too).
        headers = signing.sign_headers(
            secrets,
            body,
            claim.event_id,
            claim.delivery_id,
            timestamp=int(attempted_at.timestamp()),
        )
        result = self.sender.send(claim.endpoint.url, body, headers)
        self.metrics.attempt_latency.observe(result.latency_ms / 1000.0)
        if result.ok:
            self._attempts_ok.inc()
        else:
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
            "latency_ms": result.latency_ms,
            "response_body": result.body,
            "signature_header": signature,
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
        # A success ends a failure streak; only touch the endpoint when there is one.
        streak = not result.ok or claim.endpoint.failing_since is not None
        if self._join_claim:
            updated = self._record_pg(conn, claim, values, streak=streak, ok=result.ok, now=now)
        else:
            with conn.begin():
                conn.execute(self._attempt_stmt, values)
                updated = conn.execute(self._record_stmt, values).rowcount
                if streak:
                    self._track_endpoint(conn, claim.endpoint_id, ok=result.ok, now=now)
        _log_attempt(claim, result, values["status"] if updated else "lease_lost", delay)
        if not updated:
            # Our lease lapsed and another worker took the delivery: its record wins
            # for the delivery's state. Our attempt row stays: the POST did happen, and
            # the attempt log is what support reads to see that it did.
            log.warning(
                "delivery %s: lease lost before the attempt was recorded", claim.delivery_id
            )
            return "lease_lost"
        if result.ok:
            self._succeeded.inc()
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

    def _record_pg(
        self,
        conn: sa.Connection,
        claim: _Claim,
        values: Mapping[str, Any],
        *,
        streak: bool,
        ok: bool,
        now: datetime,
    ) -> int:
        """The record statement alone (autocommitted), or with the streak in one transaction."""
        if not streak:
            return self._execute(conn, self._pg_record, values).rowcount
        driver = conn.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        with driver.transaction():
            updated = self._execute(conn, self._pg_record, values).rowcount
            self._track_endpoint(conn, claim.endpoint_id, ok=ok, now=now)
        return updated

    def _track_endpoint(
        self, conn: sa.Connection, endpoint_id: str, *, ok: bool, now: datetime
    ) -> None:
        """Failure streak: set on the first failure, cleared by a success, disables when too long.

        Conditional updates, so the common case (no change) locks nothing. Runs inside
        the caller's transaction.
        """
        values = {
            "endpoint_id": endpoint_id,
            "now": now,
            "cutoff": now - timedelta(seconds=self.config.disable_after_s),
        }
        if ok:
            self._run(conn, _STREAK_CLEAR, values)
            return
        self._run(conn, _STREAK_START, values)
        if self._run(conn, _STREAK_DISABLE, values):
            log.warning(
                "endpoint %s disabled: every attempt failed for %.0fs",
                endpoint_id,
                self.config.disable_after_s,
            )

    def _run(self, conn: sa.Connection, statement: sa.Update, values: Mapping[str, Any]) -> int:
        """Rows changed by one of the streak statements, on either backend."""
        if self._join_claim:
            return self._execute(conn, self._pg_streak[statement], values).rowcount
        return conn.execute(statement, values).rowcount


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
