"""The sign-in guard's counters on the in-memory store (no I/O, a fake clock)."""

from __future__ import annotations

import pytest

from shared.errors import RateLimited, Unauthorized
from shared.identity.signin_guard import SignInGuard, SignInLimits
from shared.ratelimit import MemoryStore


def _wrong() -> str:
    raise Unauthorized("wrong email or password")


def test_neighbours_failing_at_a_members_usual_address_do_not_lock_the_member_out() -> None:
    # Given a member who signs in from an office address (a NAT others share)
    now = [1000.0]
    guard = SignInGuard(SignInLimits(), MemoryStore(clock=lambda: now[0]))
    office = "203.0.113.7"
    assert guard.attempt("member@corp.example", office, lambda: "session") == "session"
    now[0] += 3600
    # When others at that address fail with other emails until the address must wait
    failures, refused = 0, 0
    while failures < 31:
        try:
            guard.attempt(f"x{failures}@other.example", office, _wrong)
        except Unauthorized:
            failures += 1
        except RateLimited as err:
            refused += 1
            now[0] += int(err.headers["Retry-After"])
            continue
        now[0] += 0.1
    assert refused > 0  # the address's counter did make them wait
    with pytest.raises(RateLimited):
        guard.attempt("stranger@other.example", office, _wrong)
    # Then the member, with the right password at the usual address, signs in at once
    assert guard.attempt("member@corp.example", office, lambda: "session") == "session"
