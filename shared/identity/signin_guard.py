"""Sign-in that cannot be used as a weapon: failures wait longer each time, hashing is bounded.

A password check is argon2id: ~0.15 s on more than one core (argon2-cffi's lanes run
in threads). Unthrottled, anyone could spend the API's CPU on it: 8 parallel wrong
logins took `GET /v1/chains` from a 10 ms to a 223 ms median (issue 11). Two defences:

**Failure counters** in the rate-limit store (`shared/ratelimit.py`: Redis shared by
every API process with `SETTLE_REDIS_URL`, this process's memory without it). After
its free failures a counter makes each attempt wait 1 s, then 2, 4, 8 ... up to its
cap, counted from the last failure:

| counter | free | cap | stops |
|---|---|---|---|
| (account, client address) | 5 | 15 min | one address guessing one member's password |
| client address | 20 | 15 min | one address trying many accounts (credential stuffing) |
| account | 20 | 60 s | many addresses against one account (not applied at an address |
|  |  |  | the member signed in from within 30 days) |
| account's codes | 5 | 15 min | guessing a second factor: only attempts that carry a code, |
|  |  |  | from anywhere (whoever sends codes has the password already) |

The lockout trade-off (docs/DECISIONS.md): the long waits fall on the pair and the
address, which are the attacker's own; the member elsewhere is not slowed. The
account's own counter, which everyone shares, is capped at 60 s and does not apply
at an address the member recently signed in from, so no attacker can keep a member
out of their usual place, and elsewhere a member waits at most a minute per try.
Unknown emails are counted like known ones (no enumeration).

Each attempt is charged before its password is checked, atomically, so a parallel
burst gets no more tries than a sequential one; a failure restarts the wait when it is
known (a check can take a while under load); a success gives the charge back,
clears its pair and marks its address known. A refused attempt checks no password.

**A bound on hashing**: at most `concurrency` password checks run at once per process
(`SETTLE_SIGNIN_CONCURRENCY`, default 1). When all are busy the next sign-in is
refused at once (503 `service_unavailable`, Retry-After 1) instead of waiting: a
waiting request would hold one of the process's few threads, which is the starvation
this prevents.

The client is `request.remote_addr`, which ProxyFix sets from X-Forwarded-For when
`SETTLE_TRUSTED_PROXIES` says so (as for the rate limits); an IPv6 client counts as
its /64.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from flask import Flask, current_app
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from shared.clients import client_key
from shared.errors import RateLimited, ServiceUnavailable, Unauthorized
from shared.ratelimit import Store, Throttle
from shared.settings import SettingsError, env_int, environ

T = TypeVar("T")

#: app.extensions key of the app's SignInGuard.
EXTENSION = "settle.signin_guard"
#: What became of a sign-in attempt (the metric's `result` label).
OUTCOMES = ("succeeded", "failed", "throttled", "busy")


@dataclass(frozen=True)
class SignInLimits:
    """The failure counters' shape and the bound on concurrent password checks."""

    #: Count failures and make attempts wait (off only for tests that sign in a lot).
    throttle: bool = True
    pair_free: int = 5
    pair_cap_s: float = 15 * 60.0
    client_free: int = 20
    client_cap_s: float = 15 * 60.0
    account_free: int = 20
    account_cap_s: float = 60.0
    #: Attempts with a second-factor code, per account, from any address.
    code_free: int = 5
    code_cap_s: float = 15 * 60.0
    #: The first wait beyond the free failures; each further failure doubles it.
    first_wait_s: float = 1.0
    #: Failures are forgotten this long after the last one.
    forget_after_s: float = 24 * 3600.0
    #: How long an address stays known after a member signed in from it.
    known_for_s: float = 30 * 24 * 3600.0
    #: Password checks at once per process.
    concurrency: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SignInLimits:
        env = environ() if env is None else env
        concurrency = env_int(env, "SETTLE_SIGNIN_CONCURRENCY", 1)
        if concurrency < 1:
            raise SettingsError(f"SETTLE_SIGNIN_CONCURRENCY must be at least 1, got {concurrency}")
        return cls(concurrency=concurrency)


#: No failure counting (hashing stays bounded): what a config built in code gets unless
#: it asks, like the rate limits (tests sign in and fail a lot from one address).
SIGNIN_THROTTLE_OFF = SignInLimits(throttle=False)


def _account(email: str) -> str:
    """The account a sign-in names, as the lookup normalizes it, hashed (no email stored)."""
    return hashlib.sha256(email.strip().lower().encode()).hexdigest()[:32]


class SignInGuard:
    """Wraps a password check in the failure counters and the bound on hashing."""

    def __init__(self, limits: SignInLimits, store: Store) -> None:
        self.limits = limits
        self._store = store
        self._hashing = threading.BoundedSemaphore(limits.concurrency)
        self._outcomes: Counter[str] = Counter()
        self._outcomes_lock = threading.Lock()

    def outcomes(self) -> dict[str, int]:
        """How many attempts ended each way in this process (OUTCOMES)."""
        with self._outcomes_lock:
            return {name: self._outcomes[name] for name in OUTCOMES}

    def _count(self, outcome: str) -> None:
        with self._outcomes_lock:
            self._outcomes[outcome] += 1

    def throttles(self, email: str, client: str, *, second_factor: bool = False) -> list[Throttle]:
        """The counters an attempt at `email` from `client` is charged to (with
        `second_factor`, an attempt carrying a code, also the account's code counter)."""
        limits, account, client = self.limits, _account(email), client_key(client)

        def counter(key: str, free: int, cap_s: float, unless: str | None = None) -> Throttle:
            return Throttle(key, free, limits.first_wait_s, cap_s, limits.forget_after_s, unless)

        codes = (
            [counter(f"signin:code:{account}", limits.code_free, limits.code_cap_s)]
            if second_factor
            else []
        )
        return [
            counter(f"signin:pair:{account}:{client}", limits.pair_free, limits.pair_cap_s),
            # Neither a flood at one address (a NAT or VPN exit others share) nor one at
            # one account keeps a member out of an address it signed in from before.
            counter(
                f"signin:client:{client}",
                limits.client_free,
                limits.client_cap_s,
                unless=self._known(account, client),
            ),
            counter(
                f"signin:account:{account}",
                limits.account_free,
                limits.account_cap_s,
                unless=self._known(account, client),
            ),
            *codes,
        ]

    @staticmethod
    def _known(account: str, client: str) -> str:
        return f"signin:known:{account}:{client}"

    def attempt(
        self, email: str, client: str, check: Callable[[], T], *, second_factor: bool = False
    ) -> T:
        """`check()` (which raises Unauthorized for wrong credentials) if allowed now.

        Raises RateLimited (429) while a counter makes this attempt wait, and
        ServiceUnavailable (503) when the process is checking as many passwords as it may.
        `second_factor`: the attempt carries a code (its own counter applies too). A
        right password that still lacks its code (401 mfa_required) counts as a failure:
        else whoever holds the password could reset the pair's count between guesses.
        """
        throttles = (
            self.throttles(email, client, second_factor=second_factor)
            if self.limits.throttle
            else []
        )
        charged: tuple[str, ...] = ()
        if throttles:
            charge = self._store.charge(throttles)
            if not charge.allowed:
                self._count("throttled")
                wait = max(1, math.ceil(charge.wait_s))
                raise RateLimited(
                    f"too many failed sign-ins; retry in {wait} s",
                    headers={"Retry-After": str(wait)},
                )
            charged = charge.charged
        if not self._hashing.acquire(blocking=False):
            self._count("busy")
            self._store.refund(charged)
            raise ServiceUnavailable(
                "too many sign-ins at once; retry in 1 s", headers={"Retry-After": "1"}
            )
        try:
            result = check()
        except Unauthorized:
            self._count("failed")
            self._store.failed_now(charged)  # it stays counted; the wait starts now
            raise
        except BaseException:
            self._store.refund(charged)  # not the client's failure (a database error)
            raise
        finally:
            self._hashing.release()
        self._count("succeeded")
        if throttles:
            self._succeeded(throttles, charged)
        return result

    def _succeeded(self, throttles: list[Throttle], charged: tuple[str, ...]) -> None:
        pair = throttles[0].key
        # The address and account counters only give this attempt back: a stuffer who
        # holds one valid password must not wipe the failures of the others.
        self._store.refund([key for key in charged if key != pair])
        self._store.forget([pair])
        known = throttles[2].unless
        assert known is not None
        self._store.remember(known, self.limits.known_for_s)


class SignInCollector(Collector):
    """`settle_signin_attempts_total{result}`: this process's sign-ins by outcome."""

    def __init__(self, guard: SignInGuard) -> None:
        self._guard = guard

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "settle_signin_attempts",
            "Sign-in attempts by result: succeeded, failed (wrong credentials), "
            "throttled (429, no password checked), busy (503, no password checked).",
            labels=["result"],
        )
        for name, count in self._guard.outcomes().items():
            family.add_metric([name], count)
        yield family


def install(app: Flask, limits: SignInLimits, store: Store) -> SignInGuard:
    guard = SignInGuard(limits, store)
    app.extensions[EXTENSION] = guard
    return guard


def current_guard() -> SignInGuard:
    guard: SignInGuard = current_app.extensions[EXTENSION]
    return guard
