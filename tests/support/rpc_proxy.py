"""A fault-injecting JSON-RPC proxy on 127.0.0.1, between Settle and a node (`EvmNode`).

    with EvmNode(chain) as node, RpcProxy(node.url) as proxy:
        reader = Web3ChainReader.from_url(proxy.url, timeout=0.5)
        proxy.fail("eth_getTransactionReceipt", Fault.TIMEOUT)      # forwarded, then no answer
        proxy.fail("eth_sendRawTransaction", Fault.RESET, forward=True)
        proxy.lag(2)                           # eth_getLogs as a backend 2 blocks behind
        fork = proxy.capture_fork(from_block=n); ...; proxy.serve_fork(fork)
        proxy.drop_sends()                     # accepted, answered with its hash, never mined

What each fault looks like to the client:

| fault | the client sees |
|---|---|
| `Fault.TIMEOUT` | no answer: its read timeout (the connection is held `hold_s`, then closed) |
| `Fault.RESET` | the connection reset (TCP RST) with no answer |
| `Fault.HTTP_429` | HTTP 429 Too Many Requests with `Retry-After: 1` |
| `Fault.HTTP_503` | HTTP 503 Service Unavailable |
| `Fault.RPC_ERROR` | HTTP 200 with a JSON-RPC error (`code`, `message` as given) |

A JSON-RPC batch goes through the same rules call by call (views answer each call); a
transport or HTTP fault on any call of a batch ends the whole batch that way.

With `forward=True` (the default) the node takes the call first and only its answer
is lost: a transaction broadcast "fails" although the node has it, a receipt poll fails
although the transaction is mined. With `forward=False` the node never sees the call.

Views of the chain (they change answers, not transport):

- `lag(n, methods, by_hash=True)`: the listed methods answer as a node `n` blocks
  behind the real head: `eth_getLogs` returns nothing past that height (`[]` for a range
  wholly past it, exactly what many load-balanced providers do, without an error),
  `eth_blockNumber` says the lower head, `eth_getBlockByNumber` has no block past it. By
  default only `eth_getLogs` lags: a logs backend behind the node that answers the head.
  `by_hash=False`: `eth_getLogs` asked by block hash reaches an up-to-date backend (a
  load balancer sends each call to a different server), only range queries lag.
- `serve_fork(fork, methods)`: the listed methods answer from a branch captured earlier
  (`capture_fork`), a node stuck on a stale fork after a reorg.
- `drop_sends()`: `eth_sendRawTransaction` is answered with the transaction's hash but
  not forwarded: the node "had" it and dropped it from its pool.

Rules are consumed in the order they were added; `times=None` keeps a rule until
`clear()`. Every call is recorded (`calls`, `count`). Nothing here talks to anything
but 127.0.0.1, and every wait is bounded.
"""

from __future__ import annotations

import enum
import http.client
import http.server
import json
import socket
import struct
import threading
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from eth_utils import keccak

#: Methods a lagging node answers from its lower head, by default only the logs backend.
LOGS_ONLY = ("eth_getLogs",)
#: Every method a whole node behind answers from its lower head.
WHOLE_NODE = ("eth_getLogs", "eth_blockNumber", "eth_getBlockByNumber")
#: Methods a stale fork answers.
FORK_METHODS = (
    "eth_blockNumber",
    "eth_getBlockByNumber",
    "eth_getBlockByHash",
    "eth_getLogs",
    "eth_getTransactionReceipt",
)
#: Longest a single upstream call may take (the node is in process: it is quick).
UPSTREAM_TIMEOUT_S = 30.0


class Fault(enum.Enum):
    TIMEOUT = "timeout"
    RESET = "reset"
    HTTP_429 = "http_429"
    HTTP_503 = "http_503"
    RPC_ERROR = "rpc_error"


@dataclass
class _Rule:
    methods: frozenset[str] | None  # None: every method
    times: int | None  # None: until cleared

    def matches(self, method: str) -> bool:
        return (self.methods is None or method in self.methods) and (
            self.times is None or self.times > 0
        )

    def use(self) -> None:
        if self.times is not None:
            self.times -= 1


@dataclass
class _FaultRule(_Rule):
    fault: Fault = Fault.RPC_ERROR
    forward: bool = True
    code: int = -32000
    message: str = "injected error"


@dataclass
class _DelayRule(_Rule):
    seconds: float = 0.0


@dataclass
class Call:
    """One JSON-RPC call the proxy saw, and what it did with it."""

    method: str
    params: list[Any]
    #: "forwarded", "fault:<name>", "fault:<name> after forward", "lagged", "fork", "dropped",
    #: "duplicated"
    outcome: str = "forwarded"


@dataclass
class Fork:
    """A branch of the chain captured from the node: what a stale node would still serve."""

    from_block: int
    head: int
    #: Full blocks (transactions as objects), wire format, by number.
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Every log in [from_block, head], wire format.
    logs: list[dict[str, Any]] = field(default_factory=list)
    #: Receipts of the branch's transactions, by hash.
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)

    def block_hash(self, number: int) -> str:
        return str(self.blocks[number]["hash"])


class _Answer(Exception):
    """Raised inside the pipeline to answer a call directly (a view or a fault)."""

    def __init__(self, outcome: str, result: Any = None, error: dict[str, Any] | None = None):
        super().__init__(outcome)
        self.outcome = outcome
        self.result = result
        self.error = error


class _Transport(Exception):
    """A fault that ends the HTTP exchange itself (no JSON-RPC answer)."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.value)
        self.fault = fault


class RpcProxy:
    """Start with `with RpcProxy(upstream_url) as proxy:`; stopped (and held calls released)
    on exit."""

    def __init__(self, upstream: str, *, hold_s: float = 15.0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.hostname not in ("127.0.0.1", "localhost"):
            raise ValueError("the proxy only forwards to 127.0.0.1")
        self.upstream = (parsed.hostname, parsed.port or 80, parsed.path or "/")
        #: How long a TIMEOUT holds the connection before closing it (released on stop).
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._lag: tuple[int, frozenset[str], bool] | None = None
        self._fork: tuple[Fork, frozenset[str]] | None = None
        self._drop: list[int | None] = []
        self._duplicate_logs = False
        self._closing = threading.Event()
        self.calls: list[Call] = []
        #: Hashes of transactions `drop_sends` swallowed.
        self.dropped: list[str] = []
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # -- life -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> RpcProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def __enter__(self) -> RpcProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- programming faults ---------------------------------------------------------------

    def fail(
        self,
        methods: str | Iterable[str] | None,
        fault: Fault,
        *,
        times: int | None = 1,
        forward: bool = True,
        code: int = -32000,
        message: str = "injected error",
    ) -> None:
        """The next `times` calls of `methods` (None: any) end in `fault`.

        `forward`: the node takes the call first, so only its answer is lost.
        """
        self._add(
            _FaultRule(
                _methods(methods), times, fault=fault, forward=forward, code=code, message=message
            )
        )

    def delay(
        self, methods: str | Iterable[str] | None, seconds: float, *, times: int | None = None
    ) -> None:
        """Hold the next `times` calls of `methods` `seconds` before forwarding them."""
        if not 0 <= seconds <= 60:
            raise ValueError("a delay is between 0 and 60 s")
        self._add(_DelayRule(_methods(methods), times, seconds=seconds))

    def lag(self, blocks: int, methods: Iterable[str] = LOGS_ONLY, *, by_hash: bool = True) -> None:
        """Answer `methods` as a node `blocks` behind the real head (0: stop lagging).

        `by_hash=False`: eth_getLogs by block hash is answered up to date.
        """
        if blocks < 0:
            raise ValueError("blocks must be >= 0")
        with self._lock:
            self._lag = (blocks, frozenset(methods), by_hash) if blocks else None

    def serve_fork(self, fork: Fork | None, methods: Iterable[str] = FORK_METHODS) -> None:
        """Answer `methods` from a captured branch (None: from the node again)."""
        with self._lock:
            self._fork = None if fork is None else (fork, frozenset(methods))

    def drop_sends(self, times: int | None = 1) -> None:
        """The next `times` broadcasts are answered with their hash and never forwarded."""
        with self._lock:
            self._drop.append(times)

    def duplicate_logs(self, on: bool = True) -> None:
        """Answer `eth_getLogs` over a block range with every log twice (as providers have
        at span boundaries); asked by block hash, logs stay single."""
        with self._lock:
            self._duplicate_logs = on

    def clear(self) -> None:
        """Forget every rule and view (recorded calls stay)."""
        with self._lock:
            self._rules.clear()
            self._lag = None
            self._fork = None
            self._drop.clear()
            self._duplicate_logs = False

    # -- reading what happened ----------------------------------------------------------

    def count(self, method: str, outcome: str | None = None) -> int:
        """Calls of `method` seen (with `outcome` only, when given)."""
        with self._lock:
            return sum(
                1
                for c in self.calls
                if c.method == method and (outcome is None or c.outcome == outcome)
            )

    def capture_fork(self, from_block: int) -> Fork:
        """The node's current branch from `from_block` to its head (blocks, logs, receipts)."""
        head = int(self.upstream_call("eth_blockNumber", []), 16)
        if not 0 <= from_block <= head:
            raise ValueError(f"from_block must be in [0, {head}]")
        fork = Fork(from_block=from_block, head=head)
        for number in range(from_block, head + 1):
            block = self.upstream_call("eth_getBlockByNumber", [hex(number), True])
            fork.blocks[number] = block
            for tx in block["transactions"]:
                receipt = self.upstream_call("eth_getTransactionReceipt", [tx["hash"]])
                fork.receipts[tx["hash"]] = receipt
        fork.logs = self.upstream_call(
            "eth_getLogs", [{"fromBlock": hex(from_block), "toBlock": hex(head)}]
        )
        return fork

    # -- the pipeline -------------------------------------------------------------------

    def upstream_call(self, method: str, params: list[Any]) -> Any:
        """One call to the node (not recorded, no rules): its result, or RuntimeError."""
        body = self._forward(
            json.dumps({"jsonrpc": "2.0", "id": 0, "method": method, "params": params}).encode()
        )
        answer = json.loads(body)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _forward(self, body: bytes) -> bytes:
        host, port, path = self.upstream
        conn = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.read()
        finally:
            conn.close()

    def handle(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """(HTTP status, headers, body) for one request body, or _Transport."""
        try:
            request = json.loads(body)
        except ValueError:
            return 200, {}, self._forward(body)
        if isinstance(request, list):
            # A batch: each call goes through the rules; a transport or HTTP fault on
            # any of them is the whole batch's fate, as one request carries them all.
            answers = []
            for item in request:
                status, headers, answer = self._one(item)
                if status != 200:
                    return status, headers, answer
                answers.append(json.loads(answer))
            return 200, {}, json.dumps(answers).encode()
        if not isinstance(request, dict):
            return 200, {}, self._forward(body)
        return self._one(request)

    def _one(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        if not isinstance(request, dict):
            return 200, {}, self._forward(json.dumps(request).encode())
        body = json.dumps(request).encode()
        method = str(request.get("method"))
        params = list(request.get("params") or [])
        call = Call(method, params)
        with self._lock:
            self.calls.append(call)
            fault = self._take(_FaultRule, method)
            delay = self._take(_DelayRule, method)
        if delay is not None:
            self._closing.wait(delay.seconds)
        if fault is not None and not fault.forward:
            call.outcome = f"fault:{fault.fault.value}"
            return self._fault(fault, request)
        try:
            answer = self._view(method, params)
        except _Answer as exc:
            call.outcome = exc.outcome
            payload: dict[str, Any] = {"jsonrpc": "2.0", "id": request.get("id")}
            if exc.error is not None:
                payload["error"] = exc.error
            else:
                payload["result"] = exc.result
            answer = json.dumps(payload).encode()
        else:
            if answer is None:
                answer = self._forward(body)
        if fault is not None:
            call.outcome = f"fault:{fault.fault.value} after forward"
            return self._fault(fault, request)
        return 200, {}, answer

    def _take(self, kind: type[_Rule], method: str) -> Any:
        for rule in self._rules:
            if isinstance(rule, kind) and rule.matches(method):
                rule.use()
                return rule
        return None

    def _fault(
        self, rule: _FaultRule, request: dict[str, Any]
    ) -> tuple[int, dict[str, str], bytes]:
        if rule.fault in (Fault.TIMEOUT, Fault.RESET):
            raise _Transport(rule.fault)
        if rule.fault is Fault.HTTP_429:
            return 429, {"Retry-After": "1"}, b"Too Many Requests"
        if rule.fault is Fault.HTTP_503:
            return 503, {}, b"Service Unavailable"
        error = {"code": rule.code, "message": rule.message}
        return (
            200,
            {},
            json.dumps({"jsonrpc": "2.0", "id": request.get("id"), "error": error}).encode(),
        )

    # -- views ------------------------------------------------------------------------------

    def _view(self, method: str, params: list[Any]) -> bytes | None:
        """Answer from a view (raising _Answer), or None to forward."""
        with self._lock:
            lag, fork, duplicate = self._lag, self._fork, self._duplicate_logs
            drop = method == "eth_sendRawTransaction" and self._use_drop()
        if drop:
            tx_hash = "0x" + keccak(hexstr=params[0]).hex()
            with self._lock:
                self.dropped.append(tx_hash)
            raise _Answer("dropped", result=tx_hash)
        if fork is not None and method in fork[1]:
            self._fork_answer(fork[0], method, params)
        if lag is not None and method in lag[1]:
            self._lag_answer(lag[0], method, params, by_hash=lag[2])
        if duplicate and method == "eth_getLogs" and params and "blockHash" not in params[0]:
            logs = self.upstream_call(method, params)
            raise _Answer("duplicated", result=[log for log in logs for _ in range(2)])
        return None

    def _use_drop(self) -> bool:
        while self._drop:
            times = self._drop[0]
            if times is None:
                return True
            if times > 0:
                self._drop[0] = times - 1
                return True
            self._drop.pop(0)
        return False

    def _lag_answer(
        self, blocks: int, method: str, params: list[Any], *, by_hash: bool = True
    ) -> None:
        head = int(self.upstream_call("eth_blockNumber", []), 16)
        behind = max(0, head - blocks)
        if method == "eth_blockNumber":
            raise _Answer("lagged", result=hex(behind))
        if method == "eth_getBlockByNumber":
            number = _block_number(params[0], behind)
            if number is None or number > behind:
                raise _Answer("lagged", result=None)
            result = self.upstream_call(method, [hex(number), *params[1:]])
            raise _Answer("lagged", result=result)
        if method == "eth_getLogs":
            spec = dict(params[0]) if params else {}
            if "blockHash" in spec:
                if not by_hash:
                    return  # another backend, up to date, answers it
                block = self.upstream_call("eth_getBlockByHash", [spec["blockHash"], False])
                if block is None or int(block["number"], 16) > behind:
                    raise _Answer("lagged", error={"code": -32000, "message": "unknown block"})
                return
            start = _block_number(spec.get("fromBlock", "latest"), behind)
            end = _block_number(spec.get("toBlock", "latest"), behind)
            if start is None or end is None:
                return
            if start > behind:
                raise _Answer("lagged", result=[])
            spec["fromBlock"], spec["toBlock"] = hex(start), hex(min(end, behind))
            raise _Answer("lagged", result=self.upstream_call(method, [spec]))

    def _fork_answer(self, fork: Fork, method: str, params: list[Any]) -> None:
        if method == "eth_blockNumber":
            raise _Answer("fork", result=hex(fork.head))
        if method == "eth_getBlockByNumber":
            number = _block_number(params[0], fork.head)
            if number is None or number < fork.from_block:
                return  # shared history (or a tag this view does not know): the node
            full = bool(params[1]) if len(params) > 1 else False
            block = fork.blocks.get(number)
            raise _Answer("fork", result=None if block is None else _shape(block, full))
        if method == "eth_getBlockByHash":
            full = bool(params[1]) if len(params) > 1 else False
            for block in fork.blocks.values():
                if block["hash"] == str(params[0]).lower():
                    raise _Answer("fork", result=_shape(block, full))
            return
        if method == "eth_getTransactionReceipt":
            receipt = fork.receipts.get(str(params[0]).lower())
            if receipt is not None:
                raise _Answer("fork", result=receipt)
            return
        if method == "eth_getLogs":
            spec = dict(params[0]) if params else {}
            if "blockHash" in spec:
                wanted = str(spec["blockHash"]).lower()
                if not any(b["hash"] == wanted for b in fork.blocks.values()):
                    return
                logs = [log for log in fork.logs if log["blockHash"] == wanted]
                raise _Answer("fork", result=_filter_logs(logs, spec))
            start = _block_number(spec.get("fromBlock", "latest"), fork.head)
            end = _block_number(spec.get("toBlock", "latest"), fork.head)
            if start is None or end is None:
                return
            end = min(end, fork.head)
            result: list[dict[str, Any]] = []
            if start < fork.from_block:
                shared = {
                    **spec,
                    "fromBlock": hex(start),
                    "toBlock": hex(min(end, fork.from_block - 1)),
                }
                result = self.upstream_call(method, [shared])
            in_range = [log for log in fork.logs if start <= int(log["blockNumber"], 16) <= end]
            raise _Answer("fork", result=result + _filter_logs(in_range, spec))

    # -- transport faults ---------------------------------------------------------------------

    def hold(self) -> None:
        """Wait (bounded) as a node that never answers; released by `stop()`."""
        self._closing.wait(self.hold_s)


def _methods(methods: str | Iterable[str] | None) -> frozenset[str] | None:
    if methods is None:
        return None
    if isinstance(methods, str):
        return frozenset((methods,))
    return frozenset(methods)


def _block_number(value: Any, head: int) -> int | None:
    """A block parameter as a number on a node whose head is `head` (None: a tag not known)."""
    if isinstance(value, int):
        return value
    if value in (None, "latest", "pending"):
        return head
    if value == "earliest":
        return 0
    if isinstance(value, str) and value.startswith("0x"):
        return int(value, 16)
    return None


def _shape(block: dict[str, Any], full: bool) -> dict[str, Any]:
    if full:
        return block
    return {**block, "transactions": [tx["hash"] for tx in block["transactions"]]}


def _filter_logs(logs: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """eth_getLogs' address and topic matching."""
    address = spec.get("address")
    addresses = None
    if address is not None:
        addresses = {a.lower() for a in ([address] if isinstance(address, str) else address)}
    topics = spec.get("topics") or []
    out = []
    for log in logs:
        if addresses is not None and log["address"].lower() not in addresses:
            continue
        if _topics_match(log["topics"], topics):
            out.append(log)
    return out


def _topics_match(have: list[str], wanted: list[Any]) -> bool:
    for position, want in enumerate(wanted):
        if want is None:
            continue
        if position >= len(have):
            return False
        options = [want] if isinstance(want, str) else list(want)
        if have[position].lower() not in {o.lower() for o in options}:
            return False
    return True


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    proxy: RpcProxy


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        proxy = self.server.proxy
        try:
            status, headers, payload = proxy.handle(body)
        except _Transport as exc:
            self.close_connection = True
            if exc.fault is Fault.TIMEOUT:
                proxy.hold()
            # SO_LINGER 0: close with a TCP RST, no FIN, no answer.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        except (OSError, http.client.HTTPException) as exc:
            status, headers = 502, {}
            payload = f"upstream failed: {exc}".encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass
