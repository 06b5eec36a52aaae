"""Token amounts as tenants write them: one rule for every request that carries one.

Fee previews and sandbox deposits (and whatever takes an amount next) read amounts
here, so the same text is accepted or refused, and written back, the same way
everywhere (docs/CORE_API.md, "Amounts and assets"): a decimal string in token units,
ASCII digits, optionally a point and more digits (`"125.50"`); no sign, exponent,
separators, spaces or line breaks; greater than 0 and below 10^15 token units; with
at most as many decimals as the token has, counted as written (`"1.0000000"` has 7).
Asset symbols have their one rule in `Chain.asset_by_symbol`.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, DivisionByZero, InvalidOperation, Overflow

from services.core.chains import Asset, Chain

#: Integer digits an amount may have: below 10^15 token units. Far above any real
#: deposit, far below what the USD arithmetic (28 significant digits, 6 decimals) and
#: the stored columns hold: 10^22 once answered 500.
MAX_INTEGER_DIGITS = 15
#: Decimals an amount may have, whatever the token (the chains file allows 0..36).
MAX_DECIMALS = 36
#: What an amount looks like (also its pattern in the OpenAPI documents).
AMOUNT_PATTERN = rf"[0-9]{{1,{MAX_INTEGER_DIGITS}}}(\.[0-9]{{1,{MAX_DECIMALS}}})?"
_AMOUNT = re.compile(AMOUNT_PATTERN)
#: How a malformed amount is described to the client.
AMOUNT_SHAPE = (
    f'a decimal string such as "125.50": digits, optionally a point and decimals, below '
    f"10^{MAX_INTEGER_DIGITS}"
)


#: Arithmetic on token amounts without rounding: the default context keeps 28
#: significant digits, and `Decimal("999999999999999.999999999999999999").scaleb(18)`
#: rounded to 1E+33 in it, silently. 2^256 has 78 digits; a token has at most 36 decimals.
EXACT = Context(prec=120, traps=[InvalidOperation, DivisionByZero, Overflow])


class AmountError(ValueError):
    """Why a text is not an acceptable amount (the message is for the client)."""


def parse_amount(text: object) -> Decimal:
    """A positive decimal string -> Decimal (keeping its written decimals), or AmountError.

    `fullmatch`, not `match` with `$`: `$` also matches before a trailing newline, so
    `"125.50\\n"` once passed.
    """
    if not isinstance(text, str) or not _AMOUNT.fullmatch(text):
        raise AmountError(f"must be {AMOUNT_SHAPE}")
    amount = Decimal(text)
    if amount <= 0:
        raise AmountError("must be greater than 0")
    return amount


def decimals_of(amount: Decimal) -> int:
    """Decimals as written (`Decimal("1.10")` has 2)."""
    exponent = amount.as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def fits(amount: Decimal, asset: Asset) -> bool:
    """Whether the amount can be sent in this token (no more decimals than it has)."""
    return decimals_of(amount) <= asset.decimals


def too_fine_message(amount: Decimal, assets: list[tuple[Chain, Asset]]) -> str:
    names = ", ".join(f"{a.symbol} on {c.chain_id} ({a.decimals})" for c, a in assets)
    return f"has {decimals_of(amount)} decimal places, more than the token has: {names}"


def base_units(amount: Decimal, decimals: int) -> int:
    """Token units -> base units, exactly (the amount must fit the token's decimals)."""
    return int(amount.scaleb(decimals, context=EXACT))


def token_units(raw: int, decimals: int) -> Decimal:
    """Base units -> token units, exactly."""
    return Decimal(raw).scaleb(-decimals, context=EXACT)


def format_amount(value: Decimal) -> str:
    """A token amount as decimal text with at least two decimals: `125.50`, `0.000001`.

    How every answer writes an amount (the deposit object, fee quotes, statements): never
    an exponent, never more decimals than the value needs, never a digit rounded away.
    """
    text = format(value.normalize(EXACT), "f")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"
