"""Per-account event numbers: every event about a deposit account carries `sequence`,
1, 2, 3... per account, in the order the events were committed.

The number is taken in the writing transaction by an upsert on the account's row of
`account_event_sequences`, whose lock is held to the commit: a second transaction
numbering the same account waits for the first to commit (or roll back, which gives
its number back), so numbers increase in commit order with no gap. A durable event
refused as a duplicate is refused inside the savepoint that took its number
(transitions.emit), so it leaves no gap either. Several accounts in one statement are
locked in account order, so two bulk writers cannot deadlock on each other.
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from services.core.models import AccountEventSequence

#: What a new account's first event (deposit.account.created) carries.
FIRST = 1

_TABLE: sa.Table = AccountEventSequence.__table__  # type: ignore[assignment]


def _advance(counts: Mapping[str, int]) -> sa.Insert:
    """Upsert adding counts[account] to each account's last number (0 when it has no
    row), rows in account order; returns (account_id, last_sequence) after the add."""
    insert = postgresql.insert(_TABLE).values(
        [{"account_id": a, "last_sequence": counts[a]} for a in sorted(counts)]
    )
    return insert.on_conflict_do_update(
        index_elements=[_TABLE.c.account_id],
        set_={"last_sequence": _TABLE.c.last_sequence + insert.excluded.last_sequence},
    ).returning(_TABLE.c.account_id, _TABLE.c.last_sequence)


def take(session: Session, counts: Mapping[str, int]) -> dict[str, int]:
    """Reserve counts[account] numbers for each account (locking its row to the commit);
    the first number reserved for each."""
    if not counts:
        return {}
    rows = session.execute(_advance(counts)).all()
    return {account: last - counts[account] + 1 for account, last in rows}


def lock(session: Session, accounts: list[str]) -> None:
    """Lock the accounts' rows (creating missing ones) without taking a number: after
    it, every event of theirs written before is visible (bulk writers check for
    duplicates then)."""
    if accounts:
        session.execute(_advance(dict.fromkeys(accounts, 0)))


def first_after(written: sa.CTE) -> sa.Insert:
    """The row of a new account (bind parameter `account_id`) whose first event, numbered
    FIRST, is written in the same statement, for each row of `written` (the account's
    INSERT as a data-modifying CTE)."""
    values = sa.select(
        sa.bindparam("account_id", type_=_TABLE.c.account_id.type),
        sa.literal_column(str(FIRST)),
    ).select_from(written)
    return _TABLE.insert().from_select(["account_id", "last_sequence"], values)
