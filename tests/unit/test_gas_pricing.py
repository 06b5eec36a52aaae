"""`gas_pricing`: what a payment offers per gas, first, as a replacement, as a cancel (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from services.core.deposits import gas_pricing
from services.core.deposits.gas_pricing import Stall, cancel_fees, reprice, within_cap
from services.core.deposits.settings import ALL_CHAINS, PipelineSettings, parse_fee_caps
from tests.support.deposits import small_registry

GWEI = 10**9


@dataclass(frozen=True)
class Market:
    fees: dict[str, int]
    base_fee: int | None


def market(base_gwei: int, tip_gwei: int = 1) -> Market:
    tip = tip_gwei * GWEI
    return Market(
        {"type": 2, "maxFeePerGas": 2 * base_gwei * GWEI + tip, "maxPriorityFeePerGas": tip},
        base_gwei * GWEI,
    )


def tx(max_gwei: float, tip_gwei: float = 1) -> dict[str, int]:
    return {
        "to": 1,
        "type": 2,
        "maxFeePerGas": int(max_gwei * GWEI),
        "maxPriorityFeePerGas": int(tip_gwei * GWEI),
    }


def test_a_replacement_in_a_market_that_did_not_move_is_not_made() -> None:
    # 11 bumps of +12.5 % on its own price is 3.65x; here: none at all
    assert reprice(tx(21), market(10), None, 0, 5) is None
    assert reprice(tx(21), market(8), None, 0, 5) is None


def test_a_replacement_asks_what_the_market_asks_and_at_least_the_nodes_bump() -> None:
    new = reprice(tx(21), market(30), None, 0, 5)
    assert isinstance(new, dict)
    assert new["maxFeePerGas"] == 61 * GWEI  # the market's, not 21 x 1.125
    assert new["maxPriorityFeePerGas"] == 1_125_000_000  # the tip must rise 12.5 % too
    # a market only a little above: the node's least bump wins
    little = reprice(tx(21), market(10, tip_gwei=2), None, 0, 5)
    assert isinstance(little, dict) and little["maxFeePerGas"] == int(21 * 1.125 * GWEI)


def test_the_cap_holds_a_replacement_back_or_caps_what_is_still_mineable() -> None:
    # the cap still pays the base fee and the tip: offered at the cap
    capped = reprice(tx(21), market(30), 40 * GWEI, 0, 5)
    assert isinstance(capped, dict) and capped["maxFeePerGas"] == 40 * GWEI
    # under the base fee: it waits
    stalled = reprice(tx(21), market(45), 40 * GWEI, 0, 5)
    assert isinstance(stalled, Stall) and stalled.reason == gas_pricing.STALLED_FEE_CAP
    # under what a node takes as a replacement: it waits
    assert isinstance(reprice(tx(38), market(30), 40 * GWEI, 0, 5), Stall)


def test_the_most_replacements_hold_the_next_back() -> None:
    stalled = reprice(tx(21), market(30), None, 5, 5)
    assert isinstance(stalled, Stall) and stalled.reason == gas_pricing.STALLED_MAX_REPLACEMENTS


def test_a_first_payout_is_held_to_the_cap() -> None:
    fees = market(30).fees
    assert within_cap(fees, 30 * GWEI, None) == fees
    assert within_cap(fees, 30 * GWEI, 40 * GWEI) == {**fees, "maxFeePerGas": 40 * GWEI}
    assert within_cap(fees, 30 * GWEI, 30 * GWEI) is None  # not even the base fee and tip
    legacy = {"gasPrice": 50 * GWEI}
    assert within_cap(legacy, None, 40 * GWEI) is None


def test_a_cancel_outbids_the_payment_it_replaces_at_least_by_the_bump() -> None:
    fees = cancel_fees(tx(21), market(5))
    assert fees["maxFeePerGas"] == int(21 * 1.125 * GWEI)
    assert fees["maxPriorityFeePerGas"] == int(1.125 * GWEI)
    assert cancel_fees(tx(21), market(30))["maxFeePerGas"] == 61 * GWEI


def test_the_cap_comes_from_the_setting_then_the_chains_file() -> None:
    assert parse_fee_caps("") == {}
    assert parse_fee_caps("200") == {ALL_CHAINS: Decimal(200)}
    assert parse_fee_caps("1=200, 137=3000") == {1: Decimal(200), 137: Decimal(3000)}
    chain = small_registry(chain_id=77).get(77)
    assert chain is not None and chain.payment_max_fee_gwei is None
    assert PipelineSettings().fee_cap_gwei(chain) is None
    filed = small_registry(chain_id=77, fee_cap_gwei=9).get(77)
    assert PipelineSettings().fee_cap_gwei(filed) == Decimal(9)
    every = PipelineSettings(payment_max_fee_gwei={ALL_CHAINS: Decimal(50)})
    assert every.fee_cap_gwei(filed) == Decimal(50)
    own = PipelineSettings(payment_max_fee_gwei={ALL_CHAINS: Decimal(50), 77: Decimal(7)})
    assert own.fee_cap_gwei(filed) == Decimal(7)
