"""Shared API pieces: addresses, cursors, error messages, timestamps, ids."""

import base64
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import marshmallow as ma
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from services.core.models import DepositAccount
from services.notifier.models import Endpoint
from shared.api import Page, checksum_address, field_error, invalid_request_from, keyset_page
from shared.errors import InvalidRequest
from shared.ids import new_id
from shared.settings import SettingsError, parse_schedule
from shared.timefmt import iso_ms, parse_iso

USDC = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"


def test_addresses_in_any_case_come_out_checksummed() -> None:
    assert checksum_address(USDC.lower()) == USDC
    assert checksum_address("0x" + USDC[2:].upper()) == USDC
    assert checksum_address(USDC) == USDC


@pytest.mark.parametrize(
    "bad",
    [USDC.replace("A0b8", "a0b8"), "0x123", USDC[2:], "0x" + "g" * 40, 42, None, USDC + "0"],
)
def test_bad_addresses_are_refused(bad: object) -> None:
    with pytest.raises(ma.ValidationError):
        checksum_address(bad)


class _Rows:
    """A session that answers every query with the given rows (newest first) and keeps it."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows
        self.queries: list[str] = []

    def scalars(self, query: Any) -> list[Any]:
        compiled = query.compile(dialect=postgresql.dialect())
        self.queries.append(str(compiled) % {k: repr(v) for k, v in compiled.params.items()})
        limit = compiled.params["param_1"]
        return self.rows[:limit]


def _page(session: _Rows, key: Any, cursor: str | None, limit: int = 2) -> Page[Any]:
    query = sa.select(key.class_)
    return keyset_page(session, query, key, limit=limit, cursor=cursor)  # type: ignore[arg-type]


def test_keyset_pages_carry_the_last_key_to_the_next_page() -> None:
    # Given three endpoints newest first, in pages of two
    rows = [SimpleNamespace(id=f"we_{n}") for n in (3, 2, 1)]
    session = _Rows(rows)
    first = _page(session, Endpoint.id, None)
    # Then the first page has two and a cursor; the query asked one row more than it shows
    assert [r.id for r in first.items] == ["we_3", "we_2"] and first.next_cursor
    assert "ORDER BY webhook_endpoints.id DESC" in session.queries[0]
    assert "LIMIT 3" in session.queries[0]
    # When the cursor is followed, the query starts strictly below the page's last id
    session.rows = rows[2:]
    last = _page(session, Endpoint.id, first.next_cursor)
    assert "webhook_endpoints.id < 'we_2'" in session.queries[1]
    assert [r.id for r in last.items] == ["we_1"] and last.next_cursor is None
    # An integer key works the same way
    session = _Rows([SimpleNamespace(pk=n) for n in (9, 8, 7)])
    page = _page(session, DepositAccount.pk, None)
    _page(session, DepositAccount.pk, page.next_cursor)
    assert "deposit_accounts.pk < 8" in session.queries[1]


def test_damaged_or_foreign_cursors_are_400_naming_cursor() -> None:
    text_cursor = _page(_Rows([SimpleNamespace(id=i) for i in "cba"]), Endpoint.id, None)
    int_cursor = _page(_Rows([SimpleNamespace(pk=n) for n in (3, 2, 1)]), DepositAccount.pk, None)
    damaged = [
        "%%%",
        "bm90IGpzb24",  # "not json"
        "bnVsbA",  # null
        str(text_cursor.next_cursor)[:-3] + "!!",
        str(int_cursor.next_cursor),  # an integer key where ids are expected
        base64.urlsafe_b64encode(b'{"k":"a\\u0000b"}').decode(),  # NUL: PostgreSQL refuses it
        base64.urlsafe_b64encode(b'{"k":"' + b"x" * 121 + b'"}').decode(),
    ]
    for cursor in damaged:
        with pytest.raises(InvalidRequest) as caught:
            _page(_Rows([]), Endpoint.id, cursor)
        assert caught.value.details == {"fields": {"cursor": ["not a cursor this API gave out"]}}
    for value in (b'"7"', b"true", b"9223372036854775808", b"1.5"):
        cursor = base64.urlsafe_b64encode(b'{"k":' + value + b"}").decode()
        with pytest.raises(InvalidRequest):
            _page(_Rows([]), DepositAccount.pk, cursor)
    with pytest.raises(InvalidRequest):
        _page(_Rows([]), DepositAccount.pk, str(text_cursor.next_cursor))


def test_a_field_error_names_its_field() -> None:
    err = field_error("destination.address", "the zero address cannot receive a settlement")
    assert err.body() == {
        "error": "invalid_request: destination.address: the zero address cannot receive a "
        "settlement",
        "code": "invalid_request",
        "details": {
            "fields": {"destination.address": ["the zero address cannot receive a settlement"]}
        },
    }


def test_validation_messages_name_nested_fields() -> None:
    err = invalid_request_from({"destination": {"chainId": ["Not a valid integer."]}})
    assert err.body()["error"] == "invalid_request: destination.chainId: Not a valid integer."
    assert err.details == {"fields": {"destination.chainId": ["Not a valid integer."]}}


def test_timestamps_have_milliseconds_and_z() -> None:
    moment = datetime(2026, 11, 21, 4, 11, 28, 123456, tzinfo=UTC)
    assert iso_ms(moment) == "2026-11-21T04:11:28.123Z"
    assert parse_iso("2026-11-21T04:11:28.123Z") == moment.replace(microsecond=123000)


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 11, 21, 4, 11, 28, 999999, tzinfo=UTC),
        datetime(2026, 1, 1, 0, 0, 0, 0, tzinfo=UTC),
        datetime(2026, 1, 1, 3, 30, 0, 500, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2026, 6, 1, 12, 0, 0, 1000),
        datetime(1000, 1, 1, 0, 0, 0, 1999, tzinfo=UTC),
        datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
)
def test_iso_ms_is_the_strftime_rendering(moment: datetime) -> None:
    """iso_ms renders through isoformat (faster); the text is the strftime one it replaced."""
    utc = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    expected = utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    assert iso_ms(moment) == expected


def test_ids_are_prefixed_and_time_ordered() -> None:
    first, second = new_id("acc"), new_id("acc")
    assert first.startswith("acc_") and len(first) == 30
    assert first[:14] <= second[:14]


def test_retry_schedule_parses_units_and_refuses_nonsense() -> None:
    assert parse_schedule("5s,1m,2h,1d,250ms") == (5.0, 60.0, 7200.0, 86400.0, 0.25)
    with pytest.raises(SettingsError):
        parse_schedule("5 parsecs")
