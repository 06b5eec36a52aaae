"""Web3ChainReader on the in-process EVM (eth-tester + py-evm) served over HTTP (EvmNode).

No database: these run everywhere, offline, in a few seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.core.addresses import AddressDeriver, private_key_for
from services.core.evm import (
    TRANSFER_TOPIC,
    ChainIdMismatch,
    ChainReader,
    NodeError,
    TransferLog,
    Web3ChainReader,
    decode_transfer,
)
from tests.support import keys
from tests.support.evm_chain import EvmChain
from tests.support.evm_node import EvmNode
from tests.support.rpc_proxy import Fault, RpcProxy

CHAIN_IN_PATH = 8453  # derivation path segment; the tester's own chain id differs


@pytest.fixture
def chain() -> EvmChain:
    return EvmChain()


@pytest.fixture
def deposits() -> list[str]:
    deriver = AddressDeriver(keys.test_xpub())
    return [deriver.derive(CHAIN_IN_PATH, i) for i in range(3)]


@pytest.fixture
def proxy(chain: EvmChain) -> Iterator[RpcProxy]:
    with EvmNode(chain) as node, RpcProxy(node.url) as served:
        yield served


def to(logs: list[TransferLog], *recipients: str) -> list[TransferLog]:
    wanted = {r.lower() for r in recipients}
    return [log for log in logs if log.to_address in wanted]


def test_transfer_topic() -> None:
    assert TRANSFER_TOPIC == "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"


def test_transfer_logs_of_the_given_tokens_in_block_order(
    chain: EvmChain, deposits: list[str]
) -> None:
    usdc = chain.deploy_token("USDC", 6)
    payer, other = chain.accounts[1], chain.accounts[2]
    chain.mint(usdc, payer.address, 10**12)
    chain.mint(usdc, other.address, 10**12)
    outsider = chain.accounts[9].address

    # Block A: two deposits from one sender, one from another, one to an outsider.
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
    logs = reader.transfer_logs(number_a, head, [usdc])

    def log(n: int, block: str, tx: str, frm: str, dest: str, amount: int, i: int) -> TransferLog:
        return TransferLog(
            chain.chain_id, n, block, tx, i, usdc.lower(), frm.lower(), dest.lower(), amount, i
        )

    # Every transfer of the token, the outsider's too (recipients are matched by the
    # caller); log indices count across the block, as on a real node.
    assert logs == [
        log(number_a, block_a, a0, payer.address, deposits[0], 1_000_000, 0),
        log(number_a, block_a, a1, payer.address, outsider, 2_000_000, 1),
        log(number_a, block_a, a2, other.address, deposits[1], 3_000_000, 2),
        log(number_a, block_a, a3, payer.address, deposits[0], 4_000_000, 3),
        log(number_b, block_b, b0, other.address, deposits[2], 5_000_000, 0),
    ]
    ref_a = reader.block(number_a)
    assert ref_a is not None and ref_a.hash == block_a
    assert reader.block(head + 1) is None
    assert reader.block_hashes([number_a, number_b, head + 1]) == {
        number_a: block_a,
        number_b: block_b,
    }
    # Windows split the result without losing or duplicating anything.
    assert reader.transfer_logs(number_a, number_a, [usdc]) == logs[:4]
    assert reader.transfer_logs(number_a + 1, head, [usdc]) == logs[4:]
    assert reader.transfer_logs(0, head, []) == []
    # By block hash: the same logs; a hash the node does not know is None, not [].
    assert reader.block_transfer_logs(block_b, [usdc]) == logs[4:]
    assert reader.block_transfer_logs("0x" + "ab" * 32, [usdc]) is None


def test_other_tokens_only_when_any_contract_is_asked(chain: EvmChain, deposits: list[str]) -> None:
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

    supported = reader.transfer_logs(head, head, [usdc])
    assert [log.token_address for log in supported] == [usdc.lower()]
    anything = reader.transfer_logs(head, head, None)
    assert [(log.token_address, log.tx_hash) for log in anything] == [
        (usdc.lower(), supported[0].tx_hash),
        (junk.lower(), junk_tx),
    ]
    assert anything[1].amount_raw == 10**18


def test_long_ranges_are_read_in_spans(chain: EvmChain) -> None:
    usdc = chain.deploy_token("USDC", 6)
    payer = chain.accounts[1]
    chain.mint(usdc, payer.address, 10**9)
    first = chain.head() + 1
    recipients = [a.address for a in chain.accounts[2:9]]
    for i, dest in enumerate(recipients):
        chain.transfer(usdc, payer.address, dest, i + 1)
        if i % 2:
            chain.mine()
    chain.mine()
    head = chain.head()

    whole = chain.reader().transfer_logs(first, head, [usdc])
    assert [log.amount_raw for log in whole] == [1, 2, 3, 4, 5, 6, 7]
    small = chain.reader(max_block_span=2)
    assert small.transfer_logs(first, head, [usdc]) == whole
    assert small.get_logs_calls == -(-(head - first + 1) // 2)  # ceil(blocks / 2)


def test_node_limit_errors_are_bisected(chain: EvmChain, proxy: RpcProxy) -> None:
    usdc = chain.deploy_token("USDC", 6)
    payer = chain.accounts[1]
    chain.mint(usdc, payer.address, 10**9)
    first = chain.head() + 1
    for dest in chain.accounts[2:6]:
        chain.transfer(usdc, payer.address, dest.address, 1, mine=True)
    reader = Web3ChainReader.from_url(proxy.url, 5.0)
    expected = reader.transfer_logs(first, chain.head(), [usdc])
    assert len(expected) == 4
    # A provider refusing the two widest queries ("query exceeds limit"): halving the
    # range gets an answer, the same one.
    proxy.fail("eth_getLogs", Fault.RPC_ERROR, times=2, message="query exceeds limit")
    calls = proxy.count("eth_getLogs")
    assert reader.transfer_logs(first, chain.head(), [usdc]) == expected
    assert proxy.count("eth_getLogs") - calls == 5  # 4 blocks: 1 + 1 + 2 + 1
    # A single block still refused is the caller's error to see
    proxy.fail("eth_getLogs", Fault.RPC_ERROR, times=None, message="query exceeds limit")
    with pytest.raises(NodeError):
        reader.transfer_logs(first, first, [usdc])


def test_tagged_blocks_and_nodes_without_them(chain: EvmChain) -> None:
    chain.mine(6)
    with EvmNode(chain, finalized_depth=4) as node:
        reader = Web3ChainReader.from_url(node.url, 5.0)
        tagged = reader.tagged_block("finalized")
        assert tagged is not None and tagged == reader.block(chain.head() - 4)
        assert reader.tagged_block("safe") is None  # this node does not offer it


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
    assert len(to(reader.transfer_logs(0, chain.head(), [usdc]), *deposits)) == 1

    chain.revert(snap)
    assert chain.head() == fork_point
    assert reader.block(fork_point + 1) is None
    chain.mine(3)
    new = [chain.block_hash(n) for n in range(fork_point + 1, fork_point + 4)]
    assert all(a != b for a, b in zip(old, new, strict=True))
    assert to(reader.transfer_logs(0, chain.head(), [usdc]), *deposits) == []
    assert reader.receipt_status(tx) is None
    # The old branch's blocks are unknown to the node now, asked by hash too.
    assert reader.block_transfer_logs(old[0], [usdc]) is None


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

    assert reader.chain_id == chain.chain_id
    wrong = Web3ChainReader(reader.w3, chain_id=1)
    with pytest.raises(ChainIdMismatch):
        wrong.transfer_logs(0, 1, None)


def _raw(block: int, tx_index: int, log_index: int, **extra: Any) -> dict[str, Any]:
    token, frm, dest = "0x" + "aa" * 20, "0x" + "bb" * 20, "0x" + "cc" * 20
    log: dict[str, Any] = {
        "address": token.upper().replace("0X", "0x"),
        "blockNumber": hex(block),
        "blockHash": "0x" + bytes([block]).hex() * 32,
        "transactionHash": "0x" + bytes([block, tx_index]).hex() * 16,
        "transactionIndex": hex(tx_index),
        "logIndex": hex(log_index),
        "topics": [TRANSFER_TOPIC, "0x" + "00" * 12 + frm[2:], "0x" + "00" * 12 + dest[2:]],
        "data": "0x" + (1000 * block + tx_index).to_bytes(32, "big").hex(),
    }
    log.update(extra)
    return log


def test_decoding_takes_only_erc20_shapes() -> None:
    topics = _raw(4, 0, 0)["topics"]
    assert decode_transfer(10, _raw(4, 2, 7)) == TransferLog(
        chain_id=10,
        block_number=4,
        block_hash="0x" + "04" * 32,
        tx_hash="0x" + "0402" * 16,
        log_index=7,
        token_address="0x" + "aa" * 20,
        from_address="0x" + "bb" * 20,
        to_address="0x" + "cc" * 20,
        amount_raw=4002,
        tx_index=2,
    )
    # ERC-721 (tokenId indexed, no data), a fourth topic, a removed log: not transfers
    assert decode_transfer(10, _raw(4, 3, 8, topics=[*topics, "0x" + "01" * 32])) is None
    assert decode_transfer(10, _raw(4, 4, 9, data="0x")) is None
    assert decode_transfer(10, _raw(4, 5, 10, removed=True)) is None


def test_a_string_instead_of_a_token_list_is_refused(chain: EvmChain) -> None:
    reader = chain.reader()
    with pytest.raises(TypeError):
        reader.transfer_logs(0, 1, "0x" + "aa" * 20)
    with pytest.raises(ValueError):
        reader.transfer_logs(0, 1, ["0x1234"])
