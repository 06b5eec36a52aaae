"""An `InMemoryChain` served as a JSON-RPC node over HTTP on 127.0.0.1: fast enough for
volume (a million addresses, hundreds of transfers per block), where eth-tester is not.

    chain = InMemoryChain(8453)
    with MemoryNode(chain) as node:
        reader = Web3ChainReader.from_url(node.url, timeout=5)

It answers what the chain watcher asks, in wire format: eth_chainId, eth_blockNumber,
eth_gasPrice, eth_getBlockByNumber (numbers, `latest`, and the chain's `finalized` /
`safe` tags when it offers them), eth_getLogs (a range or a `blockHash`, filtered by
contract; an unknown block hash is an error, as on a real node), batches.
"""

from __future__ import annotations

from typing import Any

from services.core.evm import TRANSFER_TOPIC, InMemoryChain, TransferLog
from tests.support.jsonrpc_server import JsonRpcServer


class _Error(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _wire(log: TransferLog) -> dict[str, Any]:
    return {
        "address": log.token_address,
        "blockNumber": hex(log.block_number),
        "blockHash": log.block_hash,
        "transactionHash": log.tx_hash,
        "transactionIndex": hex(log.tx_index),
        "logIndex": hex(log.log_index),
        "removed": False,
        "topics": [
            TRANSFER_TOPIC,
            "0x" + "00" * 12 + log.from_address[2:],
            "0x" + "00" * 12 + log.to_address[2:],
        ],
        "data": "0x" + log.amount_raw.to_bytes(32, "big").hex(),
    }


class MemoryNode:
    """Serves one InMemoryChain until stopped."""

    def __init__(self, chain: InMemoryChain) -> None:
        self.chain = chain
        self._server = JsonRpcServer(self.answer)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> MemoryNode:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> MemoryNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer(self, call: Any) -> dict[str, Any]:
        """The JSON-RPC response to one call."""
        call_id = call.get("id") if isinstance(call, dict) else None
        try:
            result = self._call(str(call["method"]), list(call.get("params") or []))
        except _Error as exc:
            return {
                "jsonrpc": "2.0",
                "id": call_id,
                "error": {"code": exc.code, "message": str(exc)},
            }
        return {"jsonrpc": "2.0", "id": call_id, "result": result}

    def _call(self, method: str, params: list[Any]) -> Any:
        chain = self.chain
        if method == "eth_chainId":
            return hex(chain.chain_id)
        if method == "eth_blockNumber":
            return hex(chain.head())
        if method == "eth_gasPrice":
            return hex(chain.gas_price_wei())
        if method == "eth_getBlockByNumber":
            tag = params[0]
            if tag in ("finalized", "safe"):
                ref = chain.tagged_block(tag)
                if ref is None:
                    raise _Error(-32000, f"{tag} block not found")
            else:
                ref = chain.block(chain.head() if tag == "latest" else int(tag, 16))
            if ref is None:
                return None
            bloom = chain.block_headers([ref.number])[ref.number].logs_bloom or 0
            return {
                "number": hex(ref.number),
                "hash": ref.hash,
                "logsBloom": "0x" + bloom.to_bytes(256, "big").hex(),
            }
        if method == "eth_getLogs":
            spec = params[0]
            address = spec.get("address")
            tokens = None if address is None else [address] if isinstance(address, str) else address
            topics = spec.get("topics") or []
            if topics and topics[0] not in (None, TRANSFER_TOPIC):
                return []
            if "blockHash" in spec:
                logs = chain.block_transfer_logs(spec["blockHash"].lower(), tokens)
                if logs is None:
                    raise _Error(-32000, "unknown block")
            else:
                logs = chain.transfer_logs(
                    int(spec["fromBlock"], 16), int(spec["toBlock"], 16), tokens
                )
            return [_wire(log) for log in logs]
        raise _Error(-32601, f"method {method} not found")
