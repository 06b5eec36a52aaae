"""The sender's SSRF guard: which resolved addresses a webhook may never reach."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from services.notifier import sender as sender_module
from services.notifier.sender import BLOCKED_ADDRESS, Sender, is_blocked_ip, parse_retry_after

BLOCKED = [
    # IPv4: loopback, private, link-local, CGNAT, this-network, reserved, multicast, broadcast
    "127.0.0.1",
    "127.255.255.254",
    "10.0.0.1",
    "172.16.5.4",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.1.1",
    "100.64.0.1",
    "0.0.0.0",
    "0.1.2.3",
    "240.0.0.1",
    "255.255.255.255",
    "224.0.0.1",
    "239.255.255.250",
    "192.0.0.8",
    "192.0.2.1",  # documentation
    "198.18.0.1",  # benchmarking
    # metadata services
    "169.254.169.254",
    "169.254.170.2",
    "100.100.100.200",
    "fd00:ec2::254",
    # IPv6: loopback, unspecified, unique-local, link-local, multicast, documentation
    "::1",
    "::",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "ff02::1",
    "2001:db8::1",
    # IPv4 hidden in IPv6: mapped, 6to4, NAT64, Teredo
    "::ffff:127.0.0.1",
    "::ffff:10.1.2.3",
    "::ffff:169.254.169.254",
    "2002:7f00:1::",
    "2002:a9fe:a9fe::1",
    "64:ff9b::7f00:1",
    "64:ff9b::a9fe:a9fe",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
]

ALLOWED = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "::ffff:8.8.8.8",
    "2002:808:808::1",
    "64:ff9b::808:808",
]


@pytest.mark.parametrize("address", BLOCKED)
def test_non_public_addresses_are_blocked(address: str) -> None:
    assert is_blocked_ip(address), address


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address: str) -> None:
    assert not is_blocked_ip(address), address


def test_scoped_ipv6_addresses_are_blocked() -> None:
    assert is_blocked_ip("fe80::1%1")
    assert is_blocked_ip("2606:4700:4700::1111%eth0")


def _fake_resolver(answers: list[str]) -> Any:
    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        out = []
        for ip in answers:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            sockaddr = (ip, port, 0, 0) if family == socket.AF_INET6 else (ip, port)
            out.append((family, socket.SOCK_STREAM, 6, "", sockaddr))
        return out

    return getaddrinfo


def test_a_name_resolving_to_a_private_address_is_blocked_before_connecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given DNS that answers a public-looking name with the metadata service's address
    monkeypatch.setattr(sender_module.socket, "getaddrinfo", _fake_resolver(["169.254.169.254"]))
    connects: list[Any] = []
    monkeypatch.setattr(
        sender_module.socket.socket, "connect", lambda self, addr: connects.append(addr)
    )
    # When the production sender is asked to deliver there
    result = Sender(timeout_s=1, allow_private=False).send(
        "https://hooks.example.com/x", b"{}", {"Content-Type": "application/json"}
    )
    # Then no connection is even attempted and the attempt says why
    assert result.error == BLOCKED_ADDRESS and result.status is None
    assert connects == []


def test_only_vetted_addresses_are_connected_to(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a name answering both a loopback and a public address (a rebinding trick)
    monkeypatch.setattr(
        sender_module.socket, "getaddrinfo", _fake_resolver(["127.0.0.1", "203.0.113.7"])
    )
    monkeypatch.setattr(sender_module, "is_blocked_ip", lambda ip: str(ip) == "127.0.0.1")
    connects: list[Any] = []

    def connect(self: socket.socket, addr: Any) -> None:
        connects.append(addr)
        raise ConnectionRefusedError(111, "refused")

    monkeypatch.setattr(sender_module.socket.socket, "connect", connect)
    # When the sender delivers there
    result = Sender(timeout_s=1, allow_private=False).send("https://hooks.example.com/x", b"{}", {})
    # Then it connects only to the public address (refused here), never to loopback
    assert [addr[0] for addr in connects] == ["203.0.113.7"]
    assert result.error == "connection_refused"


def test_plain_http_is_refused_outside_dev() -> None:
    result = Sender(timeout_s=1, allow_private=False).send("http://hooks.example.com/x", b"{}", {})
    assert result.error == "invalid_url"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("120", 120.0), ("0", 0.0), (" 7 ", 7.0), (None, None), ("", None), ("soon", None)],
)
def test_retry_after_seconds(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value) == expected


def test_retry_after_http_date() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    assert parse_retry_after("Thu, 01 Jan 2026 00:01:30 GMT", now) == 90.0
    assert parse_retry_after("Wed, 31 Dec 2025 23:00:00 GMT", now) == 0.0


class _FakeConn:
    def __init__(self) -> None:
        self.closed = False

    def reusable(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


def test_the_pool_of_kept_connections_is_bounded_in_count_and_age() -> None:
    now = [1000.0]
    pool = sender_module._Pool(per_origin=2, total=3, idle_s=30.0, clock=lambda: now[0])
    origins = [sender_module._Origin(True, f"h{i}.example.com", 443) for i in range(3)]
    conns = [_FakeConn() for _ in range(5)]
    # Per origin: a third connection to one origin is closed, not kept
    for conn in conns[:3]:
        pool.give(origins[0], conn)  # type: ignore[arg-type]
    assert pool.idle_count() == 2 and conns[0].closed
    # In all: the least recently used origin's connections go first
    pool.give(origins[1], conns[3])  # type: ignore[arg-type]
    pool.give(origins[2], conns[4])  # type: ignore[arg-type]
    assert pool.idle_count() == 3 and conns[1].closed and not conns[2].closed
    assert pool.take(origins[1]) is conns[3]
    # By age: after 30 s idle, nothing is handed out and everything is closed
    now[0] += 31.0
    assert pool.take(origins[0]) is None
    assert pool.idle_count() == 0 and conns[2].closed and conns[4].closed
