"""The deposit object: what GET /v1/deposits serves and every deposit event carries.

A `deposit.credited` event is a settlement receipt, so the object says everything:
what arrived (chain, token, amount, source tx), what it was worth, the fee skimmed,
what was paid, where (destination snapshot) and by which transaction.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from services.core.deposits.models import Deposit
from shared.timefmt import iso_ms


def token_units(raw: int, decimals: int) -> Decimal:
    """Base units -> token units, exactly."""
    return Decimal(raw).scaleb(-decimals)


def format_amount(value: Decimal) -> str:
    """A token amount as decimal text with at least two decimals: `125.50`, `0.000001`."""
    text = format(value.normalize(), "f")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"


def amount_text(deposit: Deposit) -> str:
    """The amount in token units; in base units when the token's decimals are unknown."""
    if deposit.decimals is None:
        return deposit.amount_raw
    return format_amount(token_units(int(deposit.amount_raw), deposit.decimals))


def _usd(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def deposit_document(deposit: Deposit) -> dict[str, Any]:
    """The deposit object (wire form, camelCase)."""
    return {
        "id": deposit.id,
        "accountId": deposit.account_id,
        "externalUserId": deposit.external_user_id,
        "status": deposit.status,
        "chainId": deposit.chain_id,
        "depositAddress": deposit.deposit_address,
        "asset": deposit.asset,
        "tokenAddress": deposit.token_address,
        "decimals": deposit.decimals,
        "amount": amount_text(deposit),
        "amountRaw": deposit.amount_raw,
        "amountUsd": _usd(deposit.amount_usd),
        "settlementGasFeeUsd": _usd(deposit.fee_usd),
        "netAmountUsd": _usd(deposit.net_usd),
        "sourceTxHash": deposit.source_tx_hash,
        "logIndex": deposit.log_index,
        "fromAddress": deposit.from_address,
        "blockNumber": deposit.block_number,
        "blockHash": deposit.block_hash,
        "confirmations": deposit.confirmations,
        "requiredConfirmations": deposit.required_confirmations,
        "destination": {
            "chainId": deposit.dest_chain_id,
            "address": deposit.dest_address,
            "tokenAddress": deposit.dest_token_address,
        },
        "route": deposit.route,
        "creditTxHash": deposit.credit_tx_hash,
        "failureReason": deposit.failure_reason,
        "reviewReason": deposit.review_reason,
        "sandbox": deposit.sandbox,
        "createdAt": iso_ms(deposit.created_at),
        "updatedAt": iso_ms(deposit.updated_at),
        "confirmedAt": None if deposit.confirmed_at is None else iso_ms(deposit.confirmed_at),
        "creditedAt": None if deposit.credited_at is None else iso_ms(deposit.credited_at),
    }
