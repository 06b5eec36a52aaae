"""`settle reconcile`: did every event core emitted reach the notifier, once, intact?
And did the hot wallet pay only what Settle recorded?

DESIGN.md promises that no event is lost. This module checks it after the fact for a
time window: core's outbox against the notifier's stored events, endpoints and
deliveries, and each deposit's status against the lifecycle events it emitted. Given
each chain's node (`payouts`), it also lists the hot wallet's payouts mined in the
window that Settle has no record of (after a database restore: docs/RECONCILE.md).
It reads both services' tables (each from its own database), so it lives above both.

Every check is set-based: rows are streamed in chunks and each chunk is matched with
one query per table on the other side, so a window of 100k events costs a few hundred
queries, not one per event. Both sides are read from a snapshot (REPEATABLE READ on
PostgreSQL, core first), so a change committed while the reconcile runs cannot show
up on one side only. docs/RECONCILE.md explains every kind of discrepancy.

The rules it checks against live beside the code they describe, and are called from
here: which endpoints must have a delivery (services/notifier/fanout.py), what a pair's
deliveries say (duplicates, undelivered: services/notifier/deliveries.py), a deposit's
lifecycle (services/core/deposits/states.py). This module only reads and compares.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from services.commands import add_reconcile
from services.core.config import CoreConfig
from services.core.deposits import states
from services.core.deposits.models import Deposit
from services.core.deposits.payout_audit import ChainUnreadable, PayoutScanner, unrecorded
from services.core.models import OutboxEvent
from services.core.sweeps import audit as sweep_audit
from services.core.sweeps.audit import ChainBalances
from services.notifier import deliveries as notifier_deliveries
from services.notifier import fanout
from services.notifier.config import NotifierConfig
from services.notifier.models import (
    DELIVERY_STATUSES,
    Delivery,
    Endpoint,
    StoredEvent,
)
from shared import events
from shared.db import Database, normalize_url
from shared.settings import SettingsError
from shared.timefmt import iso_ms, utcnow

# -- kinds of discrepancy (docs/RECONCILE.md) ------------------------------------------

#: An outbox row still unpublished `settle_s` after it was written: the relay is stuck.
NOT_PUBLISHED = "not_published"
#: Published `settle_s` ago but absent from `notifier_events`: lost on the way.
NOT_STORED = "not_stored"
#: The stored body is not byte for byte the outbox body.
BODY_MISMATCH = "body_mismatch"
#: A stored event (not `webhook.test`) that core's outbox does not hold.
UNKNOWN_STORED = "unknown_stored"
#: An endpoint subscribed before the event (and unchanged since) got no delivery.
MISSING_DELIVERY = "missing_delivery"
#: Two deliveries of one event to one endpoint that are not replays.
DUPLICATE_DELIVERY = "duplicate_delivery"
#: A durable deposit event type written under an id that is not its durable id.
DUPLICATE_DURABLE = "duplicate_durable"
#: A deposit whose status disagrees with its lifecycle events.
STATUS_MISMATCH = "status_mismatch"
#: No success yet for an (event, endpoint) pair to a live endpoint (only when required).
UNDELIVERED = "undelivered"
#: A hot-wallet payout on chain that Settle has no record of.
UNRECORDED_PAYMENT = "unrecorded_payment"

#: A sweep signed or sent and not final `settle_s` after it last changed.
SWEEP_UNCONFIRMED = "sweep_unconfirmed"
#: A sweep confirmed in the window whose block is no longer canonical (read on the chain).
SWEEP_REORGED = "sweep_reorged"
#: A deposit address's balance on the chain that its deposits less its sweeps do not explain.
UNEXPLAINED_BALANCE = "unexplained_balance"

#: The "tenant" of what belongs to no tenant (sweeps, deposit addresses' balances).
PLATFORM = "-"

#: Every kind, in the order the report lists them.
KINDS: tuple[str, ...] = (
    NOT_PUBLISHED,
    NOT_STORED,
    BODY_MISMATCH,
    UNKNOWN_STORED,
    MISSING_DELIVERY,
    DUPLICATE_DELIVERY,
    DUPLICATE_DURABLE,
    STATUS_MISMATCH,
    UNDELIVERED,
    SWEEP_UNCONFIRMED,
    SWEEP_REORGED,
    UNEXPLAINED_BALANCE,
    UNRECORDED_PAYMENT,
)

#: Rows fetched per round trip, and the longest IN list sent.
CHUNK = 1000
#: Discrepancies printed per kind by the text report (JSON has them all).
PRINT_LIMIT = 20
#: CLI defaults: the last day; events younger than a minute are in flight, not lost.
DEFAULT_WINDOW = timedelta(hours=24)

#: Durable deposit event types -> their status (ids `evt_dep_<depositId>_<status>`).
_DURABLE_TYPES: dict[str, str] = {states.EVENT_TYPES[s]: s for s in events.DURABLE_DEPOSIT_STATUSES}
#: Deposit event types whose ids are fresh (the deposit is named only in the body).
_BEST_EFFORT_TYPES: tuple[str, ...] = tuple(
    t for t in states.STATUS_OF_EVENT_TYPE if t not in _DURABLE_TYPES
)


@dataclass(frozen=True)
class Discrepancy:
    kind: str
    #: What it is about: an event id, a deposit id, or `<event id> -> <endpoint id>`.
    subject: str
    tenant_id: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "subject": self.subject,
            "tenantId": self.tenant_id,
            "detail": self.detail,
        }


@dataclass
class Counts:
    """What was looked at, for the printout (none of these is a discrepancy by itself)."""

    #: Outbox rows created in the window.
    events: int = 0
    published: int = 0
    #: Outbox events of the window found in `notifier_events`.
    stored: int = 0
    #: Younger than `settle_s` and not yet through (unpublished or not yet stored).
    lagging: int = 0
    #: Stored events of the window checked against the outbox.
    stored_checked: int = 0
    #: Deliveries of the window's events, by status (replays included).
    deliveries: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DELIVERY_STATUSES, 0))
    #: Enabled, live endpoints of the tenants that had events in the window.
    endpoints_checked: int = 0
    #: (event, endpoint) pairs that must have a delivery.
    pairs_checked: int = 0
    #: Pairs not checked: the endpoint changed after the event, its state then is unknown.
    pairs_unverifiable: int = 0
    #: Pairs to live endpoints with no success `settle_s` after their latest delivery,
    #: by that delivery's status.
    undelivered: dict[str, int] = field(default_factory=dict)
    deposits_checked: int = 0
    #: (address, token) balances read on chains and compared (docs/RECONCILE.md, "Sweeps").
    balances_checked: int = 0
    #: Chains whose hot-wallet payouts were read, and the payouts found in the window.
    chains_checked: int = 0
    payouts_checked: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "published": self.published,
            "stored": self.stored,
            "lagging": self.lagging,
            "storedChecked": self.stored_checked,
            "deliveries": dict(self.deliveries),
            "endpointsChecked": self.endpoints_checked,
            "pairsChecked": self.pairs_checked,
            "pairsUnverifiable": self.pairs_unverifiable,
            "undelivered": dict(self.undelivered),
            "depositsChecked": self.deposits_checked,
            "balancesChecked": self.balances_checked,
            "chainsChecked": self.chains_checked,
            "payoutsChecked": self.payouts_checked,
        }


@dataclass
class Report:
    since: datetime
    until: datetime
    settle_s: float
    require_delivered: bool
    tenant_ids: tuple[str, ...] | None
    #: The reconcile's "now": ages (settle_s) are measured from it.
    checked_at: datetime
    counts: Counts = field(default_factory=Counts)
    elapsed_s: float = 0.0
    not_published: list[Discrepancy] = field(default_factory=list)
    not_stored: list[Discrepancy] = field(default_factory=list)
    body_mismatch: list[Discrepancy] = field(default_factory=list)
    unknown_stored: list[Discrepancy] = field(default_factory=list)
    missing_delivery: list[Discrepancy] = field(default_factory=list)
    duplicate_delivery: list[Discrepancy] = field(default_factory=list)
    duplicate_durable: list[Discrepancy] = field(default_factory=list)
    status_mismatch: list[Discrepancy] = field(default_factory=list)
    undelivered: list[Discrepancy] = field(default_factory=list)
    sweep_unconfirmed: list[Discrepancy] = field(default_factory=list)
    sweep_reorged: list[Discrepancy] = field(default_factory=list)
    unexplained_balance: list[Discrepancy] = field(default_factory=list)
    #: Deposits whose tokens are still at their address (not a discrepancy: they wait
    #: for the next sweep).
    unswept: list[sweep_audit.Unswept] = field(default_factory=list)
    unrecorded_payment: list[Discrepancy] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[Discrepancy]:
        found: list[Discrepancy] = getattr(self, kind)
        return found

    def add(self, kind: str, subject: str, tenant_id: str, detail: str) -> None:
        self.of_kind(kind).append(Discrepancy(kind, subject, tenant_id, detail))

    def discrepancies(self) -> list[Discrepancy]:
        """Every discrepancy, kind by kind in KINDS order."""
        return [d for kind in KINDS for d in self.of_kind(kind)]

    @property
    def clean(self) -> bool:
        return not self.discrepancies()

    def to_dict(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "since": iso_ms(self.since),
            "until": iso_ms(self.until),
            "settleSeconds": self.settle_s,
            "requireDelivered": self.require_delivered,
            "tenantIds": list(self.tenant_ids) if self.tenant_ids is not None else None,
            "checkedAt": iso_ms(self.checked_at),
            "elapsedMs": round(self.elapsed_s * 1000, 1),
            "counts": self.counts.to_dict(),
            "discrepancies": {k: [d.to_dict() for d in self.of_kind(k)] for k in KINDS},
            "unswept": [u.to_dict() for u in self.unswept],
        }

    def _unswept_summary(self) -> str:
        """`<n> on chain <id> (<base units> <asset>), ...`."""
        totals: dict[tuple[int, str], list[int]] = {}
        for u in self.unswept:
            total = totals.setdefault((u.chain_id, u.asset), [0, 0])
            total[0] += 1
            total[1] += u.amount_raw
        return ", ".join(
            f"{n} on chain {chain_id} ({raw} {asset} base units)"
            for (chain_id, asset), (n, raw) in sorted(totals.items())
        )

    def render(self) -> str:
        """The report for a person: figures, then each discrepancy (PRINT_LIMIT per kind)."""
        c = self.counts
        tenants = ", ".join(self.tenant_ids) if self.tenant_ids is not None else "all"
        lines = [
            f"Reconcile {iso_ms(self.since)} .. {iso_ms(self.until)}"
            f" (settle {self.settle_s:g} s, tenants: {tenants})",
            f"  events in window (outbox): {c.events}   published: {c.published}"
            f"   stored: {c.stored}   in flight: {c.lagging}",
            f"  stored events checked against the outbox: {c.stored_checked}",
            "  deliveries: " + ", ".join(f"{s} {n}" for s, n in c.deliveries.items()),
            f"  endpoints checked: {c.endpoints_checked}   (event, endpoint) pairs checked:"
            f" {c.pairs_checked}   unverifiable: {c.pairs_unverifiable}",
            "  not delivered after settle: "
            + (", ".join(f"{s} {n}" for s, n in sorted(c.undelivered.items())) or "none"),
            f"  deposits checked: {c.deposits_checked}",
            f"  deposit address balances checked on chain: {c.balances_checked}",
            "  deposits not yet swept: " + (self._unswept_summary() or "none"),
            f"  hot-wallet payouts checked: {c.payouts_checked} on {c.chains_checked} chain(s)",
            f"  took {self.elapsed_s:.2f} s",
        ]
        found = self.discrepancies()
        if not found:
            lines.append("OK: no discrepancy")
            return "\n".join(lines)
        lines.append(f"DISCREPANCIES: {len(found)}")
        for kind in KINDS:
            items = self.of_kind(kind)
            if not items:
                continue
            lines.append(f"  {kind} ({len(items)})")
            for d in items[:PRINT_LIMIT]:
                lines.append(f"    {d.subject} [tenant {d.tenant_id}]: {d.detail}")
            if len(items) > PRINT_LIMIT:
                lines.append(f"    ... and {len(items) - PRINT_LIMIT} more (--json lists all)")
        return "\n".join(lines)


def reconcile(
    core_db: Database,
    notifier_db: Database,
    since: datetime,
    until: datetime,
    *,
    settle_s: float = 0,
    require_delivered: bool = False,
    tenant_ids: Iterable[str] | None = None,
    now: datetime | None = None,
    chains: Mapping[int, ChainBalances] | None = None,
    payouts: Sequence[PayoutScanner] = (),
) -> Report:
    """Compare core's outbox and deposits with the notifier for events created in [since, until).

    `settle_s`: how long an event or delivery may be in flight before its absence is a
    discrepancy. `require_delivered`: a live endpoint's delivery that has not succeeded
    `settle_s` after it was made is a discrepancy too (otherwise only counted).
    `tenant_ids`: only these tenants' rows. `chains`: the nodes to read sweeps' blocks
    and deposit addresses' balances on (none: those checks are skipped; never with
    `tenant_ids`, an address's balance is not one tenant's). `payouts`: each chain's
    hot-wallet payouts, read from its node; those mined in the window that Settle has no
    record of are discrepancies (ChainUnreadable when a node cannot answer). Raises
    ValueError for an
    empty window.
    """
    if since >= until:
        raise ValueError("since must be earlier than until")
    if settle_s < 0:
        raise ValueError("settle_s must not be negative")
    started = time.monotonic()
    tenants = tuple(sorted(set(tenant_ids))) if tenant_ids is not None else None
    report = Report(
        since=since,
        until=until,
        settle_s=settle_s,
        require_delivered=require_delivered,
        tenant_ids=tenants,
        checked_at=now or utcnow(),
    )
    with _snapshots(core_db, notifier_db) as (core, notifier, taken_at):
        run = _Run(core, notifier, report, taken_at)
        run.check_outbox()
        run.check_stored()
        run.check_odd_durable()
        run.check_deposits()
        _check_sweeps(run, chains or {})
    # After the snapshot, on a fresh read: the chain first, then Settle's records.
    for scanner in payouts:
        with core_db.reader() as core_now:
            run.check_payouts(scanner, core_now)
    for kind in KINDS:
        report.of_kind(kind).sort(key=lambda d: (d.tenant_id, d.subject))
    report.elapsed_s = time.monotonic() - started
    return report


# -- reading both sides ----------------------------------------------------------------


@contextmanager
def _snapshots(
    core_db: Database, notifier_db: Database
) -> Iterator[tuple[sa.Connection, sa.Connection, datetime]]:
    """Core's snapshot, then the notifier's; one connection when both are one database.

    Also yields a time before core's snapshot: an event the notifier received before
    it was committed in core before the snapshot, so core's snapshot must hold it.
    """
    taken_at = utcnow()
    with core_db.reader() as core:
        core_conn = _pin_snapshot(core)
        if notifier_db.url == core_db.url:
            yield core_conn, core_conn, taken_at
        else:
            with notifier_db.reader() as notifier:
                yield core_conn, _pin_snapshot(notifier), taken_at


def _pin_snapshot(session: Session) -> sa.Connection:
    """The session's connection, in a transaction whose snapshot is taken now."""
    conn = session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    # PostgreSQL takes the snapshot at the first statement, not at BEGIN.
    conn.execute(sa.text("SELECT 1"))
    return conn


def _stream(conn: sa.Connection, query: sa.Select[Any]) -> Iterator[Sequence[sa.Row[Any]]]:
    """The query's rows in chunks of CHUNK, from a server-side cursor where there is one."""
    yield from conn.execute(query.execution_options(yield_per=CHUNK)).partitions()


def _one_of(column: Any, values: Sequence[str]) -> Any:
    """`column IN values` as `= ANY(array)`: one parameter, not thousands."""
    return column == sa.any_(sa.literal(list(values), type_=postgresql.ARRAY(sa.String)))


def _chunks(items: Sequence[str], size: int = CHUNK) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _Run:
    """One reconcile: the two snapshot connections, what was learned so far, the report."""

    def __init__(
        self, core: sa.Connection, notifier: sa.Connection, report: Report, taken_at: datetime
    ) -> None:
        self.core = core
        self.notifier = notifier
        self.report = report
        self.counts = report.counts
        self.taken_at = taken_at
        self.cutoff = report.checked_at - timedelta(seconds=report.settle_s)
        #: Event ids of the window's outbox rows.
        self.outbox_ids: set[str] = set()
        #: Deposit id -> (a durable event of the window that names it, its tenant).
        self.named_deposits: dict[str, tuple[str, str]] = {}
        #: Durable-typed events of the window whose id is not a durable id.
        self.odd_durable: list[tuple[str, str, str]] = []
        #: Tenant -> its endpoints that receive deliveries (loaded once per tenant).
        self.endpoints: dict[str, list[fanout.Receiver]] = {}

    def _tenant_filter(self, column: Any) -> list[Any]:
        tenants = self.report.tenant_ids
        return [] if tenants is None else [column.in_(tenants)]

    # -- outbox -> notifier ----------------------------------------------------------

    def check_outbox(self) -> None:
        query = (
            sa.select(
                OutboxEvent.event_id,
                OutboxEvent.event_type,
                OutboxEvent.tenant_id,
                OutboxEvent.created_at,
                OutboxEvent.published_at,
                sa.func.md5(OutboxEvent.body).label("digest"),
            )
            .where(
                OutboxEvent.created_at >= self.report.since,
                OutboxEvent.created_at < self.report.until,
                *self._tenant_filter(OutboxEvent.tenant_id),
            )
            .order_by(OutboxEvent.created_at, OutboxEvent.id)
        )
        for rows in _stream(self.core, query):
            self._outbox_chunk(rows)

    def _outbox_chunk(self, rows: Sequence[sa.Row[Any]]) -> None:
        stored = self._stored_digests([r.event_id for r in rows])
        present = []
        for row in rows:
            self.counts.events += 1
            self.outbox_ids.add(row.event_id)
            self._note_durable(row)
            in_flight = False
            if row.published_at is None:
                if row.created_at < self.cutoff:
                    self.report.add(
                        NOT_PUBLISHED,
                        row.event_id,
                        row.tenant_id,
                        f"{row.event_type} written {iso_ms(row.created_at)}, still unpublished",
                    )
                else:
                    in_flight = True
            else:
                self.counts.published += 1
            digest = stored.get(row.event_id)
            if digest is None:
                if row.published_at is not None:
                    if row.published_at < self.cutoff:
                        self.report.add(
                            NOT_STORED,
                            row.event_id,
                            row.tenant_id,
                            f"{row.event_type} published {iso_ms(row.published_at)},"
                            " not in notifier_events",
                        )
                    else:
                        in_flight = True
                self.counts.lagging += int(in_flight)
                continue
            self.counts.stored += 1
            if digest != row.digest:
                self.report.add(
                    BODY_MISMATCH,
                    row.event_id,
                    row.tenant_id,
                    f"stored body (md5 {digest}) differs from the outbox body (md5 {row.digest})",
                )
            present.append(row)
        self._check_deliveries(present)

    def _stored_digests(self, event_ids: Sequence[str]) -> dict[str, str]:
        rows = self.notifier.execute(
            sa.select(StoredEvent.id, sa.func.md5(StoredEvent.body)).where(
                _one_of(StoredEvent.id, event_ids)
            )
        )
        return {event_id: digest for event_id, digest in rows}

    def _note_durable(self, row: sa.Row[Any]) -> None:
        status = _DURABLE_TYPES.get(row.event_type)
        if status is None:
            return
        deposit_id = events.deposit_of_durable_id(row.event_id, status)
        if deposit_id is None:
            self.odd_durable.append((row.event_id, row.event_type, row.tenant_id))
        else:
            self.named_deposits.setdefault(deposit_id, (row.event_id, row.tenant_id))

    # -- fan-out and deliveries --------------------------------------------------------

    def _load_endpoints(self, tenant_ids: set[str]) -> None:
        missing = sorted(tenant_ids - self.endpoints.keys())
        for tenant_id in missing:
            self.endpoints[tenant_id] = []
        for chunk in _chunks(missing):
            rows = self.notifier.execute(fanout.receivers(_one_of(Endpoint.tenant_id, chunk)))
            for row in rows:
                self.counts.endpoints_checked += 1
                self.endpoints[row.tenant_id].append(fanout.receiver(row))

    def _check_deliveries(self, present: Sequence[sa.Row[Any]]) -> None:
        if not present:
            return
        self._load_endpoints({r.tenant_id for r in present})
        pairs: dict[tuple[str, str], list[sa.Row[Any]]] = defaultdict(list)
        rows = self.notifier.execute(
            sa.select(
                Delivery.id,
                Delivery.event_id,
                Delivery.endpoint_id,
                Delivery.status,
                Delivery.replay_of,
                Delivery.created_at,
            ).where(_one_of(Delivery.event_id, [r.event_id for r in present]))
        )
        for delivery in rows:
            self.counts.deliveries[delivery.status] = (
                self.counts.deliveries.get(delivery.status, 0) + 1
            )
            pairs[(delivery.event_id, delivery.endpoint_id)].append(delivery)
        for event in present:
            self._expect_deliveries(event, pairs)
        tenant_of = {r.event_id: r.tenant_id for r in present}
        for (event_id, endpoint_id), deliveries in pairs.items():
            self._check_pair(event_id, endpoint_id, tenant_of[event_id], deliveries)

    def _expect_deliveries(
        self, event: sa.Row[Any], pairs: dict[tuple[str, str], list[sa.Row[Any]]]
    ) -> None:
        """Every endpoint that must have received the event (fanout.must_receive) did."""
        for endpoint in self.endpoints[event.tenant_id]:
            must = fanout.must_receive(endpoint, event.event_type, event.created_at)
            if must is None:
                self.counts.pairs_unverifiable += 1
                continue
            if not must:
                continue
            self.counts.pairs_checked += 1
            if (event.event_id, endpoint.id) not in pairs:
                self.report.add(
                    MISSING_DELIVERY,
                    f"{event.event_id} -> {endpoint.id}",
                    event.tenant_id,
                    f"{event.event_type}: the endpoint was enabled and subscribed"
                    " before the event, and has no delivery of it",
                )

    def _check_pair(
        self, event_id: str, endpoint_id: str, tenant_id: str, deliveries: list[sa.Row[Any]]
    ) -> None:
        subject = f"{event_id} -> {endpoint_id}"
        originals = notifier_deliveries.duplicate_originals(deliveries)
        if originals:
            self.report.add(
                DUPLICATE_DELIVERY,
                subject,
                tenant_id,
                f"{len(originals)} deliveries that are not replays: {', '.join(originals)}",
            )
        live = {e.id for e in self.endpoints.get(tenant_id, ())}
        if endpoint_id not in live:
            return
        latest = notifier_deliveries.undelivered(deliveries, self.cutoff)
        if latest is None:
            return  # succeeded, or still within its settle time
        self.counts.undelivered[latest.status] = self.counts.undelivered.get(latest.status, 0) + 1
        if self.report.require_delivered:
            self.report.add(
                UNDELIVERED,
                subject,
                tenant_id,
                f"no delivery succeeded; latest {latest.id} is {latest.status}"
                f" (made {iso_ms(latest.created_at)})",
            )

    # -- notifier -> outbox ------------------------------------------------------------

    def check_stored(self) -> None:
        """Stored events of the window that core never wrote (the notifier's own types excepted).

        Only events received before core's snapshot count: those were committed in
        core before it, so the snapshot must hold them.
        """
        query = sa.select(StoredEvent.id, StoredEvent.tenant_id, StoredEvent.event_type).where(
            StoredEvent.created_at >= self.report.since,
            StoredEvent.created_at < self.report.until,
            StoredEvent.received_at < self.taken_at,
            StoredEvent.event_type.not_in(events.NOTIFIER_EVENT_TYPES),
            *self._tenant_filter(StoredEvent.tenant_id),
        )
        for rows in _stream(self.notifier, query):
            for row in rows:
                self.counts.stored_checked += 1
                if row.id not in self.outbox_ids:
                    self.report.add(
                        UNKNOWN_STORED,
                        row.id,
                        row.tenant_id,
                        f"{row.event_type} stored by the notifier, absent from core's outbox",
                    )

    # -- deposits ----------------------------------------------------------------------

    def check_odd_durable(self) -> None:
        """A durable deposit event type under a fresh id: a second emission of that status."""
        by_id = {
            event_id: (event_type, tenant) for event_id, event_type, tenant in self.odd_durable
        }
        for chunk in _chunks(sorted(by_id)):
            rows = self.core.execute(
                sa.select(OutboxEvent.event_id, OutboxEvent.body).where(
                    _one_of(OutboxEvent.event_id, chunk)
                )
            )
            bodies = {event_id: body for event_id, body in rows}
            named = {eid: events.deposit_of_body(bodies.get(eid, "")) for eid in chunk}
            durable_ids = {
                eid: events.durable_event_id(dep, _DURABLE_TYPES[by_id[eid][0]])
                for eid, dep in named.items()
                if dep is not None
            }
            existing = set(
                self.core.scalars(
                    sa.select(OutboxEvent.event_id).where(
                        _one_of(OutboxEvent.event_id, list(durable_ids.values()))
                    )
                )
            )
            for event_id in chunk:
                event_type, tenant_id = by_id[event_id]
                deposit_id = named[event_id]
                if deposit_id is None:
                    detail = f"{event_type} with a non-durable id and no data.deposit.id"
                else:
                    durable = durable_ids[event_id]
                    detail = (
                        f"{event_type} of deposit {deposit_id} with a non-durable id; its durable"
                        f" event {durable} {'exists too' if durable in existing else 'is absent'}"
                    )
                self.report.add(DUPLICATE_DURABLE, event_id, tenant_id, detail)

    def check_deposits(self) -> None:
        """Each deposit touched in the window: its events form its path to its status."""
        since, until = self.report.since, self.report.until
        deposits: dict[str, tuple[str, str, datetime]] = {}
        query = sa.select(Deposit.id, Deposit.tenant_id, Deposit.status, Deposit.created_at).where(
            # A status change in the window sets updated_at in it, and updated_at only grows.
            Deposit.updated_at >= since,
            Deposit.created_at < until,
            *self._tenant_filter(Deposit.tenant_id),
        )
        for rows in _stream(self.core, query):
            for row in rows:
                deposits[row.id] = (row.tenant_id, row.status, row.created_at)
        # Durable events of the window name deposits; any not found above are looked up.
        strays = sorted(set(self.named_deposits) - deposits.keys())
        for chunk in _chunks(strays):
            rows = self.core.execute(
                sa.select(Deposit.id, Deposit.tenant_id, Deposit.status, Deposit.created_at).where(
                    _one_of(Deposit.id, chunk)
                )
            )
            for row in rows:
                deposits[row.id] = (row.tenant_id, row.status, row.created_at)
        for deposit_id in strays:
            if deposit_id not in deposits:
                event_id, tenant_id = self.named_deposits[deposit_id]
                self.report.add(
                    STATUS_MISMATCH,
                    deposit_id,
                    tenant_id,
                    f"event {event_id} names a deposit that does not exist",
                )
        if not deposits:
            return
        paths = self._lifecycle_events(deposits)
        for deposit_id, (tenant_id, status, _) in deposits.items():
            self.counts.deposits_checked += 1
            problem = states.path_problem(status, [s for _, s in sorted(paths.get(deposit_id, []))])
            if problem is not None:
                self.report.add(STATUS_MISMATCH, deposit_id, tenant_id, problem)

    # -- the hot wallet's payouts on chain -----------------------------------------------

    def check_payouts(self, scanner: PayoutScanner, core_now: Session) -> None:
        """Payouts of the hot wallet mined in the window that Settle has no record of.

        Settle records a payment before it broadcasts it, so a payout already mined was
        recorded before `core_now` (read after the chain) began: any missing is not in
        flight. Not core's snapshot: a block's timestamp is when its slot began, not when
        it was mined, so a payout recorded after the snapshot may be stamped before the
        window's end.
        """
        first = scanner.first_block_at(self.report.since)
        end = scanner.first_block_at(self.report.until) - 1
        found = scanner.between(first, end)
        self.counts.chains_checked += 1
        self.counts.payouts_checked += len(found)
        tenants = self.report.tenant_ids
        for item in unrecorded(core_now, scanner.wallet, found):
            if tenants is not None and item.tenant_id not in tenants:
                continue
            self.report.add(
                UNRECORDED_PAYMENT,
                item.payout.tx_hash,
                item.tenant_id or "",
                f"chain {scanner.chain_id}: {item.detail}",
            )

    def _lifecycle_events(
        self, deposits: dict[str, tuple[str, str, datetime]]
    ) -> dict[str, list[tuple[int, str]]]:
        """Deposit id -> its lifecycle events as (outbox row id, status), at any time.

        Durable events are found by id. Best-effort ones (`credit_submitted`,
        `manual_review_required`) name the deposit only in their body, so every such
        event since the oldest deposit was made (of the tenants asked for) is parsed.
        Outbox row ids give the order: a deposit's events are written under its row
        lock, one transaction after the other.
        """
        paths: dict[str, list[tuple[int, str]]] = defaultdict(list)
        ids = sorted(deposits)
        per_chunk = CHUNK // len(_DURABLE_TYPES)
        for chunk in _chunks(ids, per_chunk):
            wanted = {
                events.durable_event_id(dep, status): (dep, status)
                for dep in chunk
                for status in _DURABLE_TYPES.values()
            }
            rows = self.core.execute(
                sa.select(OutboxEvent.id, OutboxEvent.event_id).where(
                    _one_of(OutboxEvent.event_id, list(wanted))
                )
            )
            for pk, event_id in rows:
                deposit_id, status = wanted[event_id]
                paths[deposit_id].append((pk, status))
        # Row times are whole milliseconds; a second of slack costs nothing.
        oldest = min(created for _, _, created in deposits.values()) - timedelta(seconds=1)
        query = sa.select(OutboxEvent.id, OutboxEvent.event_type, OutboxEvent.body).where(
            OutboxEvent.event_type.in_(_BEST_EFFORT_TYPES),
            OutboxEvent.created_at >= oldest,
            *self._tenant_filter(OutboxEvent.tenant_id),
        )
        for rows in _stream(self.core, query):
            for pk, event_type, body in rows:
                deposit_id = events.deposit_of_body(body)
                if deposit_id in deposits:
                    paths[deposit_id].append((pk, states.STATUS_OF_EVENT_TYPE[event_type]))
        return paths


# -- command line ----------------------------------------------------------------------


#: Builds (core db, notifier db) for the command; tests may pass their own.
def _check_sweeps(run: _Run, chains: Mapping[int, ChainBalances]) -> None:
    """Deposits not yet swept, sweeps not confirmed, and (on each chain given) sweeps
    reorged and balances nothing explains (services/core/sweeps/audit.py)."""
    report = run.report
    report.unswept = sweep_audit.unswept_deposits(run.core, report.tenant_ids)
    if report.tenant_ids is not None:
        return  # sweeps and balances are the platform's, not one tenant's
    for found in sweep_audit.unconfirmed_sweeps(run.core, run.cutoff):
        report.add(SWEEP_UNCONFIRMED, found.subject, PLATFORM, found.detail)
    for chain_id, chain in sorted(chains.items()):
        for found in sweep_audit.reorged_sweeps(
            run.core, chain_id, chain.io, report.since, report.until
        ):
            report.add(SWEEP_REORGED, found.subject, PLATFORM, found.detail)
        balances, checked = sweep_audit.unexplained_balances(
            run.core, chain_id, chain.tokens, chain.io, all_addresses=chain.all_addresses
        )
        run.counts.balances_checked += checked
        for found in balances:
            report.add(UNEXPLAINED_BALANCE, found.subject, PLATFORM, found.detail)


DatabasesFactory = Callable[[], tuple[Database, Database]]
#: Each chain's hot-wallet payouts, read from its node (none without a node and the key).
ScannersFactory = Callable[[], Sequence[PayoutScanner]]


def _scanners_from_env() -> Sequence[PayoutScanner]:
    from services.core.chains import load_chains
    from services.core.deposits.payout_audit import scanners_from

    config = CoreConfig.from_env()
    return list(
        scanners_from(load_chains(config.chains_file), config.rpc_urls, config.deposits).values()
    )


def _databases_from_env() -> tuple[Database, Database]:
    core_url = CoreConfig.from_env().database_url
    notifier_url = NotifierConfig.from_env().database_url
    core = Database(core_url, pool_size=1)
    if normalize_url(notifier_url) == core.url:
        return core, core
    return core, Database(notifier_url, pool_size=1)


def _chains_from_env(which: str) -> dict[int, ChainBalances]:
    """Each active chain with a node configured, to read for the sweep checks."""
    if which == "none":
        return {}
    from services.core.chains import load_chains
    from services.core.evm import connect
    from services.core.sweeps.chain import SweepChain

    config = CoreConfig.from_env()
    chains = {}
    for chain in load_chains(config.chains_file).active():
        url = config.rpc_urls.get(chain.chain_id)
        if url and chain.assets:
            chains[chain.chain_id] = ChainBalances(
                SweepChain(connect(url, config.deposits.rpc_timeout_s)),
                tuple(a.token_address for a in chain.assets),
                all_addresses=which == "all",
            )
    return chains


def run_command(
    args: argparse.Namespace,
    make_databases: DatabasesFactory,
    make_scanners: ScannersFactory = _scanners_from_env,
) -> int:
    """`settle reconcile`: 0 when clean, 1 on any discrepancy, 2 when it could not check."""
    now = utcnow()
    until = args.until or now
    since = args.since or until - DEFAULT_WINDOW
    if since >= until:
        sys.stderr.write("error: --since must be earlier than --until\n")
        return 2
    try:
        core_db, notifier_db = make_databases()
        scanners = [] if args.no_chain else make_scanners()
    except SettingsError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    try:
        report = reconcile(
            core_db,
            notifier_db,
            since,
            until,
            settle_s=args.settle_seconds,
            require_delivered=args.require_delivered,
            tenant_ids=args.tenant,
            now=now,
            chains=_chains_from_env(args.chain_balances),
            payouts=scanners,
        )
    except SQLAlchemyError as err:
        sys.stderr.write(f"error: could not read the databases: {err.__class__.__name__}: {err}\n")
        return 2
    except ChainUnreadable as err:
        sys.stderr.write(f"error: could not read a chain's hot-wallet payouts: {err}\n")
        return 2
    finally:
        if make_databases is _databases_from_env:  # ours to close
            core_db.dispose()
            notifier_db.dispose()
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict()) + "\n")
    else:
        sys.stdout.write(report.render() + "\n")
    return 0 if report.clean else 1


def command(args: argparse.Namespace) -> int:
    """`settle reconcile` on the databases the environment names."""
    return run_command(args, _databases_from_env)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    make_databases: DatabasesFactory = _databases_from_env,
) -> None:
    """Add `settle reconcile` reading `make_databases()` (tests give their own)."""
    add_reconcile(sub, lambda args: run_command(args, make_databases))
