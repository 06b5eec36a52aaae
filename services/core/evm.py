"""Reading a chain behind a small interface: a JSON-RPC reader and a fake chain for tests.

Paying (signing and sending transfers) is `services.core.hot_wallet`.

`ChainReader` is all the chain watcher needs from a node, so it can be unit-tested on
`InMemoryChain` and run on `Web3ChainReader` (JSON-RPC) in production.

Notes for callers (they hold for every reader here):

- `transfers()` returns only ERC-20-shaped `Transfer` logs (3 topics, 32-byte data).
  ERC-721 `Transfer` shares topic0 but has 4 topics; those are skipped.
- The identity of a log is `(tx_hash, log_index)`, not `(block, log_index)`:
  eth-tester numbers `logIndex` per transaction, real nodes per block. Results are
  ordered by (block, transaction index, log index), which is (block, log_index) order
  on a real node.
- A range is read in several calls (block-span and address chunks), so a reorg can
  happen mid-scan: compare block hashes before trusting a range.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol, cast

from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import (
    BlockNotFound,
    MethodUnavailable,
    TransactionIndexingInProgress,
    TransactionNotFound,
    Web3RPCError,
)
from web3.middleware import ExtraDataToPOAMiddleware
from web3.types import FilterParams

#: topic0 of `Transfer(address,address,uint256)` (ERC-20 and ERC-721 alike).
TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()

#: Defaults that fit common providers' eth_getLogs limits (span and topic-list size).
DEFAULT_MAX_BLOCK_SPAN = 1_000
DEFAULT_MAX_ADDRESSES_PER_CALL = 500


@dataclass(frozen=True, slots=True)
class BlockRef:
    number: int
    hash: str


@dataclass(frozen=True, slots=True)
class TransferLog:
    chain_id: int
    block_number: int
    block_hash: str
    tx_hash: str
    log_index: int
    token_address: str
    from_address: str
    to_address: str
    amount_raw: int


class ChainIdMismatch(RuntimeError):
    """The node serves a different chain than the one it was configured for."""


class ChainReader(Protocol):
    """What the chain watcher reads from one chain."""

    def head(self) -> int:
        """Number of the latest block."""
        ...

    def block(self, number: int) -> BlockRef | None:
        """The canonical block at `number`, or None past the head."""
        ...

    def transfers(
        self,
        from_block: int,
        to_block: int,
        token_addresses: Sequence[str] | None,
        to_addresses: Sequence[str],
    ) -> list[TransferLog]:
        """ERC-20 Transfer logs to `to_addresses` in [from_block, to_block]; any token if None."""
        ...

    def gas_price_wei(self) -> int:
        """The node's current gas price."""
        ...

    def receipt_status(self, tx_hash: str) -> tuple[int, int] | None:
        """(status, block number) of a mined transaction, or None if not mined."""
        ...


_ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]{40}")


@lru_cache(maxsize=1 << 16)
def _checksum(lower: str) -> str:
    # EIP-55 costs a keccak (~60 us); deposit and token addresses repeat endlessly.
    return to_checksum_address(lower)


def _lower_address(value: str) -> str:
    if not isinstance(value, str) or not _ADDRESS_RE.fullmatch(value):
        raise ValueError(f"not a 20-byte 0x-hex address: {value!r}")
    return value.lower()


def _address_list(name: str, values: Sequence[str]) -> list[str]:
    """Sorted, de-duplicated lowercase addresses."""
    # A bare string is a Sequence[str] too; iterating it would query single characters.
    if isinstance(values, str):
        raise TypeError(f"{name} must be a sequence of addresses, not a string")
    return sorted({_lower_address(v) for v in values})


def _pad_address_topic(lower: str) -> str:
    return "0x" + "00" * 12 + lower[2:]


def _topic_address(topic: Any) -> str:
    return _checksum("0x" + bytes(HexBytes(topic))[-20:].hex())


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def hex0x(value: Any) -> str:
    """Bytes or hex text as lowercase 0x-hex."""
    # hexbytes >= 1 dropped the 0x from .hex(); normalise everything to lowercase 0x-hex.
    if isinstance(value, str):
        return value.lower() if value.startswith("0x") else "0x" + value.lower()
    return HexBytes(value).to_0x_hex()


def _transfer_filter(
    from_block: int, token_addresses: Sequence[str] | None, to_addresses: Sequence[str]
) -> tuple[list[str], list[str] | None]:
    """`ChainReader.transfers`' arguments checked: (recipients, tokens or None for any)."""
    if from_block < 0:
        raise ValueError(f"from_block must be >= 0, got {from_block}")
    recipients = _address_list("to_addresses", to_addresses)
    tokens = None if token_addresses is None else _address_list("tokens", token_addresses)
    return recipients, tokens


def connect(url: str, timeout: float) -> Web3:
    """A Web3 over HTTP JSON-RPC that tolerates proof-of-authority block headers."""
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": timeout}))
    # Polygon/BSC-style headers carry >32-byte extraData, which web3's validation
    # rejects when fetching a block; this middleware moves it aside (harmless elsewhere).
    w3.middleware_onion.inject(ExtraDataToPOAMiddleware, layer=0)
    return w3


def receipt_status(w3: Web3, tx_hash: str) -> tuple[int, int] | None:
    """(status, block number) of a mined transaction, or None if not mined."""
    try:
        receipt = w3.eth.get_transaction_receipt(HexBytes(tx_hash))
    except (TransactionNotFound, TransactionIndexingInProgress):
        return None
    block_number = receipt.get("blockNumber")
    if block_number is None:
        return None
    return int(receipt["status"]), int(block_number)


class Web3ChainReader(ChainReader):
    """ChainReader over a `web3.Web3` (HTTP JSON-RPC, or EthereumTesterProvider in tests)."""

    def __init__(
        self,
        w3: Web3,
        chain_id: int | None = None,
        *,
        max_block_span: int = DEFAULT_MAX_BLOCK_SPAN,
        max_addresses_per_call: int = DEFAULT_MAX_ADDRESSES_PER_CALL,
    ) -> None:
        if max_block_span < 1 or max_addresses_per_call < 1:
            raise ValueError("max_block_span and max_addresses_per_call must be >= 1")
        self.w3 = w3
        self.max_block_span = max_block_span
        self.max_addresses_per_call = max_addresses_per_call
        self._configured_chain_id = chain_id
        self._chain_id: int | None = None
        #: eth_getLogs calls made (bisection retries included), for metrics and tests.
        self.get_logs_calls = 0

    @classmethod
    def from_url(
        cls, url: str, timeout: float, chain_id: int | None = None, **kwargs: int
    ) -> Web3ChainReader:
        """A reader over the JSON-RPC node at `url`."""
        return cls(connect(url, timeout), chain_id, **kwargs)

    @property
    def chain_id(self) -> int:
        """The node's chain id, checked once against the configured one."""
        if self._chain_id is None:
            actual = int(self.w3.eth.chain_id)
            expected = self._configured_chain_id
            # A wrong RPC URL would otherwise credit deposits to the wrong chain.
            if expected is not None and actual != expected:
                raise ChainIdMismatch(f"node serves chain {actual}, expected {expected}")
            self._chain_id = actual
        return self._chain_id

    def head(self) -> int:
        """Number of the latest block."""
        return int(self.w3.eth.block_number)

    def block(self, number: int) -> BlockRef | None:
        """The canonical block at `number`, or None past the head."""
        if number < 0:
            raise ValueError(f"block number must be >= 0, got {number}")
        try:
            blk = self.w3.eth.get_block(number)
        except BlockNotFound:
            return None
        return BlockRef(int(blk["number"]), hex0x(blk["hash"]))

    def gas_price_wei(self) -> int:
        """The node's eth_gasPrice."""
        return int(self.w3.eth.gas_price)

    def receipt_status(self, tx_hash: str) -> tuple[int, int] | None:
        """(status, block number) of a mined transaction, or None if not mined."""
        return receipt_status(self.w3, tx_hash)

    def transfers(
        self,
        from_block: int,
        to_block: int,
        token_addresses: Sequence[str] | None,
        to_addresses: Sequence[str],
    ) -> list[TransferLog]:
        """ERC-20 Transfer logs to `to_addresses` in [from_block, to_block]; any token if None."""
        recipients, tokens = _transfer_filter(from_block, token_addresses, to_addresses)
        # An empty filter must mean "nothing", never "everything" (which is what an
        # absent address/topic filter means to eth_getLogs).
        if from_block > to_block or not recipients or tokens == []:
            return []
        chain_id = self.chain_id
        topics = [_pad_address_topic(a) for a in recipients]
        raw: list[Any] = []
        for start in range(from_block, to_block + 1, self.max_block_span):
            end = min(start + self.max_block_span - 1, to_block)
            for chunk in _chunks(topics, self.max_addresses_per_call):
                raw.extend(self._get_logs(start, end, tokens, chunk))
        keyed: list[tuple[tuple[int, int, int], TransferLog]] = []
        for log in raw:
            t = self._decode(chain_id, log)
            if t is not None:
                # The transaction index keeps the order right where logIndex restarts
                # in every transaction (eth-tester).
                tx_index = int(log.get("transactionIndex") or 0)
                keyed.append(((t.block_number, tx_index, t.log_index), t))
        keyed.sort(key=lambda kt: kt[0])
        return [t for _, t in keyed]

    def _get_logs(
        self, start: int, end: int, tokens: list[str] | None, topics: Sequence[str]
    ) -> list[Any]:
        params: dict[str, Any] = {
            "fromBlock": start,
            "toBlock": end,
            "topics": [TRANSFER_TOPIC, None, list(topics)],
        }
        if tokens is not None:
            params["address"] = [_checksum(t) for t in tokens]
        self.get_logs_calls += 1
        try:
            return list(self.w3.eth.get_logs(cast(FilterParams, params)))
        except MethodUnavailable:
            raise
        except Web3RPCError:
            # Providers reject queries with too many results or too wide a range with
            # assorted messages; halving (range first, then addresses) gets under any cap.
            if end > start:
                mid = (start + end) // 2
                return self._get_logs(start, mid, tokens, topics) + self._get_logs(
                    mid + 1, end, tokens, topics
                )
            if len(topics) > 1:
                half = len(topics) // 2
                return self._get_logs(start, end, tokens, topics[:half]) + self._get_logs(
                    start, end, tokens, topics[half:]
                )
            raise

    @staticmethod
    def _is_erc20(log: Any) -> bool:
        return (
            not log.get("removed", False)
            and len(log["topics"]) == 3
            and len(HexBytes(log["data"])) == 32
        )

    def _decode(self, chain_id: int, log: Any) -> TransferLog | None:
        if not self._is_erc20(log):
            return None
        topics = log["topics"]
        return TransferLog(
            chain_id=chain_id,
            block_number=int(log["blockNumber"]),
            block_hash=hex0x(log["blockHash"]),
            tx_hash=hex0x(log["transactionHash"]),
            log_index=int(log["logIndex"]),
            token_address=_checksum(str(log["address"]).lower()),
            from_address=_topic_address(topics[1]),
            to_address=_topic_address(topics[2]),
            amount_raw=int.from_bytes(HexBytes(log["data"]), "big"),
        )


@dataclass(frozen=True, slots=True)
class _FakeTx:
    tx_hash: str
    token: str
    frm: str
    to: str
    amount_raw: int
    reverted: bool


@dataclass(slots=True)
class _FakeBlock:
    number: int
    hash: str
    txs: tuple[_FakeTx, ...] = ()
    logs: tuple[TransferLog, ...] = field(default=())


class InMemoryChain(ChainReader):
    """A deterministic pure-Python chain for unit tests: mine, transfer, reorg."""

    def __init__(self, chain_id: int = 1, *, gas_price_wei: int = 1_000_000_000) -> None:
        self.chain_id = chain_id
        #: Settable: what gas_price_wei() returns.
        self.gas_price = gas_price_wei
        self._lock = threading.RLock()
        self._fork = 0
        self._tx_counter = 0
        self._pending: list[_FakeTx] = []
        self._failures: list[BaseException] = []
        self._blocks: list[_FakeBlock] = []
        self._append_block(())

    # -- driving the fake -------------------------------------------------------------

    def transfer(
        self, token: str, frm: str, to: str, amount_raw: int, *, reverted: bool = False
    ) -> str:
        """Queue a token transfer for the next mined block; returns its tx hash."""
        if amount_raw < 0:
            raise ValueError("amount_raw must be >= 0")
        with self._lock:
            self._tx_counter += 1
            tx_hash = hex0x(keccak(text=f"{self.chain_id}:tx:{self._tx_counter}"))
            self._pending.append(
                _FakeTx(
                    tx_hash,
                    _checksum(_lower_address(token)),
                    _checksum(_lower_address(frm)),
                    _checksum(_lower_address(to)),
                    amount_raw,
                    reverted,
                )
            )
            return tx_hash

    def mine(self, n: int = 1) -> list[BlockRef]:
        """Mine `n` blocks; the first takes every queued transfer."""
        if n < 1:
            raise ValueError("n must be >= 1")
        with self._lock:
            mined = []
            for _ in range(n):
                txs, self._pending = tuple(self._pending), []
                mined.append(self._append_block(txs))
            return mined

    def reorg(self, depth: int, *, reinclude: bool = False) -> list[BlockRef]:
        """Replace the last `depth` blocks with empty ones of new hashes.

        Their transfers vanish, or with `reinclude` go back to the queue for the next
        mined block (as a real reorg usually re-includes them higher up).
        """
        with self._lock:
            if not 1 <= depth <= self.head():
                raise ValueError(f"depth must be in [1, {self.head()}], got {depth}")
            dropped = self._blocks[-depth:]
            del self._blocks[-depth:]
            # The fork counter goes into every new hash, so replaced heights differ.
            self._fork += 1
            if reinclude:
                self._pending = [tx for b in dropped for tx in b.txs] + self._pending
            return [self._append_block(()) for _ in range(depth)]

    def fail_next(self, exc: BaseException, times: int = 1) -> None:
        """Make the next `times` reader calls raise `exc` (a node outage, say)."""
        with self._lock:
            self._failures.extend([exc] * times)

    # -- ChainReader ------------------------------------------------------------------

    def head(self) -> int:
        """Number of the latest block."""
        with self._lock:
            self._maybe_fail()
            return len(self._blocks) - 1

    def block(self, number: int) -> BlockRef | None:
        """The canonical block at `number`, or None past the head."""
        if number < 0:
            raise ValueError(f"block number must be >= 0, got {number}")
        with self._lock:
            self._maybe_fail()
            if number >= len(self._blocks):
                return None
            b = self._blocks[number]
            return BlockRef(b.number, b.hash)

    def transfers(
        self,
        from_block: int,
        to_block: int,
        token_addresses: Sequence[str] | None,
        to_addresses: Sequence[str],
    ) -> list[TransferLog]:
        """ERC-20 Transfer logs to `to_addresses` in [from_block, to_block]; any token if None."""
        wanted, token_list = _transfer_filter(from_block, token_addresses, to_addresses)
        recipients = set(wanted)
        tokens = None if token_list is None else set(token_list)
        with self._lock:
            self._maybe_fail()
            return [
                log
                for b in self._blocks[from_block : to_block + 1]
                for log in b.logs
                if log.to_address.lower() in recipients
                and (tokens is None or log.token_address.lower() in tokens)
            ]

    def gas_price_wei(self) -> int:
        """The settable fake gas price."""
        with self._lock:
            self._maybe_fail()
            return self.gas_price

    def receipt_status(self, tx_hash: str) -> tuple[int, int] | None:
        """(status, block number) of a transfer on the canonical chain, or None."""
        wanted = hex0x(tx_hash)
        with self._lock:
            self._maybe_fail()
            for b in self._blocks:
                for tx in b.txs:
                    if tx.tx_hash == wanted:
                        return (0 if tx.reverted else 1), b.number
            return None

    # -- internals --------------------------------------------------------------------

    def _maybe_fail(self) -> None:
        if self._failures:
            raise self._failures.pop(0)

    def _append_block(self, txs: tuple[_FakeTx, ...]) -> BlockRef:
        number = len(self._blocks)
        parent = self._blocks[-1].hash if self._blocks else "0x" + "00" * 32
        seed = f"{self.chain_id}:{number}:{self._fork}:{parent}:" + ",".join(t.tx_hash for t in txs)
        block_hash = hex0x(keccak(text=seed))
        logs: list[TransferLog] = []
        for tx in txs:
            if tx.reverted:
                continue  # a reverted transfer leaves a receipt but no log
            logs.append(
                TransferLog(
                    chain_id=self.chain_id,
                    block_number=number,
                    block_hash=block_hash,
                    tx_hash=tx.tx_hash,
                    log_index=len(logs),  # block-wide, as on a real node
                    token_address=tx.token,
                    from_address=tx.frm,
                    to_address=tx.to,
                    amount_raw=tx.amount_raw,
                )
            )
        self._blocks.append(_FakeBlock(number, block_hash, txs, tuple(logs)))
        return BlockRef(number, block_hash)
