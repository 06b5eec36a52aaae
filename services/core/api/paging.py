"""Cursors of the lists that page on ULID ids, newest first (API keys, members)."""

from __future__ import annotations

from shared.api import decode_cursor, encode_cursor
from shared.errors import InvalidRequest


def before_cursor(cursor: str | None) -> str | None:
    """The id a page continues before; a cursor we did not give out is a 400."""
    values = decode_cursor(cursor)
    if values is None:
        return None
    before = values.get("before")
    if not isinstance(before, str) or not 1 <= len(before) <= 40:
        raise InvalidRequest(
            "cursor: not a cursor this API gave out", details={"fields": {"cursor": ["invalid"]}}
        )
    return before


def next_cursor(last_id: str | None) -> str | None:
    """The cursor of the page after the one ending at `last_id` (None: no more)."""
    return None if last_id is None else encode_cursor({"before": last_id})
