"""JSON-RPC over HTTP for the chain readers: one keep-alive connection pool, the JSON
encoded and decoded here.

Why not web3's provider: a watcher round is a dozen calls, and web3's HTTPProvider
costs ~1.6 ms of CPU a call on a small answer (requests re-reads the proxy settings
from the environment on every call, then web3's own request handling), this ~0.7 ms
(bench/watcher.py: about a quarter of the CPU of a block with no deposit). Paying
(`hot_wallet.py`) keeps web3: a few calls a payment, and its transaction helpers.

What requests would have taken from the environment is read once, at construction:
`HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` and `REQUESTS_CA_BUNDLE`/`CURL_CA_BUNDLE` (else
certifi's bundle, as requests uses). Reads are idempotent, so, as web3's provider did
for read methods, a call whose connection fails or drops, or that is answered 429 or
5xx, is tried twice more (0.1 s, then 0.2 s later; a Retry-After is not waited for:
the watcher's next round is the longer wait).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from typing import Any

import certifi
import urllib3
from requests.utils import get_environ_proxies

#: Tries after the first, per call.
RETRIES = 2
#: HTTP answers worth another try.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class RpcHttpError(Exception):
    """The node answered with an HTTP error status (429, 5xx, ...), or not JSON."""

    def __init__(self, method: str, status: int, body: bytes) -> None:
        super().__init__(f"{method}: HTTP {status}: {body[:200]!r}")
        self.method = method
        self.status = status


class JsonRpcHttp:
    """Calls to one JSON-RPC endpoint over HTTP(S)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self._ids = itertools.count(1)
        options: dict[str, Any] = {
            "num_pools": 2,
            "maxsize": 4,
            "timeout": urllib3.Timeout(total=timeout),
            "retries": urllib3.Retry(
                total=RETRIES,
                connect=RETRIES,
                read=RETRIES,
                status=RETRIES,
                other=0,
                allowed_methods=None,  # POST too: every call made here is a read
                status_forcelist=RETRY_STATUSES,
                backoff_factor=0.1,
                respect_retry_after_header=False,
                raise_on_status=False,
            ),
            "ca_certs": os.environ.get("REQUESTS_CA_BUNDLE")
            or os.environ.get("CURL_CA_BUNDLE")
            or certifi.where(),
        }
        scheme = url.split(":", 1)[0].lower()
        proxy = get_environ_proxies(url).get(scheme)
        self._http: urllib3.PoolManager = (
            urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
        )

    def call(self, method: str, params: Sequence[Any]) -> dict[str, Any]:
        """One call's response object (`result` or `error`)."""
        answer = self._post(
            method,
            {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": list(params)},
        )
        if not isinstance(answer, dict):
            raise RpcHttpError(method, 200, repr(answer).encode())
        return answer

    def batch(self, method: str, params: Sequence[Sequence[Any]]) -> list[dict[str, Any]] | None:
        """Calls of one method in one batch, answers in the order asked; None when the
        node refuses batches (answers one error object)."""
        requests = [
            {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": list(p)}
            for p in params
        ]
        answer = self._post(method, requests)
        if not isinstance(answer, list):
            return None
        by_id = {a.get("id"): a for a in answer if isinstance(a, dict)}
        out = []
        for request in requests:
            one = by_id.get(request["id"])
            if one is None:
                raise RpcHttpError(
                    method, 200, b"batch answer without id " + str(request["id"]).encode()
                )
            out.append(one)
        return out

    def _post(self, method: str, payload: Any) -> Any:
        response = self._http.request(
            "POST",
            self.url,
            body=json.dumps(payload, separators=(",", ":")).encode(),
            headers={"Content-Type": "application/json"},
        )
        if not 200 <= response.status < 300:
            raise RpcHttpError(method, response.status, response.data)
        try:
            return json.loads(response.data)
        except ValueError:
            raise RpcHttpError(method, response.status, response.data) from None

    def close(self) -> None:
        self._http.clear()
