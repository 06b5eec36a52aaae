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

import sqlalchemy as sa

from services.core.models import DepositAddress
from shared.db import Database

log = logging.getLogger(__name__)

#: Account keys re-read below the highest one seen, for transactions that commit late.
OVERLAP_KEYS = 1_000
#: Seconds between counts of the chain's addresses (a full reload when they differ).
RECOUNT_S = 60.0


def address_key(address: str) -> int:
    """`0x…` (any case) as the int the set holds."""
    return int(address[2:], 16)


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

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def refresh(self) -> None:
        """Add addresses created since the last refresh; reload whole when a count differs."""
        table = DepositAddress.__table__
        now = self._monotonic()
        with self.db.autocommit() as conn:
            if self._high < 0 or now >= self._recount_due:
                count = conn.scalar(
                    sa.select(sa.func.count())
                    .select_from(table)
                    .where(table.c.chain_id == self.chain_id)
                )
                self._recount_due = now + self.recount_s
                if count != len(self._keys):
                    if self._high >= 0:
                        log.warning(
                            "chain %s: %s deposit addresses, %s in memory: reloading",
                            self.chain_id,
                            count,
                            len(self._keys),
                        )
                    self._load(conn, since=-1)
                    return
            self._load(conn, since=self._high - self.overlap_keys)

    def _load(self, conn: sa.Connection, *, since: int) -> None:
        table = DepositAddress.__table__
        if since < 0:
            self._keys = set()
        rows = conn.execute(
            sa.select(table.c.account_pk, table.c.address).where(
                table.c.chain_id == self.chain_id, table.c.account_pk > since
            )
        )
        read = 0
        keys = self._keys
        high = self._high
        for pk, address in rows:
            keys.add(int(address[2:], 16))
            if pk > high:
                high = pk
            read += 1
        self._high = high
        self.rows_read = read
