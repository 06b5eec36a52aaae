"""A trickle of request bodies does not take the API down (issue 23).

The attack: 40 anonymous clients each send `POST /v1/sessions` headers and then one
body byte every 20 s (about 2 bytes/s in all). With the ingress streaming bodies
(`proxy_request_buffering off`), each such request held one of the API process's few
threads, and `GET /v1/chains` got 0 answers of 6. Here the real nginx (the deploy
template) runs in front of a real `settle core api` (gunicorn, one worker of two
threads: the smallest there is), and while the 40 trickle (dropped ones reconnect, as
an attacker would), `GET /v1/chains` through the ingress answers within 1 s, every
time. Bounded: about 16 s of observation.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.e2e.test_ingress import Ingress, require_nginx, running_ingress
from tests.support.pipeline import isolated_database
from tests.support.processes import Api, SettleProcesses, start_api

pytestmark = pytest.mark.e2e

TRICKLERS = 40
#: One body byte per this many seconds (the report's rate).
BYTE_EVERY_S = 20.0
OBSERVE_S = 16.0
#: The bound each GET /v1/chains must answer within.
ANSWER_WITHIN_S = 1.0
HEAD = (
    b"POST /v1/sessions HTTP/1.1\r\nHost: settle.test\r\nContent-Type: application/json\r\n"
    b"Content-Length: 4096\r\n\r\n"
)


@pytest.fixture(scope="module")
def ingress(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ingress]:
    nginx = require_nginx()
    with isolated_database("trickle") as url:
        env = {
            "SETTLE_ENV": "dev",
            "SETTLE_DATABASE_URL": url,
            "SETTLE_DATA_DIR": str(tmp_path_factory.mktemp("trickle-data")),
            "SETTLE_SECRET_KEY": "e2e-trickle-secret-key",
            "SETTLE_AMQP_URL": "",
            "SETTLE_REDIS_URL": "",
        }
        with SettleProcesses(env) as procs:
            core: Api = start_api(procs, "core", "/v1/status")
            address = f"127.0.0.1:{core.port}"
            # Only core's paths are used: the notifier's upstream is never reached.
            with running_ingress(nginx, address, address) as ingress:
                yield ingress


def _trickle(port: int, stop: threading.Event, started: list[socket.socket]) -> None:
    """One attacker: headers, then a byte every BYTE_EVERY_S; reconnect when dropped."""
    while not stop.is_set():
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(HEAD)
            started.append(sock)
            while not stop.is_set():
                sock.sendall(b" ")
                sock.settimeout(BYTE_EVERY_S)
                with contextlib.suppress(TimeoutError):
                    if sock.recv(4096) == b"":  # the ingress hung up (or answered 408)
                        break
                    break
        stop.wait(0.2)


def _chains(port: int) -> tuple[int, float]:
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_WITHIN_S + 4)
    try:
        conn.request("GET", "/v1/chains")
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - began
    except TimeoutError:
        return 0, time.monotonic() - began
    finally:
        conn.close()


def test_forty_trickling_sign_ins_leave_get_chains_answering_within_a_second(
    ingress: Ingress,
) -> None:
    # Given the API answers GET /v1/chains through the ingress
    assert _chains(ingress.port)[0] == 200
    # When 40 clients trickle POST /v1/sessions bodies through the ingress
    stop = threading.Event()
    started: list[socket.socket] = []
    threads = [
        threading.Thread(target=_trickle, args=(ingress.port, stop, started), daemon=True)
        for _ in range(TRICKLERS)
    ]
    for thread in threads:
        thread.start()
    answers: list[tuple[int, float]] = []
    try:
        deadline = time.monotonic() + OBSERVE_S
        while len(started) < TRICKLERS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(started) >= TRICKLERS, "the trickling clients did not all connect"
        time.sleep(1.0)  # every trickle is in flight before the first probe
        while time.monotonic() < deadline:
            answers.append(_chains(ingress.port))
            time.sleep(0.5)
    finally:
        stop.set()
        for sock in started:  # wakes its thread's recv
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=BYTE_EVERY_S + 2)
    # Then every GET /v1/chains was answered, each within a second
    late = [
        (status, round(took, 2))
        for status, took in answers
        if status != 200 or took > ANSWER_WITHIN_S
    ]
    assert late == [], f"{len(late)} of {len(answers)} GET /v1/chains late or failed: {late}"
    assert len(answers) >= 10, answers
