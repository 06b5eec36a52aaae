"""A database failover as Settle sees it, and what it does about one.

Every database URL may name a primary and its standbys in libpq's multi-host form with
`target_session_attrs=read-write` (`postgresql://u@db-1:5432,db-2:5432/settle?
target_session_attrs=read-write`): a new connection goes to whichever server takes
writes. While the primary changes, work on the database fails in a few known ways:

- the old primary ends its sessions (shut down: 57P01, 57P02) or the socket breaks
  (psycopg's OperationalError, SQLAlchemy's "connection invalidated");
- a server that is not (or no longer) the primary refuses a write (25006
  read_only_sql_transaction) or a connection (57P03 cannot_connect_now);
- no server takes writes yet (every host refused: OperationalError on connect).

`is_failover(err)` tells those from every other error. `watch(engine)` makes a
refused write invalidate the engine's pool, as a dropped connection already does, so
no pooled connection to a demoted primary is used again. `retry_idempotent(work)` runs
work again across a failover, for work that is safe to repeat (idempotent by design:
stored once by id, conditional updates); anything else fails with the error, which the
API answers 503 service_unavailable with Retry-After (shared/api.py), never a 500.

A write cut while it commits is another matter: the server may have committed it (with
a synchronous standby the commit is on the promoted server) and only the answer was
lost. `shared.db` raises `CommitOutcomeUnknown` for those (a COMMIT, or an autocommitted
statement on the fast executor, whose connection broke); the API answers it 503
outcome_unknown and an Idempotency-Key keeps that answer rather than running the work
again (shared/idempotency.py). It is still a failover (`is_failover`): work safe to
repeat is retried as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

T = TypeVar("T")

#: SQLSTATEs of a server going away or not taking writes: admin_shutdown, crash_shutdown,
#: cannot_connect_now, read_only_sql_transaction, and the connection exception class.
FAILOVER_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "25006"})
#: A server that answers but is not the primary (any more).
READ_ONLY = "25006"
#: How long `retry_idempotent` keeps trying by default: a promotion takes seconds.
RETRY_FOR_S = 30.0


class CommitOutcomeUnknown(sa.exc.DBAPIError):
    """A failover cut a write after it was sent to commit: it may or may not be written.

    A DBAPIError (wrapping the driver's error, its connection invalidated), so code
    that handles a cut connection handles this one the same way.
    """

    @classmethod
    def of(cls, err: BaseException) -> CommitOutcomeUnknown:
        orig = getattr(err, "orig", None)
        cause = orig if isinstance(orig, BaseException) else err
        unknown = cls("COMMIT", None, cause, connection_invalidated=True)  # type: ignore[arg-type]
        unknown.__cause__ = err
        return unknown


def outcome_unknown(err: BaseException, *, committing: bool) -> bool:
    """Whether `err`, raised by a write, leaves unknown whether it was written.

    At COMMIT (`committing`) any failover: the server may have committed before the
    connection broke. For an autocommitted statement, a connection that broke with no
    answer from the server: a server that answers with an error (25006 read-only, 57P01
    shut down while it ran, 57P03) did not commit it, and a session ended while its
    commit waits for the standby sends nothing.
    """
    if isinstance(err, CommitOutcomeUnknown) or not is_failover(err):
        return False
    return committing or sqlstate(err) is None


def _causes(err: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and len(found) < 8:
        found.append(current)
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return found


def sqlstate(err: BaseException) -> str | None:
    for cause in _causes(err):
        state = getattr(cause, "sqlstate", None)
        if isinstance(state, str):
            return state
    return None


def is_failover(err: BaseException) -> bool:
    """Whether `err` is the database changing hands (or gone), not a fault of the work."""
    state = sqlstate(err)
    if state is not None:
        return state in FAILOVER_SQLSTATES or state.startswith("08")
    for cause in _causes(err):
        if isinstance(cause, sa.exc.DBAPIError) and cause.connection_invalidated:
            return True
        if isinstance(cause, psycopg.OperationalError):
            return True  # no SQLSTATE: the connection broke or could not be made
    return False


def watch(engine: Engine) -> None:
    """A write refused as read-only invalidates `engine`'s whole pool (a demoted primary:
    every pooled connection is to it), as a dropped connection does."""

    @sa.event.listens_for(engine, "handle_error")
    def _read_only_is_a_disconnect(context: Any) -> None:
        if sqlstate(context.original_exception) == READ_ONLY:
            context.is_disconnect = True


def retry_idempotent(
    work: Callable[[], T],
    *,
    what: str,
    retry_for_s: float = RETRY_FOR_S,
    first_wait_s: float = 0.1,
    max_wait_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`work()`, run again while it fails by a failover, for up to `retry_for_s`.

    Only for work that is safe to repeat: a transaction cut by the failover may have
    committed before its answer was lost.
    """
    deadline = time.monotonic() + retry_for_s
    wait = first_wait_s
    while True:
        try:
            return work()
        except Exception as err:
            if not is_failover(err) or time.monotonic() + wait > deadline:
                raise
            log.warning("%s: database failover (%s); again in %.1f s", what, err, wait)
            sleep(wait)
            wait = min(max_wait_s, wait * 2)
