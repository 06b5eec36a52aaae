"""The deposit keys Settle has derived addresses from (`deposit_keys`), one row per xpub.

A process records its key the first time it writes an address with it (account
creation, the backfill), and every address row names its key (`key_id`): after a
rotation (a new SETTLE_DEPOSIT_XPUB) older addresses still say which key and path
move their funds, and the sweep plan tells the offline signer (docs/KEYS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from services.core.models import DepositKey
from shared.db import Database
from shared.timefmt import utcnow


@dataclass(frozen=True)
class RecordedKey:
    id: int
    xpub: str
    scheme: str


def _record(db: Database, xpub: str, scheme: str) -> RecordedKey:
    with db.transaction() as session:
        session.execute(
            postgresql.insert(DepositKey)
            .values(xpub=xpub, scheme=scheme, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=[DepositKey.xpub])
        )
        key_id, recorded_scheme = session.execute(
            sa.select(DepositKey.id, DepositKey.scheme).where(DepositKey.xpub == xpub)
        ).one()
    if recorded_scheme != scheme:
        # The scheme follows from the xpub (addresses.scheme_of); a row saying otherwise
        # was edited by hand, and deriving on would put addresses where nobody expects.
        raise RuntimeError(
            f"deposit key {key_id} is recorded as {recorded_scheme}, but derives as {scheme}"
        )
    return RecordedKey(int(key_id), xpub, scheme)


def recorded(db: Database, xpub: str, scheme: str) -> RecordedKey:
    """This key's row (written on first use), once per process and database."""
    return db.attachment(f"core.deposit_keys.{xpub}", lambda d: _record(d, xpub, scheme))
