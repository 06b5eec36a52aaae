"""Ids: ULID-like, Crockford base32, sortable by creation time."""

from __future__ import annotations

import random

import pytest

from shared import ids


def _reference(ms: int, rand: int) -> str:
    """The encoding spelled out digit by digit (time in 10 digits, randomness in 16)."""

    def digits(value: int, length: int) -> str:
        out = []
        for _ in range(length):
            value, rem = divmod(value, 32)
            out.append(ids._ALPHABET[rem])
        return "".join(reversed(out))

    return digits(ms, 10) + digits(rand, 16)


@pytest.mark.parametrize("seed", range(5))
def test_ulid_matches_the_digit_by_digit_encoding(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    for ms, rand in [(0, 0), (2**48 - 1, 2**80 - 1)] + [
        (rng.getrandbits(48), rng.getrandbits(80)) for _ in range(200)
    ]:
        monkeypatch.setattr(ids.secrets, "randbits", lambda bits, r=rand: r)
        assert ids.ulid(ms) == _reference(ms, rand)


def test_ids_sort_by_time_and_use_only_crockford_digits() -> None:
    earlier, later = ids.ulid(1_700_000_000_000), ids.ulid(1_700_000_000_001)
    assert earlier < later and len(earlier) == 26
    made = ids.new_id("acc")
    assert made.startswith("acc_") and set(made[4:]) <= set(ids._ALPHABET)
