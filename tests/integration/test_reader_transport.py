"""The reader's transport (web3's HTTPProvider on `evm.read_session`): the node's own
JSON-RPC error is a `NodeError`, and every other failure is not.

The watcher and the payment checks read "NodeError" as "the node answered" and anything
else as "unknown": a transport fault taken for an answer would, say, end a bisection of
eth_getLogs or call a finalized tag missing. Every node here is on 127.0.0.1.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from services.core.evm import MalformedAnswer, NodeError, Web3ChainReader
from tests.support.evm_chain import EvmChain
from tests.support.evm_node import EvmNode
from tests.support.jsonrpc_server import JsonRpcServer
from tests.support.rpc_proxy import Fault, RpcProxy

pytestmark = pytest.mark.integration

TIMEOUT_S = 2.0
CHAIN_ID = 31337


def _header(number: int) -> dict[str, Any]:
    return {"number": hex(number), "hash": "0x" + f"{number:064x}", "logsBloom": "0x0"}


@pytest.fixture
def proxy() -> Iterator[RpcProxy]:
    chain = EvmChain()
    chain.mine(4)
    with EvmNode(chain) as node, RpcProxy(node.url) as served:
        yield served


def test_an_rpc_error_object_is_a_node_error(proxy: RpcProxy) -> None:
    proxy.fail("eth_gasPrice", Fault.RPC_ERROR, times=None, message="busy")
    reader = Web3ChainReader.from_url(proxy.url, TIMEOUT_S)
    with pytest.raises(NodeError, match="busy") as raised:
        reader.gas_price_wei()
    assert raised.value.code == -32000
    assert proxy.count("eth_gasPrice") == 1  # an answer: never tried again


@pytest.mark.parametrize("fault", [Fault.HTTP_503, Fault.HTTP_429, Fault.RESET])
def test_a_transport_fault_is_tried_twice_more_then_never_a_node_error(
    proxy: RpcProxy, fault: Fault
) -> None:
    proxy.fail("eth_blockNumber", fault, times=None, forward=False)
    reader = Web3ChainReader.from_url(proxy.url, TIMEOUT_S)
    with pytest.raises(requests.RequestException) as raised:
        reader.head()
    assert not isinstance(raised.value, NodeError)
    assert proxy.count("eth_blockNumber") == 3


def test_a_timeout_is_unknown_not_an_answer(proxy: RpcProxy) -> None:
    proxy.hold_s = 30
    proxy.fail("eth_getBlockByNumber", Fault.TIMEOUT, times=None)
    reader = Web3ChainReader.from_url(proxy.url, 0.3)
    # `tagged_block` reads a NodeError as "this node has no such tag": a timeout must
    # reach its caller instead (after the tries, requests names it a ConnectionError).
    with pytest.raises(requests.RequestException, match="Read timed out") as raised:
        reader.tagged_block("finalized")
    assert not isinstance(raised.value, NodeError)
    assert proxy.count("eth_getBlockByNumber") == 3


def test_batches_are_retried_on_transport_faults_too(proxy: RpcProxy) -> None:
    reader = Web3ChainReader.from_url(proxy.url, TIMEOUT_S)
    expected = reader.block_headers(range(1, 5))
    assert sorted(expected) == [1, 2, 3, 4]
    proxy.fail("eth_getBlockByNumber", Fault.HTTP_429, times=2, forward=False)
    assert reader.block_headers(range(1, 5)) == expected


def test_an_answer_that_is_not_the_calls_is_malformed_never_a_node_error() -> None:
    def answer(call: dict[str, Any]) -> dict[str, Any]:
        if call["method"] == "eth_blockNumber":
            return {"jsonrpc": "2.0", "id": call["id"]}  # neither result nor error
        if call["method"] == "eth_getBlockByNumber":
            number = int(call["params"][0], 16)
            return {"jsonrpc": "2.0", "id": call["id"], "result": _header(number + 1)}
        return {"jsonrpc": "2.0", "id": call["id"], "result": hex(CHAIN_ID)}

    with JsonRpcServer(answer) as node:
        reader = Web3ChainReader.from_url(node.url, TIMEOUT_S, CHAIN_ID)
        with pytest.raises(MalformedAnswer):
            reader.head()
        # A batch answered with other blocks than asked: not headers of those heights
        with pytest.raises(MalformedAnswer, match="block 3 asked for 2"):
            reader.block_headers([2, 3])


def test_a_batch_refused_whole_is_asked_call_by_call() -> None:
    asked: list[str] = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if isinstance(request, list):
                asked.append("batch")
                body: Any = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600}}
            else:
                asked.append("one")
                number = int(request["params"][0], 16)
                body = {"jsonrpc": "2.0", "id": request["id"], "result": _header(number)}
            self._send(json.dumps(body).encode())

        def _send(self, payload: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with _serving(Refusing) as url:
        reader = Web3ChainReader.from_url(url, TIMEOUT_S)
        headers = reader.block_headers([5, 6, 7])
    assert {n: h.number for n, h in headers.items()} == {5: 5, 6: 6, 7: 7}
    assert asked == ["batch", "one", "one", "one"]


def test_a_body_that_is_not_json_is_never_a_node_error() -> None:
    class Garbage(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            payload = b"<html>502 from a load balancer, with status 200</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with _serving(Garbage) as url:
        reader = Web3ChainReader.from_url(url, TIMEOUT_S)
        with pytest.raises(Exception) as raised:  # the point is what it is not
            reader.head()
    assert not isinstance(raised.value, NodeError)


class _serving:
    """A handler class served on 127.0.0.1 for the `with` block; its URL."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> str:
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join(5)
        self._server.server_close()
