"""Which deposits a statement holds: the rules of its period, without a database.

A deposit belongs to the period in which it was credited: `from <= creditedAt < to`.
Only credited deposits are on a statement (a failed deposit moved no money; one still
settling has not yet). `creditedAt` is set once, when the deposit becomes `credited`,
and never changes, so a closed period's statement lists the same deposits every time;
a manual credit days later falls in the period of the day it was made.

Opening totals: every deposit credited before `from`. Closing totals: every deposit
credited before `to`. So closing = opening + the period's deposits, field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from shared.api import field_error


@dataclass(frozen=True)
class Period:
    """`start <= creditedAt < end`, both UTC, to the millisecond."""

    start: datetime
    end: datetime


def to_millisecond(value: datetime) -> datetime:
    """Finer digits dropped: every timestamp Settle writes and shows is to the millisecond."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def period(start: datetime, end: datetime | None, *, now: datetime, max_days: int) -> Period:
    """The period `[start, end)` (`end` None: now), or 400 `invalid_request` naming the field.

    The period must have ended (`end` not after now), be non-empty and span at most
    `max_days`.
    """
    start = to_millisecond(start)
    end = to_millisecond(now if end is None else end)
    if end > now:
        raise field_error(
            "to", "must not be in the future: a statement covers a period that has ended"
        )
    if start >= end:
        raise field_error("from", "must be before to")
    if end - start > timedelta(days=max_days):
        raise field_error("to", f"the period may span at most {max_days} days")
    return Period(start, end)
