"""What an endpoint's eventTypes subscribes to: types, "*" and "<prefix>.*" (no database)."""

from __future__ import annotations

import pytest

from services.notifier import fanout
from shared import events, subscriptions


def test_the_wildcard_covers_every_type_and_any_later_one() -> None:
    assert subscriptions.receives(["*"]) == list(events.EVENT_TYPES)
    assert fanout.subscribes(["*"], "deposit.added_in_a_later_release")


def test_a_prefix_pattern_covers_its_namespace_only() -> None:
    deposit = subscriptions.receives(["deposit.*"])
    assert deposit == [t for t in events.EVENT_TYPES if t.startswith("deposit.")]
    assert "deposit.account.created" in deposit and "webhook.test" not in deposit
    assert fanout.subscribes(["deposit.*"], "deposit.refunded")  # a later deposit type
    # The dot is part of the prefix: `deposit.*` is not `deposits...` nor `deposit` itself
    assert not fanout.subscribes(["deposit.*"], "depositx.credited")
    assert not fanout.subscribes(["deposit.*"], "deposit")
    assert subscriptions.receives(["deposit.account.*"]) == [
        events.ACCOUNT_CREATED,
        events.ACCOUNT_DESTINATION_UPDATED,
    ]


def test_exact_types_still_match_exactly() -> None:
    assert subscriptions.receives(["deposit.credited"]) == ["deposit.credited"]
    assert not fanout.subscribes(["deposit.credited"], "deposit.credited.more")


@pytest.mark.parametrize(
    "entry",
    ["foo.*", "deposit.x*", "deposit.credited.*", "**", ".*", "*.credited", "deposit*", "", 7],
)
def test_unknown_patterns_and_types_are_refused_with_the_valid_ones(entry: object) -> None:
    problem = subscriptions.problem(entry)
    assert problem is not None
    if isinstance(entry, str):
        assert "deposit.*" in problem  # the message shows what is valid


def test_every_pattern_in_the_catalog_is_accepted_and_covers_something() -> None:
    for item in subscriptions.catalog_patterns():
        assert subscriptions.problem(item["pattern"]) is None
        assert item["eventTypes"], item
