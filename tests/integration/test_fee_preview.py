"""POST /v1/fee-preview on real PostgreSQL: quotes use the stored live fee."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from flask.testing import FlaskClient

from services.core.context import CoreContext
from services.core.fees import fee_for, refresh_fees
from services.core.models import ChainFee
from tests.conftest import TenantKeys
from tests.integration.conftest import NOT_ACTIVE_CHAINS, assert_error

pytestmark = pytest.mark.integration

PATH = "/v1/fee-preview"
QUOTE_FIELDS = [
    "chainId",
    "asset",
    "tokenAddress",
    "amount",
    "amountUsd",
    "settlementGasFeeUsd",
    "netAmountUsd",
    "minDepositUsd",
    "belowMinimum",
]


def _stored_fee(core_context: CoreContext, chain_id: int) -> float:
    chain = core_context.registry.get(chain_id)
    assert chain is not None
    with core_context.db.reader() as session:
        return float(fee_for(session, chain))


def _quotes(client: FlaskClient, tenant: TenantKeys, **body: Any) -> list[dict[str, Any]]:
    response = client.post(PATH, json=body, headers=tenant.headers)
    assert response.status_code == 200, response.get_json()
    quotes: list[dict[str, Any]] = response.get_json()["quotes"]
    return quotes


@pytest.fixture
def polygon_fee(core_context: CoreContext) -> Iterator[Decimal]:
    """Polygon's stored live fee set to a value no formula gives; restored afterwards."""
    db = core_context.db
    with db.reader() as session:
        missing = session.get(ChainFee, 137) is None
    if missing:
        refresh_fees(db, core_context.registry)
    marker = Decimal("0.123457")
    with db.transaction() as session:
        row = session.get(ChainFee, 137)
        assert row is not None
        before, row.settlement_fee_usd = row.settlement_fee_usd, marker
    try:
        yield marker
    finally:
        with db.transaction() as session:
            row = session.get(ChainFee, 137)
            assert row is not None
            row.settlement_fee_usd = before


def test_every_active_chain_and_asset_is_quoted(
    client: FlaskClient, tenant: TenantKeys, core_context: CoreContext
) -> None:
    # When an amount is previewed without filters
    quotes = _quotes(client, tenant, amount="125.50")

    # Then there is one quote per active chain and asset, in chains-file order
    expected = [
        (chain.chain_id, asset.symbol, asset.token_address)
        for chain in core_context.registry.active()
        for asset in chain.assets
    ]
    assert [(q["chainId"], q["asset"], q["tokenAddress"]) for q in quotes] == expected
    assert 42161 not in {q["chainId"] for q in quotes}
    for q in quotes:
        assert list(q) == QUOTE_FIELDS
        chain = core_context.registry.get(q["chainId"])
        assert chain is not None and chain.min_deposit_usd is not None
        # Stablecoins at 1 USD; the stored live fee; the net is what is left
        assert q["amount"] == "125.50" and q["amountUsd"] == 125.5
        assert q["settlementGasFeeUsd"] == _stored_fee(core_context, q["chainId"])
        assert q["netAmountUsd"] == pytest.approx(125.5 - q["settlementGasFeeUsd"], abs=1e-6)
        assert q["minDepositUsd"] == float(chain.min_deposit_usd)
        assert q["belowMinimum"] is False


def test_the_fee_is_the_stored_live_value(
    client: FlaskClient, tenant: TenantKeys, polygon_fee: Decimal
) -> None:
    # Given Polygon's stored fee was changed (as the fee oracle would)
    # When Polygon USDC is previewed, then the quote carries exactly the stored value
    (quote,) = _quotes(client, tenant, chainId=137, asset="USDC", amount="10")
    assert quote["settlementGasFeeUsd"] == float(polygon_fee)
    assert quote["netAmountUsd"] == pytest.approx(10 - float(polygon_fee), abs=1e-6)


def test_filters_dust_and_a_net_floored_at_zero(
    client: FlaskClient, tenant: TenantKeys, core_context: CoreContext
) -> None:
    # An asset alone is quoted on every active chain that has it, case-insensitively
    assert [
        (q["chainId"], q["asset"]) for q in _quotes(client, tenant, asset="dai", amount="5")
    ] == [
        (1, "DAI"),
        (8453, "DAI"),
    ]
    # A chain alone quotes all its assets
    assert [q["asset"] for q in _quotes(client, tenant, chainId=8453, amount="5")] == [
        "USDC",
        "DAI",
    ]
    # Null filters mean no filter
    assert len(_quotes(client, tenant, chainId=None, asset=None, amount="5")) == len(
        _quotes(client, tenant, amount="5")
    )

    # Below Ethereum's floor is dust; a fee above the amount nets 0, never negative
    fee = _stored_fee(core_context, 1)
    small = f"{fee / 2:.6f}"
    (quote,) = _quotes(client, tenant, chainId=1, asset="USDC", amount=small)
    assert quote["belowMinimum"] is True
    assert quote["netAmountUsd"] == 0
    # And 18-decimal DAI takes amounts finer than USDC's 6 decimals
    (dai,) = _quotes(client, tenant, chainId=8453, asset="DAI", amount="1.000000000000000001")
    assert dai["amount"] == "1.000000000000000001"


@pytest.mark.parametrize("chain_id", NOT_ACTIVE_CHAINS)
def test_chains_that_are_not_active_are_unsupported(
    client: FlaskClient, tenant: TenantKeys, chain_id: int
) -> None:
    for body in (
        {"chainId": chain_id, "amount": "10"},
        {"chainId": chain_id, "asset": "USDC", "amount": "10"},
    ):
        assert_error(client.post(PATH, json=body, headers=tenant.headers), 400, "unsupported_chain")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"chainId": 8453, "asset": "USDT", "amount": "10"}, "asset"),
        ({"asset": "WETH", "amount": "10"}, "asset"),
        ({"asset": "", "amount": "10"}, "asset"),
        ({"chainId": 1, "asset": "USDC", "amount": "1.1234567"}, "amount"),
        ({"amount": "1.1234567"}, "amount"),
        ({"amount": "0"}, "amount"),
        ({"amount": "0.000"}, "amount"),
        ({"amount": "-1"}, "amount"),
        ({"amount": "1e3"}, "amount"),
        ({"amount": ".5"}, "amount"),
        ({"amount": " 5"}, "amount"),
        ({"amount": "abc"}, "amount"),
        ({"amount": "1" * 31}, "amount"),
        ({"amount": 125.5}, "amount"),
        ({"amount": None}, "amount"),
        ({}, "amount"),
        ({"chainId": "1", "amount": "5"}, "chainId"),
        ({"chainId": True, "amount": "5"}, "chainId"),
        ({"chainId": 1.5, "amount": "5"}, "chainId"),
        ({"amount": "5", "extra": 1}, "extra"),
    ],
)
def test_bad_requests_name_the_field(
    client: FlaskClient, tenant: TenantKeys, body: dict[str, Any], field: str
) -> None:
    error = assert_error(
        client.post(PATH, json=body, headers=tenant.headers), 400, "invalid_request"
    )
    assert field in error["details"]["fields"], error


def test_scope(client: FlaskClient, tenant: TenantKeys) -> None:
    body = {"amount": "10"}
    assert_error(client.post(PATH, json=body), 401, "unauthorized")
    assert_error(
        client.post(PATH, json=body, headers=tenant.key_with("deposit_accounts:read")),
        403,
        "insufficient_scope",
    )
    assert client.post(PATH, json=body, headers=tenant.key_with("fees:read")).status_code == 200
