"""`since` of the stats API and `settle sla`: a duration back from now or a past time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.notifier.sla import MAX_WINDOW, parse_since

NOW = datetime(2026, 11, 28, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "back"),
    [
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
        (" 2w ", timedelta(weeks=2)),
        ("3660d", MAX_WINDOW),
    ],
)
def test_a_duration_is_that_long_before_now(text: str, back: timedelta) -> None:
    assert parse_since(text, NOW) == NOW - back


def test_a_past_time_is_itself_and_a_zone_is_honoured() -> None:
    assert parse_since("2026-11-21T18:00:00Z", NOW) == NOW - timedelta(days=7)
    assert parse_since("2026-11-21T19:00:00+01:00", NOW) == NOW - timedelta(days=7)
    # Older than the longest window: the longest window
    assert parse_since("1999-01-01T00:00:00Z", NOW) == NOW - MAX_WINDOW


@pytest.mark.parametrize(
    "text",
    [
        "",
        "7",
        "d",
        "0d",
        "07d",
        "-1d",
        "1.5d",
        "3661d",
        "99999999d",
        "7D",
        "7 d",
        "7y",
        "2026-11-28T18:00:00Z",
        "2027-01-01",
        "now",
        "7d,8d",
    ],
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_since(text, NOW)
