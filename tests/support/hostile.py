"""Hostile clients against API processes: nested JSON bodies and sign-in floods, until stopped.

    hostile = HostileClients(core_port, notifier_port, api_key, email).start()
    ...                                  # the soak's load and faults meanwhile
    hostile.stop()
    assert hostile.problems() == []

Each client is a thread sending one request at a time over real HTTP, paced so the
soak's own load still gets the machine. Every answer must be a 4xx in the error
format that its attack deserves; a 5xx, a connection the server dropped, or any
other answer is a problem. The sign-in flood comes from loopback addresses of its
own (127.0.0.30 and up), so the member it guesses at can still sign in from 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

#: 100,000 levels of brackets (200 KB): killed a gunicorn worker per request once.
NESTED_ARRAYS = b"[" * 100_000 + b"]" * 100_000
#: 20,000 levels of objects.
NESTED_OBJECTS = b'{"a":' * 20_000 + b"1" + b"}" * 20_000
JSON = {"Content-Type": "application/json"}
#: What each attack may be answered: (status, error code).
EXPECTED: dict[str, set[tuple[int, str]]] = {
    "nested": {(400, "invalid_json")},
    "sign-in": {(401, "unauthorized"), (429, "rate_limited"), (503, "service_unavailable")},
}


def _post(
    port: int, path: str, body: bytes, headers: dict[str, str], source: str
) -> tuple[int, str]:
    """(status, error code) of one POST; (0, the error) when the connection broke."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", path, body=body, headers={**JSON, **headers})
        response = conn.getresponse()
        raw = response.read()
    except OSError as err:
        return 0, f"{type(err).__name__}: {err}"
    finally:
        conn.close()
    try:
        code = str(json.loads(raw).get("code"))
    except (ValueError, AttributeError):
        code = f"not JSON: {raw[:80]!r}"
    return response.status, code


def sign_in(port: int, email: str, password: str, source: str = "127.0.0.1") -> tuple[int, str]:
    """(status, error code: "None" on success) of a sign-in."""
    body = json.dumps({"email": email, "password": password}).encode()
    return _post(port, "/v1/sessions", body, {}, source)


@dataclass
class HostileClients:
    core_port: int
    notifier_port: int
    #: A tenant's API key: nested bodies also go to routes that need one.
    api_key: str
    #: A member's email: the sign-in flood guesses their password.
    email: str
    flooders: int = 4
    #: Least time between two requests of one client.
    pace_s: float = 0.05
    answers: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> HostileClients:
        self._spawn(self._nested, "127.0.0.29")
        for n in range(self.flooders):
            self._spawn(self._sign_in_flood, f"127.0.0.{30 + n}")
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
            assert not thread.is_alive(), "a hostile client is still running"

    def count(self, attack: str, status: int | None = None) -> int:
        return sum(
            n
            for (a, s, _), n in self.answers.items()
            if a == attack and (status is None or s == status)
        )

    def problems(self) -> list[str]:
        """Every answer the attack did not deserve (5xx, dropped, other), with its count."""
        return [
            f"{attack}: {status} {code} x{n}"
            for (attack, status, code), n in sorted(self.answers.items())
            if (status, code) not in EXPECTED[attack]
        ]

    def _spawn(self, loop: object, source: str) -> None:
        thread = threading.Thread(target=loop, args=(source,), daemon=True)
        self._threads.append(thread)
        thread.start()

    def _record(self, attack: str, answer: tuple[int, str]) -> None:
        with self._lock:
            self.answers[(attack, *answer)] += 1

    def _nested(self, source: str) -> None:
        key = {"Authorization": f"Bearer {self.api_key}"}
        targets = [
            (self.core_port, "/v1/sessions", NESTED_ARRAYS, {}),
            (self.core_port, "/v1/deposit-accounts", NESTED_OBJECTS, key),
            (self.notifier_port, "/v1/webhook-endpoints", NESTED_ARRAYS, key),
            (self.notifier_port, "/v1/webhook-endpoints", NESTED_OBJECTS, key),
        ]
        n = 0
        while not self._stop.is_set():
            port, path, body, headers = targets[n % len(targets)]
            self._record("nested", _post(port, path, body, headers, source))
            n += 1
            self._stop.wait(self.pace_s * 2)

    def _sign_in_flood(self, source: str) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            answer = sign_in(self.core_port, self.email, "a guess, long enough", source)
            self._record("sign-in", answer)
            self._stop.wait(max(0.0, self.pace_s - (time.monotonic() - started)))
