"""Timestamps: always timezone-aware UTC, rendered as ISO 8601 with milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache


def utcnow() -> datetime:
    """Current time, UTC, truncated to milliseconds (what the API can show)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


@lru_cache(maxsize=1024)
def iso_ms(value: datetime) -> str:
    """Render `2026-11-21T04:11:28.123Z`.

    Cached: a pure function of the instant, and a batch of documents shares its few
    timestamps (the chain watcher renders thousands a block).
    """
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    if value.year < 1000:
        # isoformat pads the year to four digits; strftime's %Y may not (glibc does not).
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    # The same text as the strftime above, for half the CPU.
    return value.isoformat(timespec="milliseconds")[:-6] + "Z"


def parse_iso(text: str) -> datetime:
    """Parse an ISO 8601 timestamp; a missing zone means UTC. Raises ValueError."""
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        # e.g. 9999-12-31T23:59:59-14:00: a valid text whose UTC time is past year 9999.
        raise ValueError(f"{text!r} is outside the years 1..9999 in UTC") from None
