"""Writing and reading the audit log (`audit_events`, in the identity database).

Both services record here: core in the transaction of the change itself (identity
lives in core's database), the notifier through its identity connection (the log's
only table it writes). A change and its entry commit together whenever they share a
database; when they do not (the notifier's own database, a CLI given another URL),
the entry commits first, just before the change: a crash between the two leaves an
entry for a change that did not happen, never a change without its entry.

Appends to one tenant's chain take turns on a transaction-scoped advisory lock, and
`(tenant_id, sequence)` is unique, so two writers can never both extend the same entry
(the chain cannot fork).
"""

from __future__ import annotations

import getpass
import itertools
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from shared.api import Page, keyset_page
from shared.audit.chain import GENESIS, Break, Head, check_chain, check_recordable, entry_hash
from shared.db import Database, database_of
from shared.identity.models import AuditEvent, Member
from shared.identity.principal import Principal
from shared.ids import new_id
from shared.timefmt import utcnow

#: Who acted: kinds of actor.
API_KEY, MEMBER, PORTAL_LINK, OPS, ANONYMOUS = (
    "api_key",
    "member",
    "portal_link",
    "ops",
    "anonymous",
)
ACTOR_TYPES = (API_KEY, MEMBER, PORTAL_LINK, OPS, ANONYMOUS)


@dataclass(frozen=True)
class Actor:
    """Who made a change: an API key, a member, a portal link's session, or ops (CLI)."""

    type: str
    id: str | None = None
    #: What people read: a member's email (looked up when recorded), ops' user@host.
    name: str | None = None

    @classmethod
    def of(cls, principal: Principal) -> Actor:
        if principal.api_key_id is not None:
            return cls(API_KEY, principal.api_key_id)
        if principal.member_id is not None:
            return cls(MEMBER, principal.member_id)
        return cls(PORTAL_LINK, principal.link_id)

    @classmethod
    def ops(cls, by: str | None = None) -> Actor:
        """Ops at the command line: `by` (default the OS user), named OS user@host."""
        try:
            user = getpass.getuser()
        except (OSError, KeyError):
            user = "unknown"
        host = socket.gethostname() or "unknown"
        return cls(OPS, (by or user)[:200], f"{user}@{host}"[:320])


@dataclass(frozen=True)
class Change:
    """What changed: an action on a target, with the target's state before and after.

    `before` and `after` never hold a secret (only its fingerprint or nothing).
    """

    action: str
    target_type: str
    target_id: str | None
    before: Any = None
    after: Any = None


#: Records a change in the transaction of `session` (a use case calls it with what changed).
Recorder = Callable[[Session, Change], None]


@dataclass(frozen=True)
class Origin:
    """Where the change came from: the client's address and the request's id."""

    ip: str | None = None
    request_id: str | None = None

    @classmethod
    def current(cls) -> Origin:
        """The request being served (in Flask), else the log's request id, if any."""
        from flask import has_request_context, request

        from shared import logs

        if has_request_context():
            return cls(request.remote_addr, logs.request_id())
        return cls(None, logs.request_id())


def _lock_chain(session: Session, tenant_id: str) -> None:
    """Turns for the tenant's chain until the transaction ends."""
    session.execute(
        sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"audit:{tenant_id}"}
    )


def append(
    session: Session,
    tenant_id: str,
    change: Change,
    actor: Actor,
    origin: Origin | None = None,
    *,
    now: datetime | None = None,
) -> AuditEvent:
    """Add an entry at the end of the tenant's chain, in `session`'s transaction."""
    origin = origin or Origin()
    check_recordable(change.before, "before")
    check_recordable(change.after, "after")
    _lock_chain(session, tenant_id)
    head = session.execute(
        sa.select(AuditEvent.sequence, AuditEvent.hash)
        .where(AuditEvent.tenant_id == tenant_id)
        .order_by(AuditEvent.sequence.desc())
        .limit(1)
    ).first()
    sequence, prev_hash = (head[0] + 1, head[1]) if head else (1, GENESIS)
    name = actor.name
    if actor.type == MEMBER and name is None and actor.id is not None:
        name = session.scalar(sa.select(Member.email).where(Member.id == actor.id))
    event = AuditEvent(
        id=new_id("aud"),
        tenant_id=tenant_id,
        sequence=sequence,
        created_at=now or utcnow(),
        action=change.action,
        actor_type=actor.type,
        actor_id=actor.id,
        actor_name=name,
        target_type=change.target_type,
        target_id=change.target_id,
        before=change.before,
        after=change.after,
        ip=(origin.ip or None) and origin.ip[:64],
        request_id=origin.request_id,
        prev_hash=prev_hash,
        hash="",
    )
    event.hash = entry_hash(event)
    session.add(event)
    session.flush()
    return event


def record(
    session: Session,
    tenant_id: str,
    change: Change,
    actor: Actor,
    *,
    origin: Origin | None = None,
    log: Database | None = None,
) -> None:
    """Record `change` with the change's own transaction (`session`) when the log
    lives in its database (`log` None or the same URL); otherwise in a transaction of
    `log`, committed now, before the caller's change commits."""
    origin = origin or Origin.current()
    own = database_of(session)
    if log is None or (own is not None and own.url == log.url):
        append(session, tenant_id, change, actor, origin)
        return
    with log.transaction() as log_session:
        append(log_session, tenant_id, change, actor, origin)


def record_alone(
    log: Database, tenant_id: str, change: Change, actor: Actor, origin: Origin | None = None
) -> None:
    """Record something that changed nothing else (a failed sign-in), in its own transaction."""
    with log.transaction() as session:
        append(session, tenant_id, change, actor, origin or Origin.current())


def record_request(session: Session, change: Change, principal: Principal | None = None) -> None:
    """Record a change made by the request being served, by its caller (`flask.g`), in
    the app's identity database (see `record`)."""
    from shared.identity.auth import current_principal, identity_db

    principal = principal or current_principal()
    record(session, principal.tenant_id, change, Actor.of(principal), log=identity_db())


# -- reading --------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """What `GET /v1/audit-events` narrows by (each optional)."""

    actor_id: str | None = None
    action: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


def list_events(
    session: Session,
    tenant_id: str,
    filters: Filters | None = None,
    *,
    limit: int,
    cursor: str | None = None,
) -> Page[AuditEvent]:
    """The tenant's entries, newest first (by their place in the chain)."""
    filters = filters or Filters()
    query = sa.select(AuditEvent).where(AuditEvent.tenant_id == tenant_id)
    if filters.actor_id is not None:
        query = query.where(AuditEvent.actor_id == filters.actor_id)
    if filters.action is not None:
        if filters.action.endswith(".*"):
            prefix = filters.action[:-1]
            query = query.where(AuditEvent.action.startswith(prefix, autoescape=True))
        else:
            query = query.where(AuditEvent.action == filters.action)
    if filters.created_after is not None:
        query = query.where(AuditEvent.created_at >= filters.created_after)
    if filters.created_before is not None:
        query = query.where(AuditEvent.created_at < filters.created_before)
    return keyset_page(session, query, AuditEvent.sequence, limit=limit, cursor=cursor)


@dataclass
class Verification:
    """What `settle audit verify` found: the first break of each broken chain, the heads
    of the others, and how many entries it read."""

    breaks: list[Break] = field(default_factory=list)
    heads: list[Head] = field(default_factory=list)
    entries: int = 0

    @property
    def ok(self) -> bool:
        return not self.breaks

    def document(self) -> dict[str, Any]:
        # Ids sort by time: the earliest bad entry of all (one with no id sorts first).
        first = min(self.breaks, key=lambda b: b.id) if self.breaks else None
        return {
            "ok": self.ok,
            "chains": len(self.heads) + len(self.breaks),
            "entries": self.entries,
            "firstBadEvent": first.document() if first else None,
            "breaks": [b.document() for b in self.breaks],
            "heads": [
                {"tenantId": h.tenant_id, "sequence": h.sequence, "hash": h.hash}
                for h in self.heads
            ],
        }


def verify(db: Database, *, anchors: Iterable[Head] = (), batch: int = 2000) -> Verification:
    """Check every tenant's chain, streaming the table in (tenant, sequence) order.

    `anchors`: heads an earlier run printed (kept elsewhere); each chain must still
    hold its anchored entry unchanged, and a tenant whose entries are all gone breaks.
    """
    found = Verification()
    anchored = {head.tenant_id: head for head in anchors}
    seen: set[str] = set()
    with db.reader() as session:
        rows = session.scalars(
            sa.select(AuditEvent)
            .order_by(AuditEvent.tenant_id, AuditEvent.sequence)
            .execution_options(yield_per=batch)
        )
        for tenant_id, tenant_rows in _by_tenant(rows):
            seen.add(tenant_id)
            counted = _Counted(tenant_rows)
            for outcome in check_chain(counted, anchored.get(tenant_id)):
                if isinstance(outcome, Break):
                    found.breaks.append(outcome)
                else:
                    found.heads.append(outcome)
            for _ in counted:  # the rest of a broken chain, still counted
                pass
            found.entries += counted.count
            session.expunge_all()
    for tenant_id in sorted(anchored.keys() - seen):
        head = anchored[tenant_id]
        found.breaks.append(
            Break("", tenant_id, 0, f"no entries left; sequence {head.sequence} was anchored")
        )
    return found


class _Counted:
    """An iterator over rows that counts them (the verification says how many it read)."""

    def __init__(self, rows: Iterator[AuditEvent]) -> None:
        self._rows = rows
        self.count = 0

    def __iter__(self) -> Iterator[AuditEvent]:
        return self

    def __next__(self) -> AuditEvent:
        row = next(self._rows)
        self.count += 1
        return row


def _by_tenant(rows: Any) -> Iterator[tuple[str, Iterator[AuditEvent]]]:
    """Consecutive rows grouped by tenant (rows come ordered by tenant)."""
    yield from itertools.groupby(rows, key=lambda row: row.tenant_id)
