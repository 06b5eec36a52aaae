"""Which rows the outbox relay's next round reads (services/core/relay.py, RoundScope).

A round of the recent rows must never be the only kind: the whole outbox is read first,
after a failure, while a backlog drains, and at least every FULL_ROUND_S.
"""

from __future__ import annotations

from datetime import timedelta

from services.core.relay import RoundScope
from shared.timefmt import utcnow

BATCH = 500


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scope(clock: Clock) -> RoundScope:
    return RoundScope(full_every_s=1.0, recent_s=60.0, clock=clock)


def test_the_first_round_reads_the_whole_outbox() -> None:
    assert scope(Clock()).since() is None


def test_after_a_drained_whole_round_the_next_rounds_read_the_recent_rows() -> None:
    clock = Clock()
    rounds = scope(clock)
    rounds.ran(None, 3, BATCH)
    clock.now += 0.5
    since = rounds.since()
    assert since is not None
    assert abs((utcnow() - since) - timedelta(seconds=60)) < timedelta(seconds=1)
    # a recent round, however it went, does not postpone the next whole one
    rounds.ran(since, BATCH, BATCH)
    clock.now += 0.5
    assert rounds.since() is None


def test_a_whole_round_that_filled_its_batch_is_followed_by_another() -> None:
    clock = Clock()
    rounds = scope(clock)
    rounds.ran(None, BATCH, BATCH)
    clock.now += 0.01
    assert rounds.since() is None  # a backlog drains oldest first
    rounds.ran(None, BATCH - 1, BATCH)
    assert rounds.since() is not None


def test_after_a_failure_the_whole_outbox_is_read_until_it_is_drained() -> None:
    clock = Clock()
    rounds = scope(clock)
    rounds.ran(None, 0, BATCH)
    assert rounds.since() is not None
    rounds.failed()
    assert rounds.since() is None
    clock.now += 0.01
    assert rounds.since() is None
    rounds.ran(None, 0, BATCH)
    assert rounds.since() is not None


def test_a_recent_round_that_found_nothing_is_followed_by_a_whole_one() -> None:
    clock = Clock()
    rounds = scope(clock)
    rounds.ran(None, 1, BATCH)
    since = rounds.since()
    assert since is not None and not rounds.whole_round_next
    rounds.ran(since, 2, BATCH)  # it published: nothing owed
    assert not rounds.whole_round_next and rounds.since() is not None
    # one that found none: what woke the relay may be older than the recent read
    rounds.ran(since, 0, BATCH)
    assert rounds.whole_round_next and rounds.since() is None
    rounds.ran(None, 0, BATCH)
    assert not rounds.whole_round_next and rounds.since() is not None
