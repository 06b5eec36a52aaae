"""The deposit addresses of one chain, in memory: what the watcher matches recipients against.

A block's `Transfer` logs are matched here, not by the node (a topic filter of a million
addresses is a thousand `eth_getLogs` calls). The set is loaded once, then only rows
added since are read: new accounts get higher `account_pk`s, and the last few seconds'
range is read again in case a transaction that drew a lower key committed late. Rows
never go away, so a count that differs from the set's size means something was missed
(an address backfilled for an old account on a newly active chain): the set is then
read whole again. The count is checked every `recount_s` seconds.

Keys are the 160-bit addresses as Python ints: a million of them take ~80 MB, half
what the hex strings would.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from services.core.models import DepositAccount, DepositAddress
from shared.db import Database, DriverStatement, driver_rows

log = logging.getLogger(__name__)

#: Account keys re-read below the highest one seen, for transactions that commit late.
OVERLAP_KEYS = 1_000
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
        overlap_keys: int = OVERLAP_KEYS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.chain_id = chain_id
        self.recount_s = recount_s
        self.overlap_keys = overlap_keys
        self._monotonic = monotonic
        self._keys: set[int] = set()
        self._high = -1
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
            if self._high < 0 or now >= self._recount_due:
                count = driver_rows(conn, self._statement("count", _COUNT), self._values)[0][0]
                if count != len(self._keys):
                    if self._high >= 0:
                        log.warning(
                            "chain %s: %s deposit addresses, %s in memory: reloading",
                            self.chain_id,
                            count,
                            len(self._keys),
                        )
                    self._load(conn, since=-1)
                    # Only once the reload is whole: one cut (a failover) counts again
                    # next round, instead of a minute on a set missing what it missed.
                    self._recount_due = now + self.recount_s
                    return
                self._recount_due = now + self.recount_s
            self._load(conn, since=self._high - self.overlap_keys)

    def _statement(self, name: str, statement: sa.Select[Any]) -> DriverStatement:
        return self.db.attachment(f"addressbook.{name}", lambda d: d.driver_statement(statement))

    def _load(self, conn: Any, *, since: int) -> None:
        """Add the rows above `since`; from -1, read the set whole into a new one, which
        replaces the old only once read (a read cut midway keeps the set it had)."""
        statement = self._statement("since", _SINCE)
        self.rows_read = read = 0
        keys: set[int] = set() if since < 0 else self._keys
        high = self._high
        with conn.cursor() as cur:
            cur.execute(statement.sql, statement.bind({**self._values, "since": since}))
            for pk, address in cur:
                keys.add(int(address[2:], 16))
                if pk > high:
                    high = pk
                read += 1
        self._keys = keys
        self._high = high
        self.rows_read = read
