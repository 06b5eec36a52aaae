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

The parts: SQL in delivery_store.py, when to try again in retry_policy.py,
per-endpoint concurrency in limiter.py, decrypted secrets in secret_cache.py, the
job queues in broker.py; wired together in delivery_engine.py.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, Protocol

import dramatiq
from sqlalchemy.orm import Session

from services.notifier import operational_events
from services.notifier.breaker import CircuitBreakers
from services.notifier.broker import DeliveryQueues
from services.notifier.config import NotifierConfig
from services.notifier.delivery_store import (
    DISABLED_FAILING,
    Claim,
    Connection,
    DeliveryStore,
    Recorded,
)
from services.notifier.fanout import ENDPOINT_DISABLED
from services.notifier.limiter import EndpointLimiter, EndpointRates, Waiting, WaitingRoom
from services.notifier.metrics import NotifierMetrics
from services.notifier.models import (
    ENABLED,
    FAILED,
    RETRYING,
    SKIPPED,
    SUCCEEDED,
    Delivery,
    Endpoint,
)
from services.notifier.retry_policy import DeliveryTuning, retry_delay, saturated_delay
from services.notifier.secret_cache import SecretCache
from services.notifier.secrets import SecretDecryptError
from services.notifier.sender import SendResult
from services.notifier.webhook_endpoints import ENDPOINT_DELETED
from shared import failover, logs, signing
from shared.db import Database
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

#: Longest `last_error` kept (the column holds 500).
MAX_ERROR_CHARS = 500
#: Most times a saturated delivery's backoff doubles.
MAX_BOUNCES = 16
#: The error of an attempt whose delivery another worker took over before it was
#: recorded (its lease lapsed): the POST happened, its answer decided nothing.
LEASE_LOST = "lease_lost"
#: Most waiting deliveries one job's thread runs after its own, each in the slot the one
#: before freed (bounded, with one attempt deadline of time, as the job's ack waits).
INLINE_AT_MOST = 64
#: What `_claimed` returns when the delivery is over (its ordered successor may go).
_FINISHED = frozenset({SUCCEEDED, FAILED, "stopped"})
#: Dramatiq priority of retries (first attempts have 0): first attempts never wait
#: behind a backlog of retries of failing endpoints.
RETRY_PRIORITY = 10


#: (endpoint id, tenant id) of a delivery, carried by the messages of put-back deliveries.
Route = tuple[str, str]


#: A job for a delivery this close to (or past) its breaker message's due time is that
#: message (a delayed message never comes back before its time), not a repeat.
BREAKER_NOTE_SLACK_S = 0.05
#: Notes kept before stale ones are dropped.
BREAKER_NOTES_MAX = 100_000


def _route(value: Any) -> Route | None:
    """A message's `route` kwarg (a JSON list), if it is one."""
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, str) for v in value)
    ):
        return (value[0], value[1])
    return None


class Dispatch(Protocol):
    """Sends later attempts of a delivery (broker.DeliveryQueues)."""

    def enqueue(
        self,
        delivery_ids: list[str],
        routes: Mapping[str, tuple[str, str]] | None = None,
    ) -> None: ...

    def schedule(
        self,
        delivery_id: str,
        delay_s: float,
        *,
        bounces: int = 0,
        route: tuple[str, str] | None = None,
    ) -> None: ...


class HttpSender(Protocol):
    """Posts one attempt (sender.Sender)."""

    @property
    def deadline_s(self) -> float: ...

    def send(self, url: str, body: bytes, headers: Any) -> SendResult: ...


def _log_attempt(claim: Claim, result: SendResult, outcome: str, delay: float | None) -> None:
    """One line per attempt: the endpoint, what it answered, how fast, what happens next."""
    answer = result.status if result.status is not None else result.error
    retry = f"; next try in {delay:.0f} s" if delay is not None and not result.ok else ""
    log.info(
        "delivery %s of %s to %s: attempt %d -> %s (%s) in %.0f ms%s",
        claim.delivery_id,
        claim.event_id,
        claim.url,
        claim.attempt_number,
        answer,
        outcome,
        result.latency_ms,
        retry,
    )


class Deliverer:
    """One attempt of one delivery, from claim to the next schedule.

    Holds one pooled connection per attempt (`DeliveryStore.connection`): two round
    trips, the claim before the HTTP request and the record after it.
    """

    def __init__(
        self,
        config: NotifierConfig,
        store: DeliveryStore,
        sender: HttpSender,
        secrets: SecretCache,
        dispatch: Dispatch,
        metrics: NotifierMetrics,
        *,
        limiter: EndpointLimiter,
        breakers: CircuitBreakers,
        tuning: DeliveryTuning,
        identity: Database,
    ) -> None:
        self.config = config
        self.store = store
        #: Where the tenants' sandbox flags are read, for the operational events' livemode
        #: (the store's database itself when identity lives there).
        self.identity = identity
        self.sender = sender
        self.secrets = secrets
        self.dispatch = dispatch
        self.metrics = metrics
        self.limiter = limiter
        self.rates = EndpointRates()
        self.waiting = WaitingRoom(max_wait_s=tuning.saturated_max_s)
        #: Deliveries sent on later because their endpoint's breaker was open here, and
        #: when that message is due back (see `_breaker_repeat`).
        self._breaker_waits: dict[str, float] = {}
        self._breaker_waits_lock = threading.Lock()
        #: Per thread: the waiting delivery this thread runs next (see deliver).
        self._hand = threading.local()
        self.breakers = breakers
        self.tuning = tuning
        # The lease outlasts the attempt's deadline (DeliveryTuning checks the margin).
        self._lease_s = sender.deadline_s + tuning.lease_margin_s
        # Label children looked up once (prometheus_client takes a lock per labels()).
        self._attempts_ok = metrics.attempts.labels("success")
        self._succeeded = metrics.deliveries.labels(SUCCEEDED)

    def deliver(self, delivery_id: str, bounces: int = 0, route: Route | None = None) -> str:
        """Run one attempt if this call wins the delivery; returns what happened (for tests).

        `route` (endpoint id, tenant id), which a put-back message carries: when that
        endpoint or tenant is still busy here, or its breaker still open, the message is
        sent on later again without touching the database (the claim is what costs).

        When the attempt frees a slot that a delivery waiting here wants, this thread
        runs that delivery next, and so on, bounded (INLINE_AT_MOST, one attempt
        deadline): sending it through the broker would cost a publish, a consume and
        an ack, and it would only come back to this process's free slot.
        """
        hand = self._hand
        hand.open = True
        try:
            outcome = self._deliver_once(delivery_id, bounces, route)
            started = time.monotonic()
            for _ in range(INLINE_AT_MOST):
                entry: Waiting | None = getattr(hand, "next", None)
                if entry is None or time.monotonic() - started > self.sender.deadline_s:
                    break
                hand.next = None
                try:
                    self._deliver_once(
                        entry.delivery_id, entry.bounces, (entry.endpoint_id, entry.tenant_id)
                    )
                except Exception:
                    # Its own failure (logged, the row says when it is due again), not
                    # this job's: the job's attempt is recorded already.
                    log.exception("delivery %s failed to run", entry.delivery_id)
        finally:
            hand.open = False
            left: Waiting | None = getattr(hand, "next", None)
            hand.next = None
            if left is not None:
                self._send_on([left])
        return outcome

    def keep_waiting(self, stale_s: float = 0.0) -> int:
        """Keep the rows of the deliveries waiting here for a slot due now (those not kept
        within the last `stale_s`: each row is rewritten about once per two rounds, not
        every round); returns how many rows were kept.

        A waiting delivery is due with no lease in the database (so that losing this
        process loses nothing), and the sweeper re-sends deliveries overdue by more than
        its grace: without this, every delivery of a tenant held full by hanging
        endpoints came back from the sweeper once per grace, 500 jobs at a time, ahead
        of everyone's first attempts. Kept fresh more often than the grace, they are
        left to this process; once it dies, the sweeper finds them a grace later.
        Also sends on those that have waited `max_wait_s` and can start here now (when
        no job comes to do it).
        """
        self._send_on_overdue()
        ids = self.waiting.ids()
        if not ids:
            return 0
        now = utcnow()
        return self.store.keep_due(ids, now, stale_before=now - timedelta(seconds=stale_s))

    def run_keeper(self, stop: threading.Event, interval_s: float) -> None:
        """`keep_waiting` every `interval_s` until `stop`; errors are logged, never fatal."""
        while not stop.wait(interval_s):
            try:
                # Rows kept last round are left: each is kept every other round (at most
                # two intervals, two thirds of the grace, old).
                self.keep_waiting(stale_s=1.5 * interval_s)
            except Exception:
                log.exception("could not keep the waiting deliveries; the sweeper may re-send")

    def _send_on_overdue(self) -> None:
        """Send on the waiting deliveries that have waited `max_wait_s` and can start here."""
        if len(self.waiting):
            self._send_on(self.waiting.overdue(lambda e, t: not self.limiter.is_full(e, t)))

    def _deliver_once(self, delivery_id: str, bounces: int, route: Route | None) -> str:
        self._send_on_overdue()
        if route is not None and self._still_waiting(delivery_id, bounces, route):
            return "saturated"
        with self.store.connection() as conn:
            now = utcnow()
            claim = self.store.claim(
                conn,
                delivery_id,
                now=now,
                lease=now + timedelta(seconds=self._lease_s),
                due_by=now + timedelta(seconds=self.tuning.due_slack_s),
                gap_cutoff=now - timedelta(seconds=self.tuning.order_gap_wait_s),
            )
            if claim is None:
                return "not_claimed"
            # Every line of the attempt carries the id of the request that caused the event.
            with logs.request_scope(claim.request_id):
                outcome = self._claimed(conn, claim, bounces)
                if outcome in _FINISHED:
                    self._send_on_next(conn, claim)
                return outcome

    def _send_on_next(self, conn: Connection, claim: Claim) -> None:
        """An ordered delivery finished: the next of its endpoint and account, which its
        claim held back (ordering.py), is sent on now (the row is due: if this message is
        lost, the sweeper sends it)."""
        try:
            following = self.store.next_in_line(conn, claim)
            if following is not None:
                delivery_id, endpoint_id, tenant_id = following
                self.dispatch.schedule(delivery_id, 0.0, route=(endpoint_id, tenant_id))
        except Exception:
            log.exception(
                "could not send on the delivery after %s; the sweeper will", claim.delivery_id
            )

    def deliver_group(self, tenant_id: str, items: list[tuple[str, str]]) -> int:
        """A fan-out of one tenant sent as one job ((delivery id, endpoint id) pairs; see
        broker.DeliveryQueues.enqueue): returns how many waiting deliveries of the tenant
        (these or older ones) it started here or sent on.

        Each waits in this process for a slot of its tenant (or, behind an open breaker,
        is sent on later), all without a claim; then as many as the tenant may start
        here now are taken: the others are sent on as jobs of their own (one publish),
        the first runs on this thread. The rest go as slots free, as any waiting one.
        """
        for delivery_id, endpoint_id in items:
            route = (endpoint_id, tenant_id)
            if self._breaker_holds(delivery_id, 0, route):
                continue
            if not self._park(delivery_id, endpoint_id, tenant_id, 0, wake=False):
                self._saturated(delivery_id, 0, route)  # the room is full
        taken = self._startable(tenant_id, self.limiter.room(tenant_id))
        if not taken:
            return 0
        first, rest = taken[0], taken[1:]
        try:
            if rest:
                self.dispatch.enqueue(
                    [entry.delivery_id for entry in rest],
                    {entry.delivery_id: (entry.endpoint_id, tenant_id) for entry in rest},
                )
        except Exception:
            log.exception("could not send on %d deliveries; the sweeper will", len(rest))
        self.deliver(first.delivery_id, first.bounces, (first.endpoint_id, tenant_id))
        return len(taken)

    def _still_waiting(self, delivery_id: str, bounces: int, route: Route) -> bool:
        """Is the delivery's endpoint or tenant still busy here (or its breaker open)? Then
        it waits, or is sent on later, without a claim."""
        endpoint_id, tenant_id = route
        if self._breaker_holds(delivery_id, bounces, route):
            return True
        if not self.limiter.is_full(endpoint_id, tenant_id):
            return False
        if not self._park(delivery_id, endpoint_id, tenant_id, bounces):
            self._saturated(delivery_id, bounces, route)
        return True

    def _breaker_holds(self, delivery_id: str, bounces: int, route: Route) -> bool:
        """The endpoint's breaker is open here: the delivery is sent on for when it may
        probe (once: a repeat is dropped, see `_breaker_repeat`)."""
        wait_s = self.breakers.wait_s(route[0], peek=True)
        if wait_s <= 0:
            return False
        delay = wait_s * random.uniform(1.0, 1.2)
        if not self._breaker_repeat(delivery_id, delay):
            self._send_later(delivery_id, delay, bounces, route)
        return True

    def _saturated(self, delivery_id: str, bounces: int, route: Route) -> None:
        """No room to wait here: sent on after a growing delay."""
        self._send_later(delivery_id, saturated_delay(bounces, self.tuning), bounces, route)

    def _send_later(self, delivery_id: str, delay: float, bounces: int, route: Route) -> None:
        self.metrics.saturated.inc()
        self.dispatch.schedule(
            delivery_id, delay, bounces=min(bounces + 1, MAX_BOUNCES), route=route
        )

    def _breaker_repeat(self, delivery_id: str, delay: float) -> bool:
        """True when a message for this delivery is already on its way back (sent on
        because of the open breaker, due back later): this job is a repeat, e.g. the
        sweeper's (the row is due, with no lease), and is dropped. Otherwise notes the
        message about to go, due back in `delay`. A note past its message's due time
        counts for nothing: a lost message never holds the delivery up."""
        now = time.monotonic()
        with self._breaker_waits_lock:
            due = self._breaker_waits.get(delivery_id)
            if due is not None and now < due - BREAKER_NOTE_SLACK_S:
                return True
            if len(self._breaker_waits) >= BREAKER_NOTES_MAX:
                self._breaker_waits = {d: t for d, t in self._breaker_waits.items() if t > now}
            self._breaker_waits[delivery_id] = now + delay
            return False

    def _claimed(self, conn: Connection, claim: Claim, bounces: int) -> str:
        """The delivery is this worker's: attempt it, or hold, put back or stop it."""
        if claim.deleted_at is not None or claim.endpoint_status != ENABLED:
            self._stop(conn, claim)
            return "stopped"
        wait_s = self.breakers.wait_s(claim.endpoint_id, peek=True)
        if wait_s > 0:
            self._hold(conn, claim, wait_s)
            return "held"
        if not self.limiter.try_acquire(claim.endpoint_id, claim.tenant_id):
            self._put_back(conn, claim, bounces)
            return "saturated"
        try:
            pace_s = self.rates.wait_s(claim.endpoint_id, claim.rate_limit_per_second)
            if pace_s > 0:
                self._pace(conn, claim, pace_s)
                return "paced"
            # Only now, with a slot and the pace allowing it, is a half-open breaker's
            # probe taken (another thread may have taken it since the peek).
            wait_s = self.breakers.wait_s(claim.endpoint_id)
            if wait_s > 0:
                self._hold(conn, claim, wait_s)
                return "held"
            try:
                return self._attempt(conn, claim)
            finally:
                # The attempt recorded its outcome, or failed before it could: either
                # way the probe (if this was it) is over.
                self.breakers.release_probe(claim.endpoint_id)
        finally:
            self.limiter.release(claim.endpoint_id, claim.tenant_id)
            self._wake(claim.tenant_id)

    def _park(
        self, delivery_id: str, endpoint_id: str, tenant_id: str, bounces: int, *, wake: bool = True
    ) -> bool:
        """Wait in this process for a slot of the tenant (see limiter.WaitingRoom)."""
        if not self.waiting.park(tenant_id, endpoint_id, delivery_id, bounces):
            return False
        self.metrics.saturated.inc()
        # A slot may have freed between the check and the park: look once more.
        if wake and not self.limiter.is_full(endpoint_id, tenant_id):
            self._wake(tenant_id)
        return True

    def _wake(self, tenant_id: str) -> None:
        """A slot of the tenant is free: the next delivery waiting for one runs on this
        thread once its job is done (see deliver); outside a job, through the broker."""
        taken = self._startable(tenant_id, 1)
        hand = self._hand
        if taken and getattr(hand, "open", False) and getattr(hand, "next", None) is None:
            hand.next = taken[0]
            return
        self._send_on(taken)

    def _startable(self, tenant_id: str, most: int) -> list[Waiting]:
        """Up to `most` waiting deliveries of the tenant that could start here now, no
        endpoint given more than its free slots (taken out of the waiting room)."""
        picked: dict[str, int] = {}

        def can_go(endpoint_id: str) -> bool:
            n = picked.get(endpoint_id, 0)
            if n >= self.limiter.endpoint_room(endpoint_id) or not self.limiter.room(tenant_id):
                return False
            picked[endpoint_id] = n + 1
            return True

        return self.waiting.take(tenant_id, can_go, most)

    def _send_on(self, entries: list[Waiting]) -> None:
        for entry in entries:
            try:
                self.dispatch.schedule(
                    entry.delivery_id,
                    0.0,
                    bounces=entry.bounces,
                    route=(entry.endpoint_id, entry.tenant_id),
                )
            except Exception:
                log.exception("could not send on %s; the sweeper will", entry.delivery_id)

    def _put_back(self, conn: Connection, claim: Claim, bounces: int) -> None:
        """The endpoint or its tenant has every slot busy here: let go, wait for a slot.

        The row is kept truthful (lease released). The job waits in this process's
        waiting room, sent on as soon as a slot of the tenant frees up (the row is due
        now: if this process dies, the sweeper sends it); when the room is full, it
        comes back after a growing delay instead (the row due then).
        """
        bounces = min(bounces + 1, MAX_BOUNCES)
        route = (claim.endpoint_id, claim.tenant_id)
        if len(self.waiting) < self.waiting.max_waiting:
            self.store.put_back(conn, claim, utcnow())
            if self._park(claim.delivery_id, claim.endpoint_id, claim.tenant_id, bounces):
                return
            delay = saturated_delay(bounces, self.tuning)  # the room filled up meanwhile
            self.dispatch.schedule(claim.delivery_id, delay, bounces=bounces, route=route)
            return
        delay = saturated_delay(bounces, self.tuning)
        self.store.put_back(conn, claim, utcnow() + timedelta(seconds=delay))
        self.metrics.saturated.inc()
        self.dispatch.schedule(claim.delivery_id, delay, bounces=bounces, route=route)

    def _hold(self, conn: Connection, claim: Claim, wait_s: float) -> None:
        """The endpoint's breaker is open: no attempt; due again when it may probe."""
        delay = wait_s * random.uniform(1.0, 1.2)
        self.store.put_back(conn, claim, utcnow() + timedelta(seconds=delay))
        self.metrics.held.inc()
        self.dispatch.schedule(claim.delivery_id, delay, route=(claim.endpoint_id, claim.tenant_id))

    def _pace(self, conn: Connection, claim: Claim, wait_s: float) -> None:
        """The endpoint's own rate limit says not yet: due again when its next turn comes."""
        self.store.put_back(conn, claim, utcnow() + timedelta(seconds=wait_s))
        self.metrics.paced.inc()
        self.dispatch.schedule(claim.delivery_id, wait_s)

    def _stop(self, conn: Connection, claim: Claim) -> None:
        """No attempt: the endpoint was deleted (the delivery fails) or disabled (skipped,
        sent once the endpoint is enabled again)."""
        if claim.deleted_at is not None:
            self.store.stop(conn, claim, ENDPOINT_DELETED, utcnow())
            self.metrics.deliveries.labels(FAILED).inc()
        else:
            self.store.stop(conn, claim, ENDPOINT_DISABLED, utcnow(), status=SKIPPED)
            self.metrics.deliveries.labels(SKIPPED).inc()

    def _attempt(self, conn: Connection, claim: Claim) -> str:
        body = claim.event_body.encode("utf-8")
        try:
            secrets = self.secrets.signing_secrets(claim, utcnow())
        except SecretDecryptError:
            # A configuration fault, not the receiver's: keep the lease so the sweeper
            # retries once the key is fixed (no attempt made: the number goes back),
            # and say so loudly.
            log.error("cannot decrypt the secret of endpoint %s", claim.endpoint_id)
            self.store.give_back(conn, claim)
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
            scheme=claim.signature_scheme,
        )
        result = self.sender.send(claim.url, body, headers)
        if self.breakers.record(claim.endpoint_id, ok=result.ok):
            self.metrics.breaker_opened.inc()
            log.warning(
                "endpoint %s: %d attempts in a row failed; holding its deliveries back",
                claim.endpoint_id,
                self.breakers.threshold,
            )
        self.metrics.attempt_latency.observe(result.latency_ms / 1000.0)
        if result.ok:
            self._attempts_ok.inc()
        else:
            self.metrics.attempts.labels(_outcome_label(result)).inc()
        return self._record(conn, claim, result, attempted_at, headers)

    def _tell(
        self, endpoint_id: str, what: str, build: Callable[[Session, Endpoint], list[str]]
    ) -> None:
        """An operational event about the endpoint to the tenant's other endpoints (rare:
        transitions and deliveries that give up), in a transaction of its own after the
        attempt's record."""
        try:
            with self.store.db.transaction() as session:
                to_send = build(session, session.get_one(Endpoint, endpoint_id))
            for delivery_id in to_send:
                self.dispatch.schedule(delivery_id, 0.0)
        except Exception:
            # What it tells of happened all the same (recorded); only the notice is lost.
            log.exception("could not tell the tenant that endpoint %s %s", endpoint_id, what)

    def _tell_transitions(
        self, claim: Claim, recorded: Recorded, result: SendResult, attempted_at: datetime
    ) -> None:
        """The endpoint's failing, disabled and recovered events this attempt caused."""
        now = utcnow()
        failing = recorded.failing
        if failing is not None:
            seen = operational_events.AttemptSeen(
                claim.delivery_id,
                claim.attempt_number,
                attempted_at,
                result.status,
                (result.error or "error")[:MAX_ERROR_CHARS],
            )
            self._tell(
                claim.endpoint_id,
                "is failing",
                lambda s, e: operational_events.endpoint_failing(
                    s, e, failing, seen, now, identity=self.identity
                ),
            )
        if recorded.disabled:
            self.metrics.endpoints_disabled.labels(DISABLED_FAILING).inc()
            self._tell(
                claim.endpoint_id,
                "was disabled",
                lambda s, e: operational_events.endpoint_disabled(
                    s, e, now, identity=self.identity
                ),
            )
        recovered = recorded.recovered
        if recovered is not None:
            self._tell(
                claim.endpoint_id,
                "recovered",
                lambda s, e: operational_events.endpoint_recovered(
                    s, e, recovered, now, identity=self.identity
                ),
            )

    def _tell_exhausted(self, claim: Claim) -> None:
        """The delivery gave up: the tenant's other endpoints hear of it."""
        now = utcnow()
        self._tell(
            claim.endpoint_id,
            f"gave up delivery {claim.delivery_id}",
            lambda s, _: operational_events.delivery_exhausted(
                s, s.get_one(Delivery, claim.delivery_id), now, identity=self.identity
            ),
        )

    def _record(
        self,
        conn: Connection,
        claim: Claim,
        result: SendResult,
        attempted_at: datetime,
        headers: dict[str, str],
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
            "signature_header": headers[signing.SIGNATURE_HEADER],
            "webhook_signature": headers.get(signing.STANDARD_SIGNATURE_HEADER),
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
        # The endpoint's failure streak: a failure starts it (and disables the endpoint
        # once it is too long), a success ends it. Only touched when there is a change.
        recorded = self.store.record(
            conn,
            values,
            streak=not result.ok or claim.failing_since is not None,
            ok=result.ok,
            endpoint_id=claim.endpoint_id,
            now=now,
            disable_cutoff=now - timedelta(seconds=config.disable_after_s),
            failing_after=config.failing_after_attempts,
        )
        if recorded.disabled:
            log.warning(
                "endpoint %s disabled: every attempt failed for %.0fs",
                claim.endpoint_id,
                config.disable_after_s,
            )
        if recorded.failing or recorded.disabled or recorded.recovered:
            self._tell_transitions(claim, recorded, result, attempted_at)
        _log_attempt(claim, result, values["status"] if recorded.updated else LEASE_LOST, delay)
        if not recorded.updated:
            # Our lease lapsed and another worker took the delivery over: its record
            # wins for the delivery's state. Our attempt row stays, marked: the POST
            # did happen, and the attempt log is what support reads to see that it did.
            lost = f"{LEASE_LOST}: {error}" if error else LEASE_LOST
            self.store.mark_lost(conn, claim, lost[:MAX_ERROR_CHARS])
            self.metrics.lease_lost.inc()
            log.warning(
                "delivery %s: attempt %d lost its lease before it was recorded",
                claim.delivery_id,
                claim.attempt_number,
            )
            return LEASE_LOST
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
            self._tell_exhausted(claim)
            return FAILED
        try:
            self.dispatch.schedule(claim.delivery_id, delay)
        except Exception:
            # The row says when it is due; the sweeper sends it if this message is lost.
            log.exception("could not schedule the retry of %s; the sweeper will", claim.delivery_id)
        return RETRYING


def _outcome_label(result: SendResult) -> str:
    if result.ok:
        return "success"
    error = result.error or "error"
    return error.split(":", 1)[0]


@contextmanager
def _failover_is_no_poison(what: str) -> Iterator[None]:
    """A job cut by a database failover ends quietly instead of raising (which would
    dead-letter it as poison): its delivery's row is the truth, and the sweeper sends
    it again once due (the claim or the record did not commit, or its lease lapses)."""
    try:
        yield
    except Exception as err:
        if not failover.is_failover(err):
            raise
        log.warning("job for %s cut by a database failover (%s); the sweeper sends it", what, err)


class DeliveryActors:
    """The two Dramatiq actors on the queues of `queues`, running `deliverer` (no globals)."""

    def __init__(self, queues: DeliveryQueues, deliverer: Deliverer) -> None:
        def deliver(delivery_id: str, bounces: int = 0, route: list[str] | None = None) -> None:
            with _failover_is_no_poison(delivery_id):
                deliverer.deliver(delivery_id, bounces, _route(route))

        def deliver_retry(
            delivery_id: str, bounces: int = 0, route: list[str] | None = None
        ) -> None:
            with _failover_is_no_poison(delivery_id):
                deliverer.deliver(delivery_id, bounces, _route(route))

        def deliver_group(tenant_id: str, items: list[list[str]]) -> None:
            with _failover_is_no_poison(f"{len(items)} deliveries of {tenant_id}"):
                deliverer.deliver_group(tenant_id, [(d, e) for d, e in items])

        def actor(fn: Any, name: str, queue: str, priority: int) -> dramatiq.Actor:
            return dramatiq.Actor(
                fn,
                broker=queues.broker,
                actor_name=name,
                queue_name=queue,
                priority=priority,
                options={"max_retries": 0},
            )

        self.deliver = actor(deliver, queues.actor_name, queues.queue, 0)
        self.deliver_group = actor(deliver_group, queues.group_actor_name, queues.queue, 0)
        # Lower runs first: a worker takes first attempts before retries it fetched.
        self.deliver_retry = actor(
            deliver_retry, queues.retry_actor_name, queues.retry_queue, RETRY_PRIORITY
        )
