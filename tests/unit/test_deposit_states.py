"""The deposit state machine and the pure helpers around it (no I/O)."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest

from services.core.amounts import format_amount, token_units
from services.core.deposits import states
from services.core.deposits.pricing import StaticPrices, amount_usd, token_amount
from services.core.deposits.settings import PipelineSettings, parse_inventory, parse_prices
from shared import events
from shared.settings import SettingsError

HAPPY_PATH = [
    states.SOURCE_SEEN,
    states.SOURCE_CONFIRMED,
    states.CREDIT_SUBMITTED,
    states.CREDITED,
]


def test_happy_path_moves_forward_one_step_at_a_time() -> None:
    # Given the lifecycle order, when each status moves to the next, then it is legal.
    for current, target in itertools.pairwise(HAPPY_PATH):
        assert states.transition(current, target) == target


def test_credit_submitted_is_optional() -> None:
    # Inventory and direct routes credit at once from source_confirmed.
    assert states.can_transition(states.SOURCE_CONFIRMED, states.CREDITED)


@pytest.mark.parametrize(
    "status", [states.SOURCE_SEEN, states.SOURCE_CONFIRMED, states.CREDIT_SUBMITTED]
)
def test_failed_and_manual_review_from_any_non_final_state(status: str) -> None:
    assert states.can_transition(status, states.FAILED)
    assert states.can_transition(status, states.MANUAL_REVIEW_REQUIRED)


def test_manual_review_ends_in_credited_or_failed_or_goes_back_to_settlement() -> None:
    assert states.can_transition(states.MANUAL_REVIEW_REQUIRED, states.CREDITED)
    assert states.can_transition(states.MANUAL_REVIEW_REQUIRED, states.FAILED)
    # (ops: `settle deposits retry`, a silent move: its durable event went out before)
    assert states.can_transition(states.MANUAL_REVIEW_REQUIRED, states.SOURCE_CONFIRMED)
    assert states.SILENT == {states.MANUAL_REVIEW_REQUIRED: states.SOURCE_CONFIRMED}
    for target in (states.SOURCE_SEEN, states.CREDIT_SUBMITTED):
        assert not states.can_transition(states.MANUAL_REVIEW_REQUIRED, target)


def test_a_retried_deposits_events_are_a_sound_path() -> None:
    # Back in settlement after review, no event: its events end at review for now
    retried = [states.SOURCE_SEEN, states.SOURCE_CONFIRMED, states.MANUAL_REVIEW_REQUIRED]
    assert states.path_problem(states.SOURCE_CONFIRMED, retried) is None
    # then credited, or in review again (a fresh manual_review_required event)
    again = [*retried, states.MANUAL_REVIEW_REQUIRED]
    assert states.path_problem(states.MANUAL_REVIEW_REQUIRED, again) is None
    assert states.path_problem(states.CREDITED, [*again, states.CREDITED]) is None
    # while a deposit never in review cannot end at source_confirmed after review
    assert states.path_problem(states.SOURCE_SEEN, retried) is not None


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (states.SOURCE_SEEN, states.CREDITED),  # nothing is credited unconfirmed
        (states.SOURCE_SEEN, states.CREDIT_SUBMITTED),
        (states.SOURCE_CONFIRMED, states.SOURCE_SEEN),
        (states.CREDITED, states.FAILED),
        (states.FAILED, states.CREDITED),
        (states.CREDITED, states.MANUAL_REVIEW_REQUIRED),
        (states.SOURCE_SEEN, states.SOURCE_SEEN),
        (states.SOURCE_SEEN, "refunded"),
    ],
)
def test_illegal_transitions_raise_a_domain_error(current: str, target: str) -> None:
    with pytest.raises(states.IllegalTransition) as err:
        states.transition(current, target)
    assert isinstance(err.value, states.DepositStateError)
    assert current in str(err.value) and target in str(err.value)


def test_final_states_have_no_way_out() -> None:
    for final in states.FINAL:
        assert all(not states.can_transition(final, s) for s in states.STATUSES)


def test_durable_statuses_get_their_fixed_event_id_and_others_a_fresh_one() -> None:
    assert states.event_id("dep_X", "credited") == "evt_dep_dep_X_credited"
    assert states.event_id("dep_X", "source_seen") == "evt_dep_dep_X_source_seen"
    first = states.event_id("dep_X", states.CREDIT_SUBMITTED)
    second = states.event_id("dep_X", states.CREDIT_SUBMITTED)
    assert first.startswith("evt_") and first != second
    assert states.event_id("dep_X", states.MANUAL_REVIEW_REQUIRED).startswith("evt_")
    assert set(states.EVENT_TYPES) == set(states.STATUSES)


@pytest.mark.parametrize(
    ("raw", "decimals", "text"),
    [
        (125_500_000, 6, "125.50"),
        (125_000_000, 6, "125.00"),
        (1, 6, "0.000001"),
        (0, 6, "0.00"),
        (10**18, 18, "1.00"),
        (123_456_789_012_345_678, 18, "0.123456789012345678"),
        (10**30, 6, "1000000000000000000000000.00"),
    ],
)
def test_amounts_are_exact_decimal_strings(raw: int, decimals: int, text: str) -> None:
    assert format_amount(token_units(raw, decimals)) == text


def test_stablecoins_are_worth_one_dollar_and_others_are_configurable() -> None:
    prices = StaticPrices(parse_prices("WETH=3000.5,USDT=0.999"))
    assert prices.usd_price(1, "USDC") == Decimal(1)
    assert prices.usd_price(1, "USDT") == Decimal("0.999")
    assert prices.usd_price(1, "WETH") == Decimal("3000.5")
    assert prices.usd_price(1, "SHIB") is None
    assert amount_usd(Decimal("125.50"), Decimal(1)) == Decimal("125.500000")
    assert amount_usd(Decimal("0.0000019"), Decimal(1)) == Decimal("0.000001")  # rounds down
    assert amount_usd(Decimal("1"), None) is None


def test_token_amount_rounds_down_to_the_tokens_decimals() -> None:
    assert token_amount(Decimal("99.1234567"), Decimal(1), 6) == Decimal("99.123456")
    assert token_amount(Decimal("10"), Decimal("2"), 0) == Decimal(5)


def test_settings_parse_with_defaults_and_reject_nonsense() -> None:
    defaults = PipelineSettings.from_env({})
    assert defaults.sandbox_block_s == 0.05 and defaults.simulated_settlement
    assert not PipelineSettings.from_env({"SETTLE_ENV": "production"}).simulated_settlement
    seeds = parse_inventory("8453:USDC=250000@10000, 1:USDT=500")
    assert [(s.chain_id, s.asset, s.balance, s.low_threshold) for s in seeds] == [
        (8453, "USDC", Decimal(250000), Decimal(10000)),
        (1, "USDT", Decimal(500), Decimal(50)),
    ]
    with pytest.raises(SettingsError):
        parse_inventory("USDC=5")
    with pytest.raises(SettingsError):
        parse_prices("WETH")
    with pytest.raises(SettingsError):
        PipelineSettings.from_env({"SETTLE_SANDBOX_BLOCK_S": "-1"})


def test_a_sound_path_has_no_problem() -> None:
    path = [states.SOURCE_SEEN, states.SOURCE_CONFIRMED, states.CREDITED]
    assert states.path_problem(states.CREDITED, path) is None


def test_each_broken_path_says_what_is_wrong() -> None:
    assert states.path_problem(states.CREDITED, []) == (
        "status credited but no lifecycle event at all"
    )
    skipped = states.path_problem(states.CREDITED, [states.SOURCE_SEEN, states.CREDITED])
    assert skipped is not None and "source_seen -> credited is not a lifecycle step" in skipped
    late = states.path_problem(states.FAILED, [states.SOURCE_SEEN])
    assert late is not None and "latest event says source_seen" in late
    headless = states.path_problem(states.CREDITED, [states.SOURCE_CONFIRMED, states.CREDITED])
    assert headless is not None and "not source_seen" in headless


def test_durable_ids_name_their_deposit_and_nothing_else_does() -> None:
    event_id = events.durable_event_id("dep_01ABC", states.CREDITED)
    assert events.deposit_of_durable_id(event_id, states.CREDITED) == "dep_01ABC"
    assert events.deposit_of_durable_id(event_id, states.FAILED) is None
    assert events.deposit_of_durable_id("evt_01XYZ", states.CREDITED) is None
    assert events.deposit_of_body('{"data": {"deposit": {"id": "dep_1"}}}') == "dep_1"
    assert events.deposit_of_body('{"data": {"account": {"id": "acc_1"}}}') is None
    assert events.deposit_of_body("not json") is None
