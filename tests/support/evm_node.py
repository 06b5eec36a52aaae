"""The in-process EVM as a JSON-RPC node over HTTP on 127.0.0.1, so Settle talks to it as
to a real node (`Web3ChainReader.from_url`, `Erc20TransferExecutor.from_url`).

    chain = EvmChain()
    with EvmNode(chain) as node:
        reader = Web3ChainReader.from_url(node.url, timeout=2)

Where eth-tester differs from a real node, the node answers as a real one would:

- `logIndex` is numbered per block (eth-tester restarts it in every transaction), in
  `eth_getLogs` and in receipts; so a reorg that puts a transfer behind other
  transactions changes its log index, as on mainnet.
- The `finalized` and `safe` tags are the block `finalized_depth` / `safe_depth` blocks
  under the head, or a JSON-RPC error when the node is built without them (a chain or a
  client that does not offer the tag). eth-tester itself answers them with the latest
  block.
- `eth_sendRawTransaction` is mined at once (`mine_sends=True`, eth-tester's auto-mine),
  or kept in the node's transaction pool until the test mines (`mine_sends=False`), which
  is how a payment stays in flight. The pool behaves as geth's: the same transaction
  again is `already known`, a used nonce `nonce too low`, another transaction with a
  pending one's nonce replaces it only with fees at least 10 % higher (`replacement
  transaction underpriced` otherwise); the pending nonce counts pooled transactions;
  `eth_getTransactionByHash` shows a pooled one with no block. Transactions paying less
  than `min_fee_wei` stay in the pool when blocks are mined (underpriced, stuck), and
  `drop(tx_hash)` evicts one (the node forgets it, as pools do).
- `eth_getLogs` by `blockHash` (EIP-234) works, and answers "unknown block" for a block
  the node does not have (not on its canonical chain).
- Methods eth-tester lacks answer -32601 (method not found), so web3 falls back as it
  does against a real node (e.g. `eth_maxPriorityFeePerGas` -> fee history).

Every call holds `EvmChain.lock`, so the test thread may mine and reorg meanwhile.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import rlp
from eth_account import Account
from eth_tester.exceptions import BlockNotFound, TransactionNotFound
from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes
from web3 import EthereumTesterProvider
from web3.types import RPCEndpoint

from tests.support.evm_chain import EvmChain
from tests.support.jsonrpc_server import JsonRpcServer

log = logging.getLogger(__name__)

#: JSON-RPC error codes a node uses.
METHOD_NOT_FOUND = -32601
SERVER_ERROR = -32000

#: Block tags with a depth of their own on this node.
FINALITY_TAGS = ("finalized", "safe")


class RpcError(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def to_wire(value: Any, key: str | None = None) -> Any:
    """web3's Python values (what the tester middleware returns) as JSON-RPC wire values."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if key == "logsBloom":
            return "0x" + value.to_bytes(256, "big").hex()
        return hex(value)
    if isinstance(value, bytes | bytearray):
        return HexBytes(value).to_0x_hex()
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: to_wire(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_wire(v) for v in value]
    raise TypeError(f"cannot put {type(value).__name__} on the wire")


@dataclass(frozen=True)
class PooledTx:
    """A signed transaction waiting in the node's pool."""

    hash: str
    raw: bytes
    sender: str
    nonce: int
    #: maxFeePerGas (type 2) or gasPrice.
    max_fee: int
    priority_fee: int
    to: str | None
    value: int
    gas: int
    data: str

    @classmethod
    def decode(cls, raw: bytes) -> PooledTx:
        """Fields of a signed legacy, EIP-2930 or EIP-1559 transaction."""
        kind = raw[0] if raw and raw[0] < 0x7F else None
        fields = rlp.decode(raw[1:] if kind is not None else raw)

        def num(b: bytes) -> int:
            return int.from_bytes(b, "big")

        if kind == 2:
            nonce, prio, fee, gas, to, value, data = fields[1:8]
            priority, max_fee = num(prio), num(fee)
        elif kind == 1:
            nonce, price, gas, to, value, data = fields[1:7]
            priority = max_fee = num(price)
        elif kind is None:
            nonce, price, gas, to, value, data = fields[0:6]
            priority = max_fee = num(price)
        else:
            raise RpcError(SERVER_ERROR, "transaction type not supported")
        return cls(
            hash="0x" + keccak(raw).hex(),
            raw=raw,
            sender=str(Account.recover_transaction(raw)),
            nonce=num(nonce),
            max_fee=max_fee,
            priority_fee=priority,
            to=to_checksum_address(to) if to else None,
            value=num(value),
            gas=num(gas),
            data="0x" + bytes(data).hex(),
        )

    def as_pending(self) -> dict[str, Any]:
        """eth_getTransactionByHash's answer for a transaction not in a block yet."""
        return {
            "hash": self.hash,
            "nonce": hex(self.nonce),
            "from": self.sender,
            "to": self.to,
            "value": hex(self.value),
            "gas": hex(self.gas),
            "maxFeePerGas": hex(self.max_fee),
            "maxPriorityFeePerGas": hex(self.priority_fee),
            "gasPrice": hex(self.max_fee),
            "input": self.data,
            "blockHash": None,
            "blockNumber": None,
            "transactionIndex": None,
        }


#: A replacement must raise the fees by this factor (geth's default price bump, 10 %).
PRICE_BUMP = 1.10


def quantity(value: Any) -> int:
    """A JSON-RPC quantity ("0x1a" or an int) as an int."""
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.startswith("0x"):
        return int(value, 16)
    raise RpcError(-32602, f"invalid quantity {value!r}")


class EvmNode:
    """An `EvmChain` served as a JSON-RPC node on 127.0.0.1 (a free port)."""

    def __init__(
        self,
        chain: EvmChain,
        *,
        mine_sends: bool = True,
        finalized_depth: int | None = None,
        safe_depth: int | None = None,
    ) -> None:
        self.chain = chain
        self.mine_sends = mine_sends
        #: Pooled transactions paying less than this stay pending when blocks are mined
        #: (and the node's fee suggestions ask at least this much: the market rose).
        self.min_fee_wei = 0
        #: The transaction pool (mine_sends=False), by (sender, nonce).
        self.pool: dict[tuple[str, int], PooledTx] = {}
        if not mine_sends:
            chain.before_mine.append(self._flush_pool)
        self.depths: dict[str, int | None] = {"finalized": finalized_depth, "safe": safe_depth}
        provider = EthereumTesterProvider(chain.tester)
        # The middleware stack turns wire params into tester calls and back: the same
        # translation web3 applies when it talks to eth-tester in process.
        self._request: Callable[[RPCEndpoint, Any], dict[str, Any]] = provider.request_func(
            chain.w3, chain.w3.middleware_onion
        )
        #: Log count per transaction of each block (blocks are immutable by hash).
        self._log_counts: dict[str, list[int]] = {}
        self._server = JsonRpcServer(self.answer)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> EvmNode:
        self._server.start()
        return self

    def drop(self, tx_hash: str) -> bool:
        """Evict a pooled transaction (it will never be mined); False if not pooled."""
        with self.chain.lock:
            for key, tx in list(self.pool.items()):
                if tx.hash == tx_hash.lower():
                    del self.pool[key]
                    return True
            return False

    def pooled(self) -> list[str]:
        """Hashes of the transactions waiting in the pool."""
        with self.chain.lock:
            return [tx.hash for tx in self.pool.values()]

    def stop(self) -> None:
        if self.mine_sends is False and self._flush_pool in self.chain.before_mine:
            self.chain.before_mine.remove(self._flush_pool)
        self._server.stop()

    def __enter__(self) -> EvmNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- answering ----------------------------------------------------------------------

    def answer(self, request: Any) -> Any:
        """The JSON-RPC response (or batch of responses) to a decoded request."""
        if isinstance(request, list):
            return [self.answer(item) for item in request]
        request_id = request.get("id") if isinstance(request, dict) else None
        try:
            if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                raise RpcError(-32600, "invalid request")
            params = request.get("params") or []
            result = self.call(request["method"], params)
        except RpcError as exc:
            return {"jsonrpc": "2.0", "id": request_id, "error": exc.to_json()}
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    def call(self, method: str, params: list[Any]) -> Any:
        """One JSON-RPC call's result (wire values), or RpcError."""
        with self.chain.lock:
            try:
                return self._call(method, params)
            except RpcError:
                raise
            except Exception as exc:  # what eth-tester raises, as a node's error answer
                raise RpcError(SERVER_ERROR, _node_message(exc)) from None

    def _call(self, method: str, params: list[Any]) -> Any:
        if not self.mine_sends:
            if method == "eth_sendRawTransaction":
                return self._pool_add(bytes(HexBytes(params[0])))
            if method == "eth_getTransactionCount" and len(params) > 1 and params[1] == "pending":
                return hex(self._pending_nonce(to_checksum_address(params[0])))
            if method == "eth_getTransactionByHash":
                for tx in self.pool.values():
                    if tx.hash == str(params[0]).lower():
                        return tx.as_pending()
        if method in ("eth_estimateGas", "eth_call") and params and isinstance(params[0], dict):
            # geth skips nonce checks when simulating; eth-tester would refuse a nonce
            # that only the pool knows.
            params = [{k: v for k, v in params[0].items() if k != "nonce"}, *params[1:]]
        params = self._resolve_tags(method, params)
        response = self._request(RPCEndpoint(method), params)
        if "error" in response:
            error = response["error"]
            code = error.get("code", SERVER_ERROR)
            message = str(error.get("message", "error"))
            if "Unknown RPC Endpoint" in message or "not implemented" in message.lower():
                code = METHOD_NOT_FOUND
            raise RpcError(code, message)
        result = to_wire(response.get("result"))
        if method in ("eth_maxPriorityFeePerGas", "eth_gasPrice") and self.min_fee_wei:
            result = hex(max(quantity(result), self.min_fee_wei))
        if method == "eth_getLogs":
            return [self._block_wide(log) for log in result]
        if method == "eth_getTransactionReceipt" and result is not None:
            result["logs"] = [self._block_wide(log) for log in result.get("logs", [])]
        return result

    # -- the transaction pool ------------------------------------------------------------

    def _nonce(self, sender: str) -> int:
        return int(self.chain.w3.eth.get_transaction_count(sender, "latest"))

    def _pending_nonce(self, sender: str) -> int:
        nonce = self._pending_chain_nonce(sender)
        while (sender, nonce) in self.pool:
            nonce += 1
        return nonce

    def _pool_add(self, raw: bytes) -> str:
        try:
            tx = PooledTx.decode(raw)
        except RpcError:
            raise
        except Exception as exc:
            raise RpcError(SERVER_ERROR, f"invalid transaction: {exc}") from None
        if any(p.hash == tx.hash for p in self.pool.values()):
            raise RpcError(SERVER_ERROR, "already known")
        if tx.nonce < self._nonce(tx.sender):
            raise RpcError(SERVER_ERROR, "nonce too low")
        current = self.pool.get((tx.sender, tx.nonce))
        if current is not None and (
            tx.max_fee < current.max_fee * PRICE_BUMP
            or tx.priority_fee < current.priority_fee * PRICE_BUMP
        ):
            raise RpcError(SERVER_ERROR, "replacement transaction underpriced")
        self.pool[(tx.sender, tx.nonce)] = tx
        return tx.hash

    def _flush_pool(self) -> None:
        """Before a block is mined: pooled transactions that pay enough, in nonce order."""
        for key in sorted(self.pool, key=lambda k: (k[0], k[1])):
            tx = self.pool[key]
            if tx.max_fee < self.min_fee_wei:
                continue
            if tx.nonce != self._pending_chain_nonce(tx.sender):
                continue  # a gap (an earlier nonce still waits): not minable yet
            del self.pool[key]
            try:
                self.chain.tester.backend.send_raw_transaction(tx.raw)
            except Exception as exc:  # invalid against the pending state: geth drops it too
                log.info("pool: dropped %s: %s", tx.hash, exc)

    def _pending_chain_nonce(self, sender: str) -> int:
        return int(self.chain.w3.eth.get_transaction_count(sender, "pending"))

    def _resolve_tags(self, method: str, params: list[Any]) -> list[Any]:
        """`finalized` / `safe` as this node defines them."""
        if method == "eth_getBlockByNumber" and params and params[0] in FINALITY_TAGS:
            return [self._tag_number(params[0]), *params[1:]]
        if method == "eth_getLogs" and params and isinstance(params[0], dict):
            spec = dict(params[0])
            if "blockHash" in spec:
                # EIP-234, which eth-tester lacks: a block the node does not have is an
                # error (never an empty answer).
                try:
                    block = self.chain.tester.get_block_by_hash(spec.pop("blockHash"))
                except BlockNotFound:
                    raise RpcError(SERVER_ERROR, "unknown block") from None
                spec["fromBlock"] = spec["toBlock"] = hex(int(block["number"]))
            for key in ("fromBlock", "toBlock"):
                if spec.get(key) in FINALITY_TAGS:
                    spec[key] = self._tag_number(spec[key])
            return [spec, *params[1:]]
        return params

    def _tag_number(self, tag: str) -> str:
        depth = self.depths[tag]
        if depth is None:
            raise RpcError(SERVER_ERROR, f"{tag} block not found")
        head = int(self.chain.w3.eth.block_number)
        return hex(max(0, head - depth))

    def _block_wide(self, log: dict[str, Any]) -> dict[str, Any]:
        """A log with its index counted across the block, as real nodes number logs."""
        counts = self._log_counts_of(log["blockHash"])
        tx_index = quantity(log["transactionIndex"])
        offset = sum(counts[:tx_index])
        return {**log, "logIndex": hex(offset + quantity(log["logIndex"]))}

    def _log_counts_of(self, block_hash: str) -> list[int]:
        counts = self._log_counts.get(block_hash)
        if counts is None:
            tester = self.chain.tester
            try:
                block = tester.get_block_by_hash(block_hash, full_transactions=False)
                counts = [
                    len(tester.get_transaction_receipt(tx)["logs"]) for tx in block["transactions"]
                ]
            except (BlockNotFound, TransactionNotFound):
                # Not canonical any more (a reorg between the query and this look-up):
                # keep eth-tester's numbers rather than fail the call.
                return []
            self._log_counts[block_hash] = counts
        return counts


_NONCE = re.compile(r"Invalid transaction nonce: Expected (\d+), but got (\d+)")


def _node_message(exc: Exception) -> str:
    """eth-tester's exception text in the words geth uses (clients match on them)."""
    text = str(exc)
    match = _NONCE.search(text)
    if match:
        expected, got = int(match.group(1)), int(match.group(2))
        word = "nonce too low" if got < expected else "nonce too high"
        return f"{word}: next nonce {expected}, tx nonce {got}"
    return text or type(exc).__name__
