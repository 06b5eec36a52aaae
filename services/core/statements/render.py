"""Writing a statement, row by row, to a binary file: JSON or CSV.

Every amount is a decimal string, exact (never a float): token amounts in token units
(base units when the token's decimals are unknown), USD figures as stored (to the
micro-dollar), each written by `format_amount` as everywhere in the API. The CSV is
one table (RFC 4180, UTF-8, CRLF) whose `record` column says what a row is:
`statement` (who, which period, when, which key), then `opening` per token, each
`deposit` in credit order, then `period` and `closing` per token.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import IO, Any

from services.core.amounts import format_amount, token_units
from services.core.statements.period import Period
from services.core.statements.queries import Figures, TokenTotals
from shared.timefmt import iso_ms

JSON = "json"
CSV = "csv"
FORMATS = (JSON, CSV)
MEDIA_TYPES = {JSON: "application/json", CSV: "text/csv; charset=utf-8; header=present"}
#: What a spreadsheet would run as a formula when a cell starts with it (OWASP's list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Header:
    """What a statement says of itself: whose, which deposits, when, under which key."""

    tenant_id: str
    sandbox: bool
    period: Period
    generated_at: datetime
    key_id: str


def token_amount(raw: int, decimals: int | None) -> str:
    return str(raw) if decimals is None else format_amount(token_units(raw, decimals))


def decimal_text(value: Decimal | str | None) -> str | None:
    return None if value is None else format_amount(Decimal(value))


def figures_document(figures: Figures, decimals: int | None) -> dict[str, Any]:
    return {
        "deposits": figures.deposits,
        "amount": token_amount(figures.amount_raw, decimals),
        "amountUsd": decimal_text(figures.amount_usd),
        "settlementGasFeeUsd": decimal_text(figures.fee_usd),
        "netAmountUsd": decimal_text(figures.net_usd),
    }


def totals_document(totals: TokenTotals) -> dict[str, Any]:
    return {
        "chainId": totals.chain_id,
        "asset": totals.asset,
        "tokenAddress": totals.token_address,
        "decimals": totals.decimals,
        "opening": figures_document(totals.opening, totals.decimals),
        "period": figures_document(totals.period, totals.decimals),
        "closing": figures_document(totals.closing, totals.decimals),
    }


def deposit_document(row: Any) -> dict[str, Any]:
    """One deposit of a statement (a row of `queries.DEPOSIT_COLUMNS`)."""
    return {
        "id": row.id,
        "accountId": row.account_id,
        "externalUserId": row.external_user_id,
        "chainId": row.chain_id,
        "depositAddress": row.deposit_address,
        "asset": row.asset,
        "tokenAddress": row.token_address,
        "amount": token_amount(int(row.amount_raw), row.decimals),
        "amountUsd": decimal_text(row.amount_usd),
        "settlementGasFeeUsd": decimal_text(row.fee_usd),
        "netAmountUsd": decimal_text(row.net_usd),
        "destination": {
            "chainId": row.dest_chain_id,
            "address": row.dest_address,
            "tokenAddress": row.dest_token_address,
        },
        "creditAmount": decimal_text(row.credit_amount),
        "route": row.route,
        "sourceTxHash": row.source_tx_hash,
        "sourceBlockNumber": row.block_number,
        "sourceBlockHash": row.block_hash,
        "logIndex": row.log_index,
        "creditTxHash": row.credit_tx_hash,
        "createdAt": iso_ms(row.created_at),
        "creditedAt": iso_ms(row.credited_at),
    }


def _json(value: Any) -> bytes:
    # ASCII only (non-ASCII as \\u escapes): the signed bytes do not depend on an encoding.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


class JsonWriter:
    """`{"statement": {...header, "totals": [...], "deposits": [...]}}`, compact."""

    def __init__(self, out: IO[bytes], header: Header, totals: list[TokenTotals]) -> None:
        self.out = out
        self.header = header
        self.totals = totals
        self.first = True

    def start(self) -> None:
        h = self.header
        head = {
            "tenantId": h.tenant_id,
            "sandbox": h.sandbox,
            "from": iso_ms(h.period.start),
            "to": iso_ms(h.period.end),
            "generatedAt": iso_ms(h.generated_at),
            "keyId": h.key_id,
            "totals": [totals_document(t) for t in self.totals],
        }
        # The header's object, left open for the deposits.
        self.out.write(b'{"statement":' + _json(head)[:-1] + b',"deposits":[')

    def deposit(self, row: Any) -> None:
        if not self.first:
            self.out.write(b",")
        self.first = False
        self.out.write(_json(deposit_document(row)))

    def finish(self) -> None:
        self.out.write(b"]}}")


#: The CSV's columns, and how a deposit fills each (totals and the header fill theirs).
_DEPOSIT_CELLS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "deposit_id": lambda d: d["id"],
    "account_id": lambda d: d["accountId"],
    "external_user_id": lambda d: d["externalUserId"],
    "deposit_address": lambda d: d["depositAddress"],
    "destination_chain_id": lambda d: d["destination"]["chainId"],
    "destination_address": lambda d: d["destination"]["address"],
    "destination_token_address": lambda d: d["destination"]["tokenAddress"],
    "credit_amount": lambda d: d["creditAmount"],
    "route": lambda d: d["route"],
    "source_tx_hash": lambda d: d["sourceTxHash"],
    "source_block_number": lambda d: d["sourceBlockNumber"],
    "source_block_hash": lambda d: d["sourceBlockHash"],
    "log_index": lambda d: d["logIndex"],
    "credit_tx_hash": lambda d: d["creditTxHash"],
    "created_at": lambda d: d["createdAt"],
    "credited_at": lambda d: d["creditedAt"],
}
#: The columns totals and deposits both fill, and the JSON field each holds.
_SHARED_CELLS = {
    "chain_id": "chainId",
    "asset": "asset",
    "token_address": "tokenAddress",
    "amount": "amount",
    "amount_usd": "amountUsd",
    "settlement_gas_fee_usd": "settlementGasFeeUsd",
    "net_amount_usd": "netAmountUsd",
}
CSV_COLUMNS = (
    "record",
    "tenant_id",
    "sandbox",
    "period_from",
    "period_to",
    "generated_at",
    "key_id",
    "chain_id",
    "asset",
    "token_address",
    "deposits",
    "amount",
    "amount_usd",
    "settlement_gas_fee_usd",
    "net_amount_usd",
    *_DEPOSIT_CELLS,
)


def _shared_cells(doc: dict[str, Any]) -> dict[str, Any]:
    return {column: doc[key] for column, key in _SHARED_CELLS.items()}


def csv_cell(value: Any) -> str:
    """A cell's text: empty for null; a text a spreadsheet would run as a formula gets a
    leading `'` (CSV injection), so it is shown, never evaluated."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class CsvWriter:
    """The statement as one CSV table (see the module's docstring)."""

    def __init__(self, out: IO[bytes], header: Header, totals: list[TokenTotals]) -> None:
        # newline="": the csv module writes its own CRLF line ends, untranslated.
        self.text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
        self.rows = csv.writer(self.text, lineterminator="\r\n")
        self.header = header
        self.totals = totals

    def _row(self, record: str, **cells: Any) -> None:
        self.rows.writerow([csv_cell(record), *(csv_cell(cells.get(c)) for c in CSV_COLUMNS[1:])])

    def _totals(self, record: str, totals: TokenTotals, figures: Figures) -> None:
        doc = {
            "chainId": totals.chain_id,
            "asset": totals.asset,
            "tokenAddress": totals.token_address,
            **figures_document(figures, totals.decimals),
        }
        self._row(record, deposits=doc["deposits"], **_shared_cells(doc))

    def start(self) -> None:
        h = self.header
        self.rows.writerow(CSV_COLUMNS)
        self._row(
            "statement",
            tenant_id=h.tenant_id,
            sandbox=h.sandbox,
            period_from=iso_ms(h.period.start),
            period_to=iso_ms(h.period.end),
            generated_at=iso_ms(h.generated_at),
            key_id=h.key_id,
        )
        for totals in self.totals:
            self._totals("opening", totals, totals.opening)

    def deposit(self, row: Any) -> None:
        d = deposit_document(row)
        own = {column: cell(d) for column, cell in _DEPOSIT_CELLS.items()}
        self._row("deposit", **_shared_cells(d), **own)

    def finish(self) -> None:
        for totals in self.totals:
            self._totals("period", totals, totals.period)
        for totals in self.totals:
            self._totals("closing", totals, totals.closing)
        self.text.flush()
        self.text.detach()  # the caller's file stays open


Writer = JsonWriter | CsvWriter


def writer(fmt: str, out: IO[bytes], header: Header, totals: list[TokenTotals]) -> Writer:
    return JsonWriter(out, header, totals) if fmt == JSON else CsvWriter(out, header, totals)
