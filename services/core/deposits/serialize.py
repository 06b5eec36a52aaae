"""The deposit object: what GET /v1/deposits serves and every deposit event carries.

One schema renders it for both, so a `deposit.credited` event is exactly what the API
would have served at that moment, and a settlement receipt: what arrived (chain,
token, amount, source tx), what it was worth, the fee skimmed, what was paid, where
(destination snapshot) and by which transaction.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import marshmallow as ma

from services.core.amounts import format_amount, token_units
from services.core.deposits import states
from shared.api import Schema, Timestamp
from shared.timefmt import iso_ms


def amount_text(deposit: Any) -> str:
    """The amount in token units; in base units when the token's decimals are unknown."""
    if deposit.decimals is None:
        return deposit.amount_raw
    return format_amount(token_units(int(deposit.amount_raw), deposit.decimals))


class DepositDestinationSchema(Schema):
    chain_id = ma.fields.Integer(required=True)
    address = ma.fields.String(required=True)
    token_address = ma.fields.String(required=True)


class DepositSchema(Schema):
    """The deposit object (GET /v1/deposits and every deposit event's `data.deposit`)."""

    id = ma.fields.String(required=True, metadata={"example": "dep_01JD3Y9X8M2K4Q7R5T6V8W0Z1A"})
    account_id = ma.fields.String(required=True)
    external_user_id = ma.fields.String(required=True)
    status = ma.fields.String(required=True, metadata={"enum": list(states.STATUSES)})
    chain_id = ma.fields.Integer(required=True)
    deposit_address = ma.fields.String(required=True)
    asset = ma.fields.String(
        required=True, allow_none=True, metadata={"description": "Null for an unsupported token."}
    )
    token_address = ma.fields.String(required=True)
    decimals = ma.fields.Integer(required=True, allow_none=True)
    amount = ma.fields.Function(
        amount_text,
        required=True,
        metadata={
            "type": "string",
            "example": "125.50",
            "description": "Token units as a decimal string (base units when the token is "
            "unsupported and its decimals unknown).",
        },
    )
    amount_raw = ma.fields.String(required=True, metadata={"description": "Base units."})
    amount_usd = ma.fields.Float(required=True, allow_none=True)
    settlement_gas_fee_usd = ma.fields.Float(
        attribute="fee_usd",
        required=True,
        allow_none=True,
        metadata={"description": "The chain's live fee, recorded at settlement (estimate before)."},
    )
    net_amount_usd = ma.fields.Float(
        attribute="net_usd",
        required=True,
        allow_none=True,
        metadata={"description": "amountUsd - fee."},
    )
    source_tx_hash = ma.fields.String(required=True)
    log_index = ma.fields.Integer(required=True)
    from_address = ma.fields.String(required=True, allow_none=True)
    block_number = ma.fields.Integer(required=True, allow_none=True)
    block_hash = ma.fields.String(required=True, allow_none=True)
    # The same columns as blockNumber/blockHash, named for what they are (marshmallow
    # lets no two fields share an attribute, hence Function fields).
    source_block_number = ma.fields.Function(
        lambda deposit: _int(deposit.block_number),
        required=True,
        allow_none=True,
        metadata={
            "type": "integer",
            "nullable": True,
            "description": "Block of the incoming transfer (moves if a reorg re-mines it). "
            "Sandbox deposits: a block of the simulated chain.",
        },
    )
    source_block_hash = ma.fields.Function(
        lambda deposit: deposit.block_hash,
        required=True,
        allow_none=True,
        metadata={
            "type": "string",
            "nullable": True,
            "description": "Hash of that block. Sandbox deposits: a synthetic hash "
            "(keccak256 of `settle:sandbox:<chainId>:<number>`), never a real block's.",
        },
    )
    confirmations = ma.fields.Integer(required=True)
    required_confirmations = ma.fields.Integer(required=True)
    destination = ma.fields.Nested(
        DepositDestinationSchema,
        required=True,
        metadata={"description": "The account's destination when the deposit was detected."},
    )
    route = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"enum": ["direct", "inventory", "routed", "manual", None]},
    )
    credit_tx_hash = ma.fields.String(required=True, allow_none=True)
    failure_reason = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={
            "description": "reorged, below_minimum, below_fee, sandbox_outcome, or ops text."
        },
    )
    review_reason = ma.fields.String(required=True, allow_none=True)
    wait_reason = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={
            "enum": [*states.WAIT_REASONS, None],
            "description": "Why settlement waits; it tries again by itself (null: not waiting).",
        },
    )
    sandbox = ma.fields.Boolean(required=True)
    created_at = Timestamp(required=True)
    updated_at = Timestamp(required=True)
    confirmed_at = Timestamp(required=True, allow_none=True)
    credited_at = Timestamp(required=True, allow_none=True)


class DepositEnvelopeSchema(Schema):
    deposit = ma.fields.Nested(DepositSchema, required=True)


def _float(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


def _int(value: int | None) -> int | None:
    return None if value is None else int(value)


def _time(value: datetime | None) -> str | None:
    return None if value is None else iso_ms(value)


def deposit_document(deposit: Any) -> dict[str, Any]:
    """The deposit object (wire form, camelCase), as the API and events carry it.

    Exactly `DepositSchema().dump(deposit)` (tests/unit/test_deposit_document.py holds
    them equal), built by hand: every deposit event carries one, and the chain watcher
    writes hundreds a block, where marshmallow's dump costs ~15 times more. `deposit`:
    a Deposit, or a row with its columns (the watcher's bulk steps).
    """
    return {
        "id": deposit.id,
        "accountId": deposit.account_id,
        "externalUserId": deposit.external_user_id,
        "status": deposit.status,
        "chainId": int(deposit.chain_id),
        "depositAddress": deposit.deposit_address,
        "asset": deposit.asset,
        "tokenAddress": deposit.token_address,
        "decimals": _int(deposit.decimals),
        "amount": amount_text(deposit),
        "amountRaw": deposit.amount_raw,
        "amountUsd": _float(deposit.amount_usd),
        "settlementGasFeeUsd": _float(deposit.fee_usd),
        "netAmountUsd": _float(deposit.net_usd),
        "sourceTxHash": deposit.source_tx_hash,
        "logIndex": int(deposit.log_index),
        "fromAddress": deposit.from_address,
        "blockNumber": _int(deposit.block_number),
        "blockHash": deposit.block_hash,
        "sourceBlockNumber": _int(deposit.block_number),
        "sourceBlockHash": deposit.block_hash,
        "confirmations": int(deposit.confirmations),
        "requiredConfirmations": int(deposit.required_confirmations),
        "destination": {
            "chainId": int(deposit.dest_chain_id),
            "address": deposit.dest_address,
            "tokenAddress": deposit.dest_token_address,
        },
        "route": deposit.route,
        "creditTxHash": deposit.credit_tx_hash,
        "failureReason": deposit.failure_reason,
        "reviewReason": deposit.review_reason,
        "waitReason": deposit.wait_reason,
        "sandbox": bool(deposit.sandbox),
        "createdAt": _time(deposit.created_at),
        "updatedAt": _time(deposit.updated_at),
        "confirmedAt": _time(deposit.confirmed_at),
        "creditedAt": _time(deposit.credited_at),
    }
