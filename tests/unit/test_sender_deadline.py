"""One deadline per attempt: DNS is inside it, and the lease always outlasts it.

Slow DNS is played by an injected resolver (the blocking `getaddrinfo` the sender
calls); trickling receivers on 127.0.0.1 are in tests/integration/test_hostile_receivers.py.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from services.notifier import sender as sender_module
from services.notifier.config import NotifierConfig
from services.notifier.sender import BLOCKED_ADDRESS, DNS_TIMEOUT, Sender
from shared.settings import SettingsError


class SlowDns:
    """A resolver that answers after `delay_s` (or when released), counting lookups."""

    def __init__(self, delay_s: float, answer: str = "203.0.113.7") -> None:
        self.delay_s = delay_s
        self.answer = answer
        self.calls: list[str] = []
        self.release = threading.Event()

    def __call__(self, host: str, port: int) -> list[Any]:
        self.calls.append(host)
        self.release.wait(self.delay_s)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (self.answer, port))]


def test_a_slow_dns_answer_is_cut_at_the_attempt_deadline() -> None:
    # Given a name whose DNS answer takes 5 s, and a 0.5 s attempt deadline
    dns = SlowDns(5.0)
    sender = Sender(timeout_s=0.5, allow_private=False, resolver=dns)
    try:
        # When a delivery is sent there
        started = time.monotonic()
        result = sender.send("https://slow-dns.example.com/hook", b"{}", {})
        took = time.monotonic() - started
        # Then the attempt ends at its deadline, saying the lookup took too long
        assert result.error == DNS_TIMEOUT and result.status is None
        assert 0.45 <= took < 0.9, f"the attempt took {took:.2f}s"
        assert 450 <= result.latency_ms < 900
    finally:
        dns.release.set()


def test_attempts_waiting_on_one_slow_name_share_one_lookup() -> None:
    # Given a slow name and three attempts to it at once
    dns = SlowDns(5.0)
    sender = Sender(timeout_s=0.4, allow_private=False, resolver=dns)
    results: list[Any] = []
    try:
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    sender.send("https://slow-dns.example.com/hook", b"{}", {})
                )
            )
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(3)
        # Then each is cut at its deadline, and the slow lookup ran once, not three times
        assert [r.error for r in results] == [DNS_TIMEOUT] * 3
        assert dns.calls == ["slow-dns.example.com"]
    finally:
        dns.release.set()


def test_the_injected_resolvers_answer_is_vetted_before_any_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a resolver that answers with the cloud metadata address
    dns = SlowDns(0.0, answer="169.254.169.254")
    connects: list[Any] = []
    monkeypatch.setattr(
        sender_module.socket.socket, "connect", lambda self, addr: connects.append(addr)
    )
    # When a delivery is sent to that name
    result = Sender(timeout_s=1, allow_private=False, resolver=dns).send(
        "https://rebind.example.com/hook", b"{}", {}
    )
    # Then the address is refused and nothing is connected to
    assert result.error == BLOCKED_ADDRESS
    assert connects == []


def test_the_lease_outlasts_the_attempt_deadline() -> None:
    # Given the defaults and a config with a 3 s deadline
    default = NotifierConfig.from_env({})
    short = NotifierConfig.from_env(
        {"SETTLE_WEBHOOK_TIMEOUT_S": "3", "SETTLE_WEBHOOK_LEASE_MARGIN_S": "0.5"}
    )
    # Then the lease is the deadline plus a margin, never the deadline alone
    assert default.lease_s == default.webhook_timeout_s + default.lease_margin_s == 15.0
    assert short.lease_s == 3.5


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SETTLE_WEBHOOK_LEASE_MARGIN_S", "0"),
        ("SETTLE_WEBHOOK_LEASE_MARGIN_S", "0.2"),
        ("SETTLE_WEBHOOK_TIMEOUT_S", "0"),
        ("SETTLE_WEBHOOK_TIMEOUT_S", "-1"),
        ("SETTLE_WEBHOOK_TIMEOUT_S", "nan"),
        ("SETTLE_WEBHOOK_TIMEOUT_S", "inf"),
        ("SETTLE_WEBHOOK_TIMEOUT_S", "301"),
    ],
)
def test_a_lease_that_would_not_outlast_the_deadline_is_refused(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as refused:
        NotifierConfig.from_env({name: value})
    assert str(refused.value).startswith(f"{name} must be")
