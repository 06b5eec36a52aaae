"""Shared API pieces: addresses, cursors, error messages, timestamps, ids."""

from datetime import UTC, datetime

import marshmallow as ma
import pytest

from shared.api import checksum_address, decode_cursor, encode_cursor, invalid_request_from
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


def test_cursor_round_trip_and_damage() -> None:
    assert decode_cursor(encode_cursor({"pk": 42})) == {"pk": 42}
    assert decode_cursor(None) is None
    for damaged in ("%%%", "bm90IGpzb24", encode_cursor({"pk": 1})[:-3] + "!!"):
        with pytest.raises(InvalidRequest):
            decode_cursor(damaged)


def test_validation_messages_name_nested_fields() -> None:
    err = invalid_request_from({"destination": {"chainId": ["Not a valid integer."]}})
    assert err.body()["error"] == "invalid_request: destination.chainId: Not a valid integer."
    assert err.details == {"fields": {"destination.chainId": ["Not a valid integer."]}}


def test_timestamps_have_milliseconds_and_z() -> None:
    moment = datetime(2026, 11, 21, 4, 11, 28, 123456, tzinfo=UTC)
    assert iso_ms(moment) == "2026-11-21T04:11:28.123Z"
    assert parse_iso("2026-11-21T04:11:28.123Z") == moment.replace(microsecond=123000)


def test_ids_are_prefixed_and_time_ordered() -> None:
    first, second = new_id("acc"), new_id("acc")
    assert first.startswith("acc_") and len(first) == 30
    assert first[:14] <= second[:14]


def test_retry_schedule_parses_units_and_refuses_nonsense() -> None:
    assert parse_schedule("5s,1m,2h,1d,250ms") == (5.0, 60.0, 7200.0, 86400.0, 0.25)
    with pytest.raises(SettingsError):
        parse_schedule("5 parsecs")
