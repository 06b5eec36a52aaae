"""The hand-built deposit document is exactly what DepositSchema dumps (keys, order, values)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from services.core.deposits.models import Deposit
from services.core.deposits.serialize import DepositSchema, deposit_document

T0 = datetime(2026, 11, 21, 4, 11, 28, 123456, tzinfo=UTC)


def deposit(**changes: Any) -> Deposit:
    fields: dict[str, Any] = {
        "id": "dep_01JD3Y9X8M2K4Q7R5T6V8W0Z1A",
        "tenant_id": "00000000-0000-4000-8000-000000000001",
        "account_pk": 7,
        "account_id": "acc_01JD3Y9X8M2K4Q7R5T6V8W0Z1B",
        "external_user_id": "user-42",
        "status": "source_seen",
        "chain_id": 137,
        "deposit_address": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
        "asset": "USDC",
        "token_address": "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359",
        "decimals": 6,
        "amount_raw": "125500000",
        "amount_usd": Decimal("125.500000"),
        "fee_usd": Decimal("0.012345"),
        "net_usd": Decimal("125.487655"),
        "source_tx_hash": "0x" + "ab" * 32,
        "log_index": 3,
        "transfer_seq": 0,
        "from_address": "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
        "block_number": 61_000_000,
        "block_hash": "0x" + "cd" * 32,
        "confirmations": 1,
        "required_confirmations": 64,
        "dest_chain_id": 8453,
        "dest_address": "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB",
        "dest_token_address": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
        "settle_attempts": 0,
        "failed_providers": [],
        "sandbox": False,
        "created_at": T0,
        "updated_at": T0,
    }
    fields.update(changes)
    return Deposit(**fields)


CASES = {
    "seen": deposit(),
    "credited": deposit(
        status="credited",
        route="inventory",
        credit_tx_hash="0x" + "ef" * 32,
        confirmed_at=T0 + timedelta(minutes=2),
        credited_at=T0 + timedelta(minutes=3),
        updated_at=T0 + timedelta(minutes=3),
    ),
    "unsupported token, no price, no block": deposit(
        asset=None,
        decimals=None,
        amount_raw=str(7 * 10**18),
        amount_usd=None,
        net_usd=None,
        from_address=None,
        block_number=None,
        block_hash=None,
        status="manual_review_required",
        review_reason="unsupported_token",
    ),
    "failed sandbox": deposit(
        status="failed", failure_reason="sandbox_outcome", sandbox=True, amount_raw="1"
    ),
    "a uint256": deposit(amount_raw=str(2**256 - 1), decimals=18, amount_usd=Decimal("1E+59")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_document_is_the_schema_dump(name: str) -> None:
    d = CASES[name]
    by_hand = deposit_document(d)
    dumped = DepositSchema().dump(d)
    assert by_hand == dumped
    assert list(by_hand) == list(dumped)
    assert list(by_hand["destination"]) == list(dumped["destination"])
