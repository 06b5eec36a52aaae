"""Web3ChainReader on an in-process EVM (eth-tester + py-evm).

No database: these run everywhere, offline, in about a second.
"""

from __future__ import annotations

from typing import Any

import pytest
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3.exceptions import Web3RPCError

from services.core.addresses import AddressDeriver, private_key_for
from services.core.evm import (
    TRANSFER_TOPIC,
    ChainIdMismatch,
    ChainReader,
    TransferLog,
    Web3ChainReader,
)
from tests.support import keys
from tests.support.evm_chain import EvmChain

CHAIN_IN_PATH = 8453  # derivation path segment; the tester's own chain id differs


@pytest.fixture
def chain() -> EvmChain:
    return EvmChain()


@pytest.fixture
def deposits() -> list[str]:
    deriver = AddressDeriver(keys.test_xpub())
    return [deriver.derive(CHAIN_IN_PATH, i) for i in range(3)]


def test_transfer_topic() -> None:
    assert TRANSFER_TOPIC == "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"


def test_transfers_returns_exactly_the_listed_deposits(
    chain: EvmChain, deposits: list[str]
) -> None:
    usdc = chain.deploy_token("USDC", 6)
    payer, other = chain.accounts[1], chain.accounts[2]
    chain.mint(usdc, payer.address, 10**12)
    chain.mint(usdc, other.address, 10**12)
    outsider = chain.accounts[9].address

    # Block A: two deposits from one sender, one from another, one to a non-listed address.
    a0 = chain.transfer(usdc, payer.address, deposits[0], 1_000_000)
    a1 = chain.transfer(usdc, payer.address, outsider, 2_000_000)
    a2 = chain.transfer(usdc, other.address, deposits[1], 3_000_000)
    a3 = chain.transfer(usdc, payer.address, deposits[0], 4_000_000)
    (block_a,) = chain.mine()
    chain.mine(2)
    # Block B: the third deposit address.
    b0 = chain.transfer(usdc, other.address, deposits[2], 5_000_000)
    (block_b,) = chain.mine()
    head = chain.head()
    number_a, number_b = head - 3, head

    reader: ChainReader = chain.reader()
    logs = reader.transfers(0, head, [usdc], deposits)

    def log(number: int, block: str, tx: str, frm: str, to: str, amount: int) -> TransferLog:
        return TransferLog(chain.chain_id, number, block, tx, 0, usdc, frm, to, amount)

    assert logs == [
        log(number_a, block_a, a0, payer.address, deposits[0], 1_000_000),
        log(number_a, block_a, a2, other.address, deposits[1], 3_000_000),
        log(number_a, block_a, a3, payer.address, deposits[0], 4_000_000),
        log(number_b, block_b, b0, other.address, deposits[2], 5_000_000),
    ]
    assert a1 not in {log.tx_hash for log in logs}
    ref_a = reader.block(number_a)
    assert ref_a is not None and ref_a.hash == block_a
    assert reader.block(head + 1) is None
    # Windows split the result without losing or duplicating anything.
    assert reader.transfers(0, number_a, [usdc], deposits) == logs[:3]
    assert reader.transfers(number_a + 1, head, [usdc], deposits) == logs[3:]
    assert reader.transfers(0, head, [usdc], [deposits[2].lower()]) == logs[3:]
    assert reader.transfers(0, head, [usdc], []) == []
    assert reader.transfers(0, head, [], deposits) == []


def test_unsupported_token_only_when_any_token_is_asked(
    chain: EvmChain, deposits: list[str]
) -> None:
    usdc = chain.deploy_token("USDC", 6)
    junk = chain.deploy_token("JUNK", 18)
    payer = chain.accounts[1]
    chain.mint(usdc, payer.address, 10**9)
    chain.mint(junk, payer.address, 10**24)
    chain.transfer(usdc, payer.address, deposits[0], 7)
    junk_tx = chain.transfer(junk, payer.address, deposits[1], 10**18)
    chain.mine()
    reader = chain.reader()
    head = chain.head()

    supported = reader.transfers(0, head, [usdc], deposits)
    assert [log.token_address for log in supported] == [usdc]
    anything = reader.transfers(0, head, None, deposits)
    assert [(log.token_address, log.tx_hash) for log in anything] == [
        (usdc, supported[0].tx_hash),
        (junk, junk_tx),
    ]
    assert anything[1].amount_raw == 10**18


def test_chunked_queries_give_the_same_answer(chain: EvmChain) -> None:
    usdc = chain.deploy_token("USDC", 6)
    payer = chain.accounts[1]
    chain.mint(usdc, payer.address, 10**9)
    recipients = [a.address for a in chain.accounts[2:9]]
    for i, to in enumerate(recipients):
        chain.transfer(usdc, payer.address, to, i + 1)
        if i % 2:
            chain.mine()
    chain.mine()
    head = chain.head()

    whole = chain.reader().transfers(0, head, [usdc], recipients)
    assert [log.amount_raw for log in whole] == [1, 2, 3, 4, 5, 6, 7]
    small = chain.reader(max_block_span=2, max_addresses_per_call=3)
    assert small.transfers(0, head, [usdc], recipients) == whole
    blocks = head + 1
    assert small.get_logs_calls == -(-blocks // 2) * 3  # ceil(blocks/2) x ceil(7/3)


def test_node_limit_errors_are_bisected(chain: EvmChain, monkeypatch: pytest.MonkeyPatch) -> None:
    usdc = chain.deploy_token("USDC", 6)
    payer = chain.accounts[1]
    chain.mint(usdc, payer.address, 10**9)
    recipients = [a.address for a in chain.accounts[2:6]]
    for to in recipients:
        chain.transfer(usdc, payer.address, to, 1, mine=True)
    reader = chain.reader()
    expected = reader.transfers(0, chain.head(), [usdc], recipients)
    assert len(expected) == 4

    real_get_logs = chain.w3.eth.get_logs

    def limited(params: Any) -> Any:
        # A provider that refuses more than 2 blocks or more than 1 address per query.
        if params["toBlock"] - params["fromBlock"] > 1 or len(params["topics"][2]) > 1:
            raise Web3RPCError("query exceeds limit")
        return real_get_logs(params)

    monkeypatch.setattr(chain.w3.eth, "get_logs", limited)
    assert reader.transfers(0, chain.head(), [usdc], recipients) == expected


def test_reorg_changes_hashes_and_drops_transfers(chain: EvmChain, deposits: list[str]) -> None:
    usdc = chain.deploy_token("USDC", 6)
    payer = chain.accounts[1]
    chain.mint(usdc, payer.address, 10**9)
    reader = chain.reader()
    fork_point = chain.head()
    snap = chain.snapshot()

    tx = chain.transfer(usdc, payer.address, deposits[0], 42)
    chain.mine(3)
    old = [chain.block_hash(n) for n in range(fork_point + 1, fork_point + 4)]
    assert reader.receipt_status(tx) == (1, fork_point + 1)
    assert len(reader.transfers(0, chain.head(), [usdc], deposits)) == 1

    chain.revert(snap)
    assert chain.head() == fork_point
    assert reader.block(fork_point + 1) is None
    chain.mine(3)
    new = [chain.block_hash(n) for n in range(fork_point + 1, fork_point + 4)]
    assert all(a != b for a, b in zip(old, new, strict=True))
    assert reader.transfers(0, chain.head(), [usdc], deposits) == []
    assert reader.receipt_status(tx) is None


def test_sweep_from_a_derived_deposit_address(chain: EvmChain, deposits: list[str]) -> None:
    # The xprv side signs for an address the xpub side handed out (the sweeper's path).
    usdc = chain.deploy_token("USDC", 6)
    chain.mint(usdc, deposits[0], 500)
    key = private_key_for(keys.test_xprv(), CHAIN_IN_PATH, 0)
    tx = chain.transfer(usdc, key, chain.accounts[7].address, 500, mine=True)
    assert chain.reader().receipt_status(tx) == (1, chain.head())
    assert chain.balance_of(usdc, deposits[0]) == 0


def test_gas_price_receipts_and_chain_id(chain: EvmChain) -> None:
    reader = chain.reader()
    assert reader.gas_price_wei() > 0
    assert reader.receipt_status("0x" + "00" * 32) is None
    usdc = chain.deploy_token("USDC", 6)
    chain.mint(usdc, chain.accounts[1].address, 10)
    queued = chain.transfer(usdc, chain.accounts[1].address, chain.accounts[2].address, 1)
    assert reader.receipt_status(queued) is None  # not mined yet
    chain.mine()
    assert reader.receipt_status(queued) == (1, chain.head())

    assert Web3ChainReader(chain.w3).chain_id == chain.chain_id
    wrong = Web3ChainReader(chain.w3, chain_id=1)
    with pytest.raises(ChainIdMismatch):
        wrong.transfers(0, 1, None, [chain.accounts[2].address])


class _CannedEth:
    """Just enough of `w3.eth` to feed Web3ChainReader hand-made logs."""

    chain_id = 10

    def __init__(self, logs: list[dict[str, Any]]) -> None:
        self.logs = logs

    def get_logs(self, params: Any) -> list[dict[str, Any]]:
        return self.logs


class _CannedWeb3:
    def __init__(self, logs: list[dict[str, Any]]) -> None:
        self.eth = _CannedEth(logs)


def _topic(address: str) -> HexBytes:
    return HexBytes("0x" + "00" * 12 + address[2:])


def test_decoding_skips_non_erc20_shapes_and_orders_by_tx() -> None:
    token, frm, to = "0x" + "aa" * 20, "0x" + "bb" * 20, "0x" + "cc" * 20
    topic0 = HexBytes(TRANSFER_TOPIC)

    def raw(block: int, tx_index: int, log_index: int, **extra: Any) -> dict[str, Any]:
        log: dict[str, Any] = {
            "address": token,
            "blockNumber": block,
            "blockHash": HexBytes(bytes([block]) * 32),
            "transactionHash": HexBytes(bytes([block, tx_index]) * 16),
            "transactionIndex": tx_index,
            "logIndex": log_index,
            "topics": [topic0, _topic(frm), _topic(to)],
            "data": HexBytes((1000 * block + tx_index).to_bytes(32, "big")),
        }
        log.update(extra)
        return log

    logs = [
        raw(5, 1, 0),  # eth-tester style: logIndex restarts per transaction
        raw(5, 0, 0),
        raw(4, 2, 7),
        raw(4, 3, 8, topics=[topic0, _topic(frm), _topic(to), HexBytes(b"\x01" * 32)]),
        raw(4, 4, 9, data=HexBytes(b"")),  # ERC-721 style: tokenId indexed, no data
        raw(4, 5, 10, removed=True),
    ]
    reader = Web3ChainReader(_CannedWeb3(logs))  # type: ignore[arg-type]
    got = reader.transfers(0, 10, None, [to])
    assert [(t.block_number, t.amount_raw) for t in got] == [(4, 4002), (5, 5000), (5, 5001)]
    first = got[0]
    assert first.chain_id == 10
    assert first.block_hash == "0x" + "04" * 32
    assert first.tx_hash == "0x" + "0402" * 16
    assert (first.token_address, first.from_address, first.to_address) == (
        to_checksum_address(token),
        to_checksum_address(frm),
        to_checksum_address(to),
    )
    with pytest.raises(ValueError):
        reader.transfers(0, 10, None, ["0x1234"])
