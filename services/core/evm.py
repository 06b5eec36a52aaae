"""Reading a chain behind a small interface: a JSON-RPC reader and a fake chain for tests.

Paying (signing and sending transfers) is `services.core.hot_wallet`.

`ChainReader` is all the chain watcher needs from a node, so it can be tested on
`InMemoryChain` and run on `Web3ChainReader` (JSON-RPC) in production.

Notes for callers (they hold for every reader here):

- `transfer_logs()` asks for the `Transfer` logs of given token contracts only (never a
  list of recipients: the watcher matches recipients in memory, so one call covers a
  range whatever the number of deposit addresses). It returns only ERC-20-shaped logs
  (3 topics, 32-byte data); ERC-721 `Transfer` shares topic0 but has 4 topics.
- Addresses in a `TransferLog` are lowercase: checksumming costs a keccak, and most logs
  of a block are not deposits. Checksum the few that are.
- `log_index` is the position in the block, as real nodes number it: a reorg that
  re-mines a transaction elsewhere changes it. A transfer's identity is its transaction
  and its place among the transaction's own transfers (see deposits/identity.py).
- A range is read in several calls, so a reorg can happen mid-scan, and a load-balanced
  provider may answer from a node behind the others (`[]` past its head, no error):
  the watcher checks block hashes, asks by block hash, and checks each block's
  `logsBloom` (`block_headers`) before trusting a range.
- JSON-RPC answers are decoded from the wire directly (not through web3's result
  formatters), which is most of the cost of a busy block.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import requests
import urllib3
from eth_hash.auto import keccak as keccak_256
from eth_utils import keccak
from hexbytes import HexBytes
from requests.utils import get_environ_proxies
from web3 import HTTPProvider, Web3
from web3.exceptions import TransactionIndexingInProgress, TransactionNotFound
from web3.middleware import ExtraDataToPOAMiddleware
from web3.types import RPCEndpoint

from services.core.checksums import checksum

#: topic0 of `Transfer(address,address,uint256)` (ERC-20 and ERC-721 alike).
TRANSFER_TOPIC = "0x" + keccak(text="Transfer(address,address,uint256)").hex()

#: Default most blocks per eth_getLogs (common providers' span limits).
DEFAULT_MAX_BLOCK_SPAN = 1_000
#: Headers asked for in one JSON-RPC batch.
HEADER_BATCH = 100
#: JSON-RPC timeout of a reader whose provider names none (web3's own default).
DEFAULT_TIMEOUT_S = 30.0
#: Tries of a reading call after the first (`read_session`).
READ_RETRIES = 2
#: HTTP answers worth another try of a reading call.
READ_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class BlockRef:
    number: int
    hash: str


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """A canonical block's hash and its `logsBloom` (an int; None when the node gave none)."""

    number: int
    hash: str
    logs_bloom: int | None


def bloom_mask(item: bytes) -> int:
    """The three bits an item (a log's address or a topic) sets in a block's `logsBloom`
    (the yellow paper's M3:2048: from keccak256(item), bytes 0-1, 2-3, 4-5, mod 2048)."""
    digest = keccak_256(item)
    mask = 0
    for i in (0, 2, 4):
        mask |= 1 << (((digest[i] << 8) | digest[i + 1]) & 2047)
    return mask


def bloom_of(logs: Iterable[TransferLog]) -> int:
    """The `logsBloom` of a block holding these Transfer logs (for the fake chain)."""
    bloom = 0
    for log in logs:
        bloom |= bloom_mask(bytes.fromhex(log.token_address[2:]))
        bloom |= TRANSFER_BLOOM
        for address in (log.from_address, log.to_address):
            bloom |= bloom_mask(bytes(12) + bytes.fromhex(address[2:]))
    return bloom


@dataclass(frozen=True, slots=True)
class TransferLog:
    """An ERC-20 `Transfer` log; addresses and hashes lowercase 0x-hex."""

    chain_id: int
    block_number: int
    block_hash: str
    tx_hash: str
    log_index: int
    token_address: str
    from_address: str
    to_address: str
    amount_raw: int
    #: The transaction's position in its block.
    tx_index: int = 0


#: The Transfer topic's bits in a block's logsBloom.
TRANSFER_BLOOM = bloom_mask(bytes.fromhex(TRANSFER_TOPIC[2:]))
#: Calldata of ERC-20 `decimals()`.
DECIMALS_CALL = "0x" + keccak(text="decimals()")[:4].hex()


@dataclass(frozen=True, slots=True)
class TransactionFacts:
    """What a node says of a transaction: its sender, nonce, calldata and block."""

    hash: str
    sender: str
    nonce: int
    input: bytes
    #: None while it is pending.
    block_number: int | None


class ChainIdMismatch(RuntimeError):
    """The node serves a different chain than the one it was configured for."""

    def __init__(self, expected: int, actual: int) -> None:
        super().__init__(f"node serves chain {actual}, expected {expected}")
        self.expected = expected
        self.actual = actual


class NodeError(RuntimeError):
    """The node answered a call with a JSON-RPC error."""

    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"{method}: {code} {message}")
        self.code = code
        self.message = message


class MalformedAnswer(RuntimeError):
    """What came back is not the JSON-RPC answer to the call: a fault of the transport
    (like a dropped connection or an HTTP error: what happened is unknown), never a
    `NodeError`, which is the node's own answer."""

    def __init__(self, method: str, detail: str) -> None:
        super().__init__(f"{method}: {detail[:200]}")
        self.method = method


class ChainReader(Protocol):
    """What the chain watcher reads from one chain."""

    @property
    def chain_id(self) -> int:
        """The chain the node serves."""
        ...

    def head(self) -> int:
        """Number of the latest block."""
        ...

    def block(self, number: int) -> BlockRef | None:
        """The canonical block at `number`, or None past the head."""
        ...

    def block_hashes(self, numbers: Iterable[int]) -> dict[int, str]:
        """Canonical hashes at these heights (heights past the head are left out)."""
        ...

    def block_headers(self, numbers: Iterable[int]) -> dict[int, BlockHeader]:
        """Canonical headers (hash, logsBloom) at these heights (past the head: left out)."""
        ...

    def block_time(self, number: int) -> int:
        """A canonical block's timestamp (Unix seconds)."""
        ...

    def tagged_block(self, tag: str) -> BlockRef | None:
        """The block a tag (`finalized`, `safe`) names, or None when the node lacks it."""
        ...

    def transfer_logs(
        self, from_block: int, to_block: int, tokens: Sequence[str] | None
    ) -> list[TransferLog]:
        """ERC-20 Transfer logs of `tokens` (None: any contract) in [from_block, to_block]."""
        ...

    def block_transfer_logs(
        self, block_hash: str, tokens: Sequence[str] | None
    ) -> list[TransferLog] | None:
        """The Transfer logs of one block asked by its hash; None when the node does not
        have that block (a node behind answers an error here, never a silent `[]`)."""
        ...

    def gas_price_wei(self) -> int:
        """The node's current gas price."""
        ...

    def receipt_status(self, tx_hash: str) -> tuple[int, int] | None:
        """(status, block number) of a mined transaction, or None if not mined."""
        ...


def first_block_at(reader: ChainReader, when: datetime) -> int:
    """The first block whose timestamp is at or after `when` (head + 1 if none): a
    binary search, about 25 calls on a chain of 20 million blocks.

    A block's timestamp is whole seconds, `when` is not: a block stamped in the same
    second but before `when` (T < T.5) is before it, so the two are compared exactly,
    never with `when` cut to its second (that put a payout mined a moment before a
    reconcile window's end outside the window).
    """
    target = when.timestamp()
    lo, hi = 0, reader.head() + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if reader.block_time(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


_ADDRESS_RE = re.compile(r"0x[0-9a-fA-F]{40}")


def _lower_address(value: str) -> str:
    if not isinstance(value, str) or not _ADDRESS_RE.fullmatch(value):
        raise ValueError(f"not a 20-byte 0x-hex address: {value!r}")
    return value.lower()


def token_list(tokens: Sequence[str] | None) -> list[str] | None:
    """Sorted, de-duplicated lowercase token addresses (None: any contract)."""
    if tokens is None:
        return None
    # A bare string is a Sequence[str] too; iterating it would query single characters.
    if isinstance(tokens, str):
        raise TypeError("tokens must be a sequence of addresses, not a string")
    return sorted({_lower_address(t) for t in tokens})


def hex0x(value: Any) -> str:
    """Bytes or hex text as lowercase 0x-hex."""
    # hexbytes >= 1 dropped the 0x from .hex(); normalise everything to lowercase 0x-hex.
    if isinstance(value, str):
        return value.lower() if value.startswith("0x") else "0x" + value.lower()
    return HexBytes(value).to_0x_hex()


def decode_transfer(chain_id: int, log: dict[str, Any]) -> TransferLog | None:
    """A wire-format log as a TransferLog, or None when it is not an ERC-20 Transfer."""
    topics = log.get("topics") or ()
    data = log.get("data") or ""
    if len(topics) != 3 or len(data) != 66 or log.get("removed"):
        return None
    # Positional (the fields' order): keywords cost a tenth of a busy block's decoding.
    return TransferLog(
        chain_id,
        int(log["blockNumber"], 16),
        log["blockHash"].lower(),
        log["transactionHash"].lower(),
        int(log["logIndex"], 16),
        log["address"].lower(),
        "0x" + topics[1][-40:].lower(),
        "0x" + topics[2][-40:].lower(),
        int(data, 16),
        int(log["transactionIndex"], 16),
    )


def read_session(url: str) -> requests.Session:
    """The HTTP session of a reader's provider for the node at `url`: a read whose
    connection fails or drops, or that is answered 429 or 5xx, is tried twice more (at
    once, then 0.2 s later; a Retry-After is not waited for: the watcher's next round is
    the longer wait), single calls and batches alike. Reads only: a broadcast is never
    sent again by transport (the hot wallet's provider has no retries; the payment
    logic decides).

    What requests takes from the environment on every call (the proxy settings, the CA
    bundle: a sixth of a call's CPU, and a watcher round is a dozen calls) is read
    once, here, the same way (`get_environ_proxies`, `REQUESTS_CA_BUNDLE`/`CURL_CA_BUNDLE`).
    """
    retry = urllib3.Retry(
        total=READ_RETRIES,
        connect=READ_RETRIES,
        read=READ_RETRIES,
        status=READ_RETRIES,
        other=0,
        allowed_methods=None,  # POST too: every call made on this session is a read
        status_forcelist=READ_RETRY_STATUSES,
        backoff_factor=0.1,
        respect_retry_after_header=False,
        raise_on_status=False,  # the last answer's status is raised by web3 (HTTPError)
    )
    adapter = requests.adapters.HTTPAdapter(max_retries=retry, pool_maxsize=4)
    session = requests.Session()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.trust_env = False
    session.proxies = get_environ_proxies(url)
    session.verify = (
        os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    )
    return session


def connect(url: str, timeout: float, *, session: requests.Session | None = None) -> Web3:
    """A Web3 over HTTP JSON-RPC that tolerates proof-of-authority block headers.

    With `session` (`read_session`), its requests go through it and web3's own retries
    are off (the session's are the reader's); without, web3's defaults.
    """
    if session is None:
        provider = HTTPProvider(url, request_kwargs={"timeout": timeout})
    else:
        provider = HTTPProvider(
            url,
            request_kwargs={"timeout": timeout},
            session=session,
            exception_retry_configuration=None,
        )
    w3 = Web3(provider)
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
    """ChainReader over a JSON-RPC node through web3's `HTTPProvider`, reading the wire
    JSON it returns directly (`make_request`, `make_batch_request`: no result formatters).

    The line between the two kinds of failure stays exact: a JSON-RPC error object is a
    `NodeError` (the node answered); anything else (a connection that failed or dropped,
    a timeout, an HTTP error status, an answer that is not the call's) raises the
    transport's own exception or `MalformedAnswer`, never a `NodeError`: unknown.
    """

    def __init__(
        self,
        w3: Web3,
        chain_id: int | None = None,
        *,
        max_block_span: int = DEFAULT_MAX_BLOCK_SPAN,
    ) -> None:
        if max_block_span < 1:
            raise ValueError("max_block_span must be >= 1")
        self.w3 = w3
        provider = w3.provider
        if not isinstance(provider, HTTPProvider) or provider.endpoint_uri is None:
            raise TypeError("a Web3ChainReader reads over HTTP(S): give it an HTTPProvider")
        self.provider: HTTPProvider = provider
        self.max_block_span = max_block_span
        self._configured_chain_id = chain_id
        self._chain_id: int | None = None
        #: eth_getLogs calls made (bisection retries included), for metrics and tests.
        self.get_logs_calls = 0

    @classmethod
    def from_url(
        cls, url: str, timeout: float, chain_id: int | None = None, **kwargs: int
    ) -> Web3ChainReader:
        """A reader over the JSON-RPC node at `url` (its calls retried: `read_session`)."""
        return cls(connect(url, timeout, session=read_session(url)), chain_id, **kwargs)

    def _call(self, method: str, params: list[Any]) -> Any:
        response = self.provider.make_request(RPCEndpoint(method), params)
        if not isinstance(response, dict) or not ("result" in response or "error" in response):
            raise MalformedAnswer(method, f"not a JSON-RPC response: {response!r}")
        error = response.get("error")
        if error is not None:
            if isinstance(error, dict):
                raise NodeError(method, int(error.get("code", 0)), str(error.get("message")))
            raise NodeError(method, 0, str(error))
        return response.get("result")

    @property
    def chain_id(self) -> int:
        """The node's chain id, checked once against the configured one."""
        if self._chain_id is None:
            actual = int(self._call("eth_chainId", []), 16)
            expected = self._configured_chain_id
            # A wrong RPC URL would otherwise credit deposits to the wrong chain.
            if expected is not None and actual != expected:
                raise ChainIdMismatch(expected, actual)
            self._chain_id = actual
        return self._chain_id

    def head(self) -> int:
        """Number of the latest block."""
        return int(self._call("eth_blockNumber", []), 16)

    def block(self, number: int) -> BlockRef | None:
        """The canonical block at `number`, or None past the head."""
        if number < 0:
            raise ValueError(f"block number must be >= 0, got {number}")
        blk = self._call("eth_getBlockByNumber", [hex(number), False])
        return None if blk is None else BlockRef(int(blk["number"], 16), blk["hash"].lower())

    def block_hashes(self, numbers: Iterable[int]) -> dict[int, str]:
        """Canonical hashes at these heights, asked in JSON-RPC batches."""
        return {n: h.hash for n, h in self.block_headers(numbers).items()}

    def block_headers(self, numbers: Iterable[int]) -> dict[int, BlockHeader]:
        """Canonical headers at these heights, asked in JSON-RPC batches."""
        wanted = sorted(set(numbers))
        headers: dict[int, BlockHeader] = {}
        for i in range(0, len(wanted), HEADER_BATCH):
            chunk = wanted[i : i + HEADER_BATCH]
            answers = None
            if len(chunk) > 1:
                answers = self._batch("eth_getBlockByNumber", [[hex(n), False] for n in chunk])
            if answers is None:  # one block, or the provider refused the batch
                for n in chunk:
                    if n < 0:
                        raise ValueError(f"block number must be >= 0, got {n}")
                    header = _header(self._call("eth_getBlockByNumber", [hex(n), False]))
                    if header is not None:
                        headers[n] = header
                continue
            for n, answer in zip(chunk, answers, strict=True):
                if answer.get("error") is not None:
                    raise NodeError("eth_getBlockByNumber", 0, str(answer["error"]))
                header = _header(answer.get("result"))
                if header is not None:
                    if header.number != n:  # answers matched to calls by id: check it
                        raise MalformedAnswer(
                            "eth_getBlockByNumber", f"block {header.number} asked for {n}"
                        )
                    headers[n] = header
        return headers

    def _batch(self, method: str, params: Sequence[list[Any]]) -> list[dict[str, Any]] | None:
        """Calls of one method in one JSON-RPC batch, answers in the order asked (web3
        orders them by id); None when the node refuses batches (one error object)."""
        answers = self.provider.make_batch_request([(RPCEndpoint(method), p) for p in params])
        if not isinstance(answers, list):
            return None
        if len(answers) != len(params) or not all(isinstance(a, dict) for a in answers):
            raise MalformedAnswer(method, f"{len(params)} calls batched, answered {answers!r}")
        return [dict(a) for a in answers]

    def tagged_block(self, tag: str) -> BlockRef | None:
        """The `finalized` / `safe` block, or None when the node does not offer the tag."""
        try:
            blk = self._call("eth_getBlockByNumber", [tag, False])
        except NodeError:
            return None
        return None if blk is None else BlockRef(int(blk["number"], 16), blk["hash"].lower())

    def gas_price_wei(self) -> int:
        """The node's eth_gasPrice."""
        return int(self._call("eth_gasPrice", []), 16)

    def receipt_status(self, tx_hash: str) -> tuple[int, int] | None:
        """(status, block number) of a mined transaction, or None if not mined."""
        return receipt_status(self.w3, tx_hash)

    def transfer_logs(
        self,
        from_block: int,
        to_block: int,
        tokens: Sequence[str] | None,
        *,
        sender: str | None = None,
    ) -> list[TransferLog]:
        """ERC-20 Transfer logs of `tokens` (None: any contract) in [from_block, to_block];
        with `sender`, only its transfers (the node filters on the indexed `from`)."""
        if from_block < 0:
            raise ValueError(f"from_block must be >= 0, got {from_block}")
        contracts = token_list(tokens)
        # An empty list must mean "nothing", never "everything" (what an absent address
        # filter means to eth_getLogs).
        if from_block > to_block or contracts == []:
            return []
        chain_id = self.chain_id
        topics: list[Any] = [TRANSFER_TOPIC]
        if sender is not None:
            topics.append("0x" + "00" * 12 + _lower_address(sender)[2:])
        logs: list[TransferLog] = []
        for start in range(from_block, to_block + 1, self.max_block_span):
            end = min(start + self.max_block_span - 1, to_block)
            span = {"fromBlock": hex(start), "toBlock": hex(end), "topics": topics}
            for raw in self._get_logs(span, contracts):
                transfer = decode_transfer(chain_id, raw)
                if transfer is not None:
                    logs.append(transfer)
        return _unique(logs)

    def block_transfer_logs(
        self, block_hash: str, tokens: Sequence[str] | None
    ) -> list[TransferLog] | None:
        """One block's Transfer logs by its hash; None when the node answers an error."""
        contracts = token_list(tokens)
        if contracts == []:
            return []
        chain_id = self.chain_id
        params: dict[str, Any] = {"blockHash": block_hash, "topics": [TRANSFER_TOPIC]}
        if contracts is not None:
            params["address"] = [checksum(t) for t in contracts]
        self.get_logs_calls += 1
        try:
            raw = self._call("eth_getLogs", [params])
        except NodeError:
            return None
        return _unique([t for t in (decode_transfer(chain_id, r) for r in raw) if t is not None])

    def transaction(self, tx_hash: str) -> TransactionFacts | None:
        """A transaction's sender, nonce and calldata (None: the node does not know it)."""
        tx = self._call("eth_getTransactionByHash", [tx_hash])
        if tx is None:
            return None
        block = tx.get("blockNumber")
        return TransactionFacts(
            tx["hash"].lower(),
            tx["from"].lower(),
            int(tx["nonce"], 16),
            bytes.fromhex(tx["input"][2:]),
            None if block is None else int(block, 16),
        )

    def block_time(self, number: int) -> int:
        """A canonical block's timestamp (Unix seconds)."""
        blk = self._call("eth_getBlockByNumber", [hex(number), False])
        if blk is None:
            raise NodeError("eth_getBlockByNumber", 0, f"no block {number}")
        return int(blk["timestamp"], 16)

    def token_decimals(self, token: str) -> int | None:
        """The token contract's `decimals()` (None: no answer, e.g. no contract there)."""
        answer = self._call("eth_call", [{"to": checksum(token), "data": DECIMALS_CALL}, "latest"])
        if not isinstance(answer, str) or len(answer) != 66:
            return None
        return int(answer, 16)

    def _get_logs(self, span: dict[str, Any], contracts: list[str] | None) -> list[Any]:
        params: dict[str, Any] = {"topics": [TRANSFER_TOPIC], **span}
        if contracts is not None:
            params["address"] = [checksum(t) for t in contracts]
        self.get_logs_calls += 1
        try:
            return list(self._call("eth_getLogs", [params]))
        except NodeError as exc:
            # Providers refuse too many results or too wide a range with assorted
            # messages; halving the range gets under any cap. -32601: no such method.
            start, end = int(span["fromBlock"], 16), int(span["toBlock"], 16)
            if exc.code == -32601 or end <= start:
                raise
            mid = (start + end) // 2
            return self._get_logs(
                {**span, "fromBlock": hex(start), "toBlock": hex(mid)}, contracts
            ) + self._get_logs({**span, "fromBlock": hex(mid + 1), "toBlock": hex(end)}, contracts)


def _header(blk: dict[str, Any] | None) -> BlockHeader | None:
    if blk is None:
        return None
    bloom = blk.get("logsBloom")
    return BlockHeader(
        int(blk["number"], 16), blk["hash"].lower(), None if bloom is None else int(bloom, 16)
    )


def _position(log: TransferLog) -> tuple[int, int]:
    return (log.block_number, log.log_index)


def _unique(logs: list[TransferLog]) -> list[TransferLog]:
    """Logs in block order, each once. A log is its block and its index there: a provider
    that answers one twice (some have, at the edges of the spans they split a range
    into) would otherwise make it a second transfer of its transaction. Two different
    logs at one place are a node contradicting itself: refused."""
    seen: dict[tuple[str, int], TransferLog] = {}
    for log in logs:
        key = (log.block_hash, log.log_index)
        prior = seen.setdefault(key, log)
        if prior is not log and prior != log:
            raise NodeError(
                "eth_getLogs", 0, f"two different logs at index {key[1]} of block {key[0]}"
            )
    return sorted(seen.values(), key=_position)


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
    logs_bloom: int = 0
    #: Unix seconds, never under the parent's.
    timestamp: int = 0


class InMemoryChain(ChainReader):
    """A deterministic pure-Python chain for tests and benchmarks: mine, transfer, reorg.

    `finalized_depth` / `safe_depth`: the node offers that tag at that many blocks under
    the head (None: it does not offer it, as on a node or chain without finality).
    """

    def __init__(
        self,
        chain_id: int = 1,
        *,
        gas_price_wei: int = 1_000_000_000,
        finalized_depth: int | None = None,
        safe_depth: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._chain_id = chain_id
        #: What a block mined now is stamped with (Unix seconds).
        self._clock = clock
        #: Settable: what gas_price_wei() returns.
        self.gas_price = gas_price_wei
        self.tag_depths: dict[str, int | None] = {
            "finalized": finalized_depth,
            "safe": safe_depth,
        }
        self._lock = threading.RLock()
        self._fork = 0
        self._tx_counter = 0
        self._pending: list[_FakeTx] = []
        #: Transfers reorgs dropped (not re-queued), for `replay`.
        self._dropped: dict[str, _FakeTx] = {}
        self._failures: list[BaseException] = []
        self._blocks: list[_FakeBlock] = []
        self._append_block(())

    @property
    def chain_id(self) -> int:
        return self._chain_id

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
                    _lower_address(token),
                    _lower_address(frm),
                    _lower_address(to),
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

    def reorg(
        self, depth: int, *, reinclude: bool = False, length: int | None = None
    ) -> list[BlockRef]:
        """Replace the last `depth` blocks with `length` (default `depth`) empty ones.

        Their transfers vanish, or with `reinclude` go back to the queue for the next
        mined block (as a real reorg usually re-includes them higher up).
        """
        length = depth if length is None else length
        with self._lock:
            if not 1 <= depth <= self.head():
                raise ValueError(f"depth must be in [1, {self.head()}], got {depth}")
            dropped = self._blocks[-depth:]
            del self._blocks[-depth:]
            # The fork counter goes into every new hash, so replaced heights differ.
            self._fork += 1
            if reinclude:
                self._pending = [tx for b in dropped for tx in b.txs] + self._pending
            else:
                self._dropped.update((tx.tx_hash, tx) for b in dropped for tx in b.txs)
            return [self._append_block(()) for _ in range(length)]

    def replay(self, tx_hash: str) -> None:
        """Queue again a transfer a reorg dropped (mined later, as mempools do)."""
        wanted = hex0x(tx_hash)
        with self._lock:
            if any(tx.tx_hash == wanted for b in self._blocks for tx in b.txs):
                raise ValueError(f"{tx_hash} is on the chain")
            try:
                self._pending.append(self._dropped.pop(wanted))
            except KeyError:
                raise ValueError(f"{tx_hash} was not dropped by a reorg") from None

    def mark_bloom(self, number: int, item: bytes) -> None:
        """Add an item to block `number`'s logsBloom without a Transfer log: what another
        log (a token's Approval, say) puts there."""
        with self._lock:
            self._blocks[number].logs_bloom |= bloom_mask(item)

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

    def block_hashes(self, numbers: Iterable[int]) -> dict[int, str]:
        """Canonical hashes at these heights (heights past the head are left out)."""
        with self._lock:
            self._maybe_fail()
            blocks = self._blocks
            return {n: blocks[n].hash for n in numbers if 0 <= n < len(blocks)}

    def block_headers(self, numbers: Iterable[int]) -> dict[int, BlockHeader]:
        """Canonical headers at these heights (heights past the head are left out)."""
        with self._lock:
            self._maybe_fail()
            blocks = self._blocks
            return {
                n: BlockHeader(n, blocks[n].hash, blocks[n].logs_bloom)
                for n in numbers
                if 0 <= n < len(blocks)
            }

    def block_time(self, number: int) -> int:
        """A canonical block's timestamp (Unix seconds)."""
        with self._lock:
            self._maybe_fail()
            if not 0 <= number < len(self._blocks):
                raise NodeError("eth_getBlockByNumber", 0, f"no block {number}")
            return self._blocks[number].timestamp

    def tagged_block(self, tag: str) -> BlockRef | None:
        """The tagged block, when this fake offers the tag."""
        depth = self.tag_depths.get(tag)
        if depth is None:
            return None
        with self._lock:
            self._maybe_fail()
            b = self._blocks[max(0, len(self._blocks) - 1 - depth)]
            return BlockRef(b.number, b.hash)

    def transfer_logs(
        self, from_block: int, to_block: int, tokens: Sequence[str] | None
    ) -> list[TransferLog]:
        """ERC-20 Transfer logs of `tokens` (None: any contract) in [from_block, to_block]."""
        if from_block < 0:
            raise ValueError(f"from_block must be >= 0, got {from_block}")
        contracts = token_list(tokens)
        if contracts == []:
            return []
        wanted = None if contracts is None else set(contracts)
        with self._lock:
            self._maybe_fail()
            return [
                log
                for b in self._blocks[from_block : to_block + 1]
                for log in b.logs
                if wanted is None or log.token_address in wanted
            ]

    def block_transfer_logs(
        self, block_hash: str, tokens: Sequence[str] | None
    ) -> list[TransferLog] | None:
        """A canonical block's Transfer logs by hash; None for a hash not on the chain."""
        contracts = token_list(tokens)
        wanted = None if contracts is None else set(contracts)
        with self._lock:
            self._maybe_fail()
            for b in reversed(self._blocks):
                if b.hash == block_hash:
                    return [log for log in b.logs if wanted is None or log.token_address in wanted]
            return None

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
        for index, tx in enumerate(txs):
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
                    tx_index=index,
                )
            )
        stamp = max(int(self._clock()), self._blocks[-1].timestamp if self._blocks else 0)
        self._blocks.append(_FakeBlock(number, block_hash, txs, tuple(logs), bloom_of(logs), stamp))
        return BlockRef(number, block_hash)
