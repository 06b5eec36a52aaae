"""Fan-out's and the delivery log's rules, as `settle reconcile` applies them (no database)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from services.notifier import deliveries, fanout

EVENT_AT = datetime(2026, 11, 24, 1, 0, tzinfo=UTC)
MS = timedelta(milliseconds=1)


def _endpoint(types: tuple[str, ...], created: datetime, updated: datetime) -> fanout.Receiver:
    return fanout.Receiver("we_1", "t_1", frozenset(types), created, updated)


def test_an_endpoint_subscribed_before_the_event_and_unchanged_must_receive_it() -> None:
    before = EVENT_AT - MS
    assert fanout.must_receive(
        _endpoint(("deposit.credited",), before, before), "deposit.credited", EVENT_AT
    )


def test_other_types_and_endpoints_made_at_or_after_the_event_need_not() -> None:
    before = EVENT_AT - MS
    assert (
        fanout.must_receive(
            _endpoint(("deposit.failed",), before, before), "deposit.credited", EVENT_AT
        )
        is False
    )
    made_then = _endpoint(("deposit.credited",), EVENT_AT, EVENT_AT)
    assert fanout.must_receive(made_then, "deposit.credited", EVENT_AT) is False


def test_an_endpoint_changed_at_or_after_the_event_cannot_be_judged() -> None:
    changed = _endpoint(("deposit.credited",), EVENT_AT - MS, EVENT_AT)
    assert fanout.must_receive(changed, "deposit.credited", EVENT_AT) is None


def test_subscription_is_by_exact_type() -> None:
    assert fanout.subscribes(["deposit.credited"], "deposit.credited")
    assert not fanout.subscribes(["deposit.credited"], "deposit.credit")
    assert not fanout.subscribes(None, "deposit.credited")


@dataclass
class _Delivery:
    id: str
    status: str
    replay_of: str | None
    created_at: datetime


def test_two_originals_of_a_pair_are_duplicates_replays_are_not() -> None:
    first = _Delivery("whd_1", "succeeded", None, EVENT_AT)
    replay = _Delivery("whd_2", "pending", "whd_1", EVENT_AT + MS)
    assert deliveries.duplicate_originals([first, replay]) == []
    second = _Delivery("whd_0", "pending", None, EVENT_AT + MS)
    assert deliveries.duplicate_originals([first, replay, second]) == ["whd_0", "whd_1"]


def test_a_pair_is_undelivered_when_nothing_succeeded_and_its_latest_is_settled() -> None:
    failed = _Delivery("whd_1", "failed", None, EVENT_AT)
    retrying = _Delivery("whd_2", "retrying", "whd_1", EVENT_AT + MS)
    assert deliveries.undelivered([failed, retrying], EVENT_AT + 2 * MS) is retrying
    # still within its settle time
    assert deliveries.undelivered([failed, retrying], EVENT_AT + MS) is None
    # a success anywhere in the pair settles it
    done = _Delivery("whd_3", "succeeded", "whd_1", EVENT_AT)
    assert deliveries.undelivered([failed, retrying, done], EVENT_AT + 2 * MS) is None
