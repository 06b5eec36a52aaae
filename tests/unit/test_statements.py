"""Statements without a database: the period's rules, CSV cells, settings, the signing key."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from services.core.statements import render
from services.core.statements.period import Period, period
from services.core.statements.queries import Figures, TokenTotals
from services.core.statements.service import StatementInconsistent, _check_sums
from services.core.statements.settings import StatementSettings
from services.core.statements.signing import StatementSigner, derive_seed
from shared.errors import InvalidRequest
from shared.settings import SettingsError

NOW = datetime(2026, 11, 28, 12, 0, 0, 123000, tzinfo=UTC)


def test_a_period_is_read_to_the_millisecond_and_to_defaults_to_now() -> None:
    start = datetime(2026, 11, 1, 0, 0, 0, 999999, tzinfo=UTC)
    assert period(start, None, now=NOW, max_days=366) == Period(
        start.replace(microsecond=999000), NOW
    )


@pytest.mark.parametrize(
    ("start", "end", "field"),
    [
        (NOW, NOW, "from"),  # empty
        (NOW, NOW - timedelta(seconds=1), "from"),  # backwards
        (NOW - timedelta(days=1), NOW + timedelta(milliseconds=1), "to"),  # not ended
        (NOW - timedelta(days=31, milliseconds=1), NOW, "to"),  # too long
    ],
)
def test_bad_periods_name_their_field(start: datetime, end: datetime, field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        period(start, end, now=NOW, max_days=31)
    assert list((refused.value.details or {})["fields"]) == [field]


def test_the_longest_period_is_allowed() -> None:
    assert period(NOW - timedelta(days=31), NOW, now=NOW, max_days=31).end == NOW


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ("=1+1", "'=1+1"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("user=42", "user=42"),
        ("125.50", "125.50"),
        (None, ""),
        (True, "true"),
        (12, "12"),
    ],
)
def test_csv_cells_are_never_formulas(value: object, cell: str) -> None:
    assert render.csv_cell(value) == cell


def test_amounts_are_exact_decimal_text() -> None:
    assert render.token_amount(125_500_000, 6) == "125.50"
    assert render.token_amount(1, 18) == "0.000000000000000001"
    assert render.token_amount(2**256 - 1, 18).startswith("115792089237316195423570985008687907853")
    assert render.token_amount(42, None) == "42"  # decimals unknown: base units
    assert render.decimal_text(Decimal("0.012345")) == "0.012345"
    assert render.decimal_text("125.250000") == "125.25"
    assert render.decimal_text(None) is None


def test_closing_is_opening_plus_the_period() -> None:
    opening = Figures(2, 5, Decimal("5"), Decimal("0.5"), Decimal("4.5"))
    inside = Figures(1, 7, Decimal("7"), Decimal("0.25"), Decimal("6.75"))
    totals = TokenTotals(1, "0xA", "USDC", 6, opening, inside)
    assert totals.closing == Figures(3, 12, Decimal("12"), Decimal("0.75"), Decimal("11.25"))


def test_deposits_that_do_not_add_up_to_the_totals_are_never_signed() -> None:
    inside = Figures(1, 7, Decimal("7"), Decimal("0.25"), Decimal("6.75"))
    totals = [TokenTotals(1, "0xA", "USDC", 6, Figures(), inside)]
    _check_sums(totals, {(1, "0xA"): inside})
    with pytest.raises(StatementInconsistent):
        _check_sums(totals, {})
    with pytest.raises(StatementInconsistent):
        _check_sums(totals, {(1, "0xA"): inside, (1, "0xB"): inside})


def test_the_signing_key_is_derived_from_the_secret_key_by_hkdf() -> None:
    # The same secret gives the same key, another secret another key
    a = StatementSigner.from_settings(StatementSettings(), "secret-a-" + "x" * 32)
    again = StatementSigner.from_settings(StatementSettings(), "secret-a-" + "x" * 32)
    b = StatementSigner.from_settings(StatementSettings(), "secret-b-" + "x" * 32)
    assert a.public == again.public and a.public != b.public
    assert derive_seed("s") != hashlib.sha256(b"s").digest()  # a KDF, not a bare hash
    # Its id is stk_ + the first 16 hex digits of SHA-256 over the raw public key
    assert a.key_id == "stk_" + hashlib.sha256(a.public.raw).hexdigest()[:16]
    # And what it signs verifies with the published key alone
    Ed25519PublicKey.from_public_bytes(base64.b64decode(a.public.public_key)).verify(
        a.sign(b"statement"), b"statement"
    )


def test_settings_read_keys_and_limits() -> None:
    seed = bytes(range(32))
    env = {
        "SETTLE_STATEMENT_SIGNING_KEY": base64.urlsafe_b64encode(seed).decode().rstrip("="),
        "SETTLE_STATEMENT_RETIRED_KEYS": f" {base64.b64encode(b'k' * 32).decode()} ,",
        "SETTLE_STATEMENT_MAX_DAYS": "31",
        "SETTLE_STATEMENT_MAX_DEPOSITS": "500",
        "SETTLE_STATEMENT_CONCURRENCY": "3",
    }
    settings = StatementSettings.from_env(env)
    assert settings == StatementSettings(
        max_days=31,
        max_deposits=500,
        concurrency=3,
        signing_key=seed,
        retired_public_keys=(b"k" * 32,),
    )
    assert StatementSettings.from_env({}) == StatementSettings()
    for bad in (
        {"SETTLE_STATEMENT_SIGNING_KEY": "not base64!"},
        {"SETTLE_STATEMENT_SIGNING_KEY": base64.b64encode(b"short").decode()},
        {"SETTLE_STATEMENT_RETIRED_KEYS": "AAAA"},
        {"SETTLE_STATEMENT_MAX_DAYS": "0"},
        {"SETTLE_STATEMENT_MAX_DEPOSITS": "0"},
        {"SETTLE_STATEMENT_CONCURRENCY": "0"},
    ):
        with pytest.raises(SettingsError, match=next(iter(bad))):
            StatementSettings.from_env(bad)
