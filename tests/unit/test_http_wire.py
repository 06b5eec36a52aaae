"""The webhook sender's HTTP/1.1 wire (h11): the request bytes, and how answers are framed
(which connection may carry the next request, what is kept, what is not HTTP)."""

from __future__ import annotations

import http.client
import socket
import threading

import h11
import pytest

from services.notifier.http_wire import MAX_HEAD, Answer, exchange, host_header, post

KEEP = 16
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def _answer(raw: bytes, *, then_close: bool = True) -> Answer:
    """exchange() against a peer that reads the request and writes `raw`."""
    ours, theirs = socket.socketpair()

    def peer() -> None:
        theirs.recv(65536)
        theirs.sendall(raw)
        if then_close:
            theirs.close()

    thread = threading.Thread(target=peer)
    thread.start()
    ours.settimeout(5)
    try:
        return exchange(ours, post("h", "/", {}, b""), KEEP)
    finally:
        thread.join(5)
        ours.close()
        if not then_close:
            theirs.close()


def test_the_request_is_one_head_then_the_body() -> None:
    ours, theirs = socket.socketpair()
    request = post("example.com:8443", "/hook?x=1", {"A": "1", "B": "two"}, b"hello")

    def send() -> None:
        with pytest.raises(http.client.RemoteDisconnected):  # the peer answers nothing
            exchange(ours, request, KEEP)

    thread = threading.Thread(target=send)
    ours.settimeout(5)
    thread.start()
    theirs.settimeout(5)
    sent = theirs.recv(65536)
    theirs.close()
    thread.join(5)
    ours.close()
    assert sent == (
        b"POST /hook?x=1 HTTP/1.1\r\nHost: example.com:8443\r\nA: 1\r\nB: two\r\n"
        b"Content-Length: 5\r\n\r\nhello"
    )


@pytest.mark.parametrize("target", ["/a b", "/a\r\nX: y", "/\x00", "/\x7f"])
def test_a_target_that_could_split_the_request_is_refused(target: str) -> None:
    with pytest.raises(ValueError):
        post("h", target, {}, b"")


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\rb"])
def test_a_header_with_a_line_break_is_refused(value: str) -> None:
    with pytest.raises(ValueError):
        post("h", "/", {"X": value}, b"")


def test_host_header_brackets_ipv6_and_drops_default_ports() -> None:
    assert host_header("example.com", 443, https=True) == "example.com"
    assert host_header("example.com", 80, https=False) == "example.com"
    assert host_header("example.com", 80, https=True) == "example.com:80"
    assert host_header("::1", 8080, https=False) == "[::1]:8080"


def test_a_short_body_with_its_length_is_kept_and_the_connection_reusable() -> None:
    answer = _answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", then_close=False)
    assert (answer.status, answer.body_prefix, answer.reusable) == (200, b"ok", True)


def test_a_body_longer_than_kept_is_cut_and_the_connection_dropped() -> None:
    answer = _answer(b"HTTP/1.1 500 X\r\nContent-Length: 40\r\n\r\n" + b"x" * 40)
    assert (answer.status, answer.body_prefix, answer.reusable) == (500, b"x" * KEEP, False)


def test_a_body_until_close_is_never_reusable() -> None:
    answer = _answer(b"HTTP/1.1 200 OK\r\n\r\nhello")
    assert (answer.body_prefix, answer.reusable) == (b"hello", False)


def test_chunked_bodies_within_and_beyond_what_is_kept() -> None:
    whole = _answer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n"
        b"Trailer: t\r\n\r\n",
        then_close=False,
    )
    assert (whole.body_prefix, whole.reusable) == (b"abcde", True)
    cut = _answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n14\r\n" + b"y" * 20)
    assert (cut.body_prefix, cut.reusable) == (b"y" * KEEP, False)


def test_no_body_statuses_and_a_skipped_100_continue() -> None:
    answer = _answer(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n", then_close=False
    )
    assert (answer.status, answer.body_prefix, answer.reusable) == (204, b"", True)
    assert answer.headers["x-a"] == "1"


def test_interim_answers_are_skipped_and_a_protocol_switch_nobody_asked_for_is_refused() -> None:
    hints = _answer(
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        then_close=False,
    )
    assert (hints.status, hints.body_prefix, hints.reusable) == (200, b"ok", True)
    with pytest.raises(h11.RemoteProtocolError):
        _answer(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n")


def test_two_different_lengths_are_not_an_answer() -> None:
    # RFC 9112 6.3: the framing is invalid; the answer is discarded, the connection closed.
    with pytest.raises(h11.RemoteProtocolError):
        _answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nok")


def test_a_receiver_asking_to_close_gets_its_connection_closed() -> None:
    answer = _answer(b"HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n")
    assert answer.reusable is False
    old = _answer(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert old.reusable is False
    # h11 keeps no HTTP/1.0 connection, even one that asks to be kept alive.
    kept = _answer(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
    assert kept.reusable is False


def test_headers_are_read_case_blind_first_value_kept_folded_lines_joined() -> None:
    answer = _answer(
        b"HTTP/1.1 429 Slow\r\nRetry-After: 7\r\nretry-after: 9\r\nX-Long: a\r\n b\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    assert answer.headers["retry-after"] == "7"
    assert answer.headers["x-long"] == "a b"


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"", http.client.RemoteDisconnected),
        (b"SMTP ready\r\n\r\n", h11.RemoteProtocolError),
        (b"HTTP/1.1 20 OK\r\n\r\n", h11.RemoteProtocolError),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", h11.RemoteProtocolError),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_HEAD // 2) + b"\r\n", h11.RemoteProtocolError),
        (b"HTTP/1.1 200 " + b"x" * (3 * MAX_HEAD) + b"\r\n\r\n", h11.RemoteProtocolError),
        (CHUNKED + b"zz\r\n", h11.RemoteProtocolError),
        # int() would take these; read(-1) would then read until the receiver stops.
        (CHUNKED + b"-1\r\n" + b"x" * 100, h11.RemoteProtocolError),
        (CHUNKED + b"+5\r\nhello\r\n0\r\n\r\n", h11.RemoteProtocolError),
        ("HTTP/1.1 2\u00b20 OK\r\n\r\n".encode("utf-8"), h11.RemoteProtocolError),
        (b"HTTP/1.1 103 Hint\r\n\r\n" * 17, h11.RemoteProtocolError),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            h11.RemoteProtocolError,
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", h11.RemoteProtocolError),
    ],
)
def test_answers_that_are_not_http_raise(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        _answer(raw)
