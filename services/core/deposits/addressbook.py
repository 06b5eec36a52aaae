"""The deposit addresses of one chain, in memory: what the watcher matches recipients against.

A block's `Transfer` logs are matched here, not by the node (a topic filter of a million
addresses is a thousand `eth_getLogs` calls). The set is loaded once, then each round
reads the rows above a floor: every key at or under it is known to be loaded. New
accounts get higher `account_pk`s, but a transaction that drew a lower key may commit
after higher ones were read; so the floor moves up to a round's highest key only once
every transaction open at that round has ended, seen by PostgreSQL's snapshot horizon
(`pg_current_snapshot()`): the xmax read the round after the rows, against the xmin of a
later round, whose read then sees what they committed. A writer open for long holds the
floor back; the rows re-read are capped (`window_cap` keys under the newest), and keys
under the cap are left to the count. Rows never go away, so a count that differs from
the set's size means something was missed (an address backfilled for an old account on
a newly active chain): the set is then read whole again. The count is checked every
`recount_s` seconds.

Keys are the 160-bit addresses as Python ints: a million of them take ~80 MB, half
what the hex strings would.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from services.core.models import DepositAccount, DepositAddress
from shared.db import Database, DriverStatement, driver_rows

log = logging.getLogger(__name__)

#: Account keys under the newest re-read at most while the floor is held back (a writer
#: open for long); keys under that are left to the count.
WINDOW_CAP = 10_000
#: Seconds between counts of the chain's addresses (a full reload when they differ).
RECOUNT_S = 60.0


def address_key(address: str) -> int:
    """`0x…` (any case) as the int the set holds."""
    return int(address[2:], 16)


_TABLE = DepositAddress.__table__
_COUNT = (
    sa.select(sa.func.count())
    .select_from(_TABLE)
    .where(_TABLE.c.chain_id == sa.bindparam("chain_id"))
)
_SINCE = sa.select(_TABLE.c.account_pk, _TABLE.c.address).where(
    _TABLE.c.chain_id == sa.bindparam("chain_id"),
    _TABLE.c.account_pk > sa.bindparam("since", type_=sa.BigInteger()),
)
#: The snapshot's horizon: every transaction under xmin has ended; none at or above xmax
#: had started (xid8 as text: no wraparound).
_HORIZON = sa.text(
    "SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint "
    "FROM pg_current_snapshot() AS s"
)


def first_given_out(db: Database, chain_id: int) -> datetime | None:
    """When the chain's earliest deposit address was given out (None: it has none).

    An address from before core_0016 has no time of its own: its account's creation
    stands in (at or before the true time, so never too late). Read once, when a chain
    is first watched: a scan of the chain's addresses."""
    statement = (
        sa.select(sa.func.min(sa.func.coalesce(_TABLE.c.created_at, DepositAccount.created_at)))
        .select_from(_TABLE.join(DepositAccount, DepositAccount.pk == _TABLE.c.account_pk))
        .where(_TABLE.c.chain_id == chain_id)
    )
    with db.reader() as session:
        earliest: datetime | None = session.scalar(statement)
    return earliest


class AddressBook:
    """One chain's deposit addresses, refreshed incrementally."""

    def __init__(
        self,
        db: Database,
        chain_id: int,
        *,
        recount_s: float = RECOUNT_S,
        window_cap: int = WINDOW_CAP,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.chain_id = chain_id
        self.recount_s = recount_s
        self.window_cap = window_cap
        self._monotonic = monotonic
        self._keys: set[int] = set()
        self._high = -1
        #: Every key at or under it is loaded.
        self._floor = -1
        #: (xmax, highest key) of earlier rounds, oldest first: the floor may rise to the
        #: key once a round's xmin reaches the xmax (every transaction open then ended).
        self._marks: deque[tuple[int, int]] = deque()
        #: The highest key of the last round's read, waiting for the next round's xmax.
        self._unmarked: int | None = None
        self._recount_due = 0.0
        #: Rows read from the database by the last refresh (for tests and figures).
        self.rows_read = 0
        self._values = {"chain_id": chain_id}

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def refresh(self) -> None:
        """Add addresses created since the last refresh; reload whole when a count differs."""
        now = self._monotonic()
        # The driver's own connection: this runs every round, and SQLAlchemy's result
        # processing of the rows read again cost more than reading them.
        with self.db.driver_autocommit(writes=False) as conn:
            xmin, xmax = driver_rows(conn, self._statement("horizon", _HORIZON), {})[0]
            unmarked, self._unmarked = self._unmarked, None
            if unmarked is not None and (not self._marks or self._marks[-1][1] < unmarked):
                # Read after the last round's rows: any transaction open at that read has
                # an xid under it (one that had drawn its key but no xid yet gets one
                # within the round). Keys only grow, so a mark with the same key as the
                # one before adds nothing: every key under it was drawn before that read.
                self._marks.append((xmax, unmarked))
            settled = self._floor
            while self._marks and self._marks[0][0] <= xmin:
                settled = max(settled, self._marks.popleft()[1])
            if self._high < 0 or now >= self._recount_due:
                count = driver_rows(conn, self._statement("count", _COUNT), self._values)[0][0]
                self._recount_due = now + self.recount_s
                if count != len(self._keys):
                    if self._high >= 0:
                        log.warning(
                            "chain %s: %s deposit addresses, %s in memory: reloading",
                            self.chain_id,
                            count,
                            len(self._keys),
                        )
                    self._keys = set()
                    self._load(conn, since=-1)
                    self._floor = settled
                    return
            since = max(self._floor, self._high - self.window_cap)
            self._load(conn, since=since)
            # This read saw every row the settled transactions committed: no key at or
            # under `settled` is missing now (and under `since`, past the cap, the count
            # has the rest).
            self._floor = max(since, settled)
        while self._marks and self._marks[0][1] <= self._floor:
            self._marks.popleft()

    def _statement(self, name: str, statement: sa.Executable) -> DriverStatement:
        return self.db.attachment(f"addressbook.{name}", lambda d: d.driver_statement(statement))

    def _load(self, conn: Any, *, since: int) -> None:
        statement = self._statement("since", _SINCE)
        read = 0
        keys = self._keys
        high = self._high
        with conn.cursor() as cur:
            cur.execute(statement.sql, statement.bind({**self._values, "since": since}))
            for pk, address in cur:
                keys.add(int(address[2:], 16))
                if pk > high:
                    high = pk
                read += 1
        self._high = high
        self.rows_read = read
        self._unmarked = high
