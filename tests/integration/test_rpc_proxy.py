"""The test node (`EvmNode`) and the fault-injecting proxy (`RpcProxy`), tested on their own.

Everything runs on 127.0.0.1 against the in-process EVM, through web3's HTTP provider as
Settle uses it; no database. These tests pin what each fault looks like to a client, so
the safety tests built on them mean what they say.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import MethodUnavailable, TransactionNotFound, Web3RPCError

from services.core.evm import (
    TRANSFER_BLOOM,
    TransferLog,
    Web3ChainReader,
    bloom_mask,
    connect,
)
from services.core.hot_wallet import Erc20TransferExecutor
from tests.support.evm_chain import EvmChain
from tests.support.evm_node import EvmNode
from tests.support.rpc_proxy import WHOLE_NODE, Fault, RpcProxy

#: Client timeout: short, so a held call fails soon, yet long enough that a call the
#: node answers is never cut on a loaded CI machine (0.5 s was: py-evm mines slowly).
TIMEOUT_S = 2.0


@dataclass
class Net:
    chain: EvmChain
    node: EvmNode
    proxy: RpcProxy
    token: str
    payer: LocalAccount
    to: str

    def reader(self) -> Web3ChainReader:
        return Web3ChainReader.from_url(self.proxy.url, TIMEOUT_S, self.chain.chain_id)

    def executor(self) -> Erc20TransferExecutor:
        return Erc20TransferExecutor.from_url(self.proxy.url, self.payer.key, TIMEOUT_S)

    def w3(self) -> Web3:
        w3 = connect(self.proxy.url, TIMEOUT_S)
        # No transparent retries: each call below is exactly one request.
        w3.provider.exception_retry_configuration = None  # type: ignore[attr-defined]
        return w3


@pytest.fixture(scope="module")
def chain() -> EvmChain:
    return EvmChain()


def _net(chain: EvmChain, **node_options: object) -> Iterator[Net]:
    token = chain.deploy_token("USDC", 6)
    payer = chain.new_account()
    chain.mint(token, payer.address, 10**12)
    to = chain.new_account(0).address
    with EvmNode(chain, **node_options) as node, RpcProxy(node.url, hold_s=TIMEOUT_S + 3) as proxy:  # type: ignore[arg-type]
        yield Net(chain, node, proxy, token, payer, to)


@pytest.fixture
def net(chain: EvmChain) -> Iterator[Net]:
    yield from _net(chain)


def _to(logs: list[TransferLog], recipient: str) -> list[TransferLog]:
    return [log for log in logs if log.to_address == recipient.lower()]


# -- the node ------------------------------------------------------------------------------


def test_node_numbers_logs_per_block_like_a_real_node(net: Net) -> None:
    # Given three transfers from different senders mined into one block
    others = [net.chain.new_account() for _ in range(2)]
    for acct in others:
        net.chain.mint(net.token, acct.address, 10**9)
    txs = [
        net.chain.transfer(net.token, sender, net.to, amount)
        for sender, amount in ((net.payer, 1), (others[0], 2), (others[1], 3))
    ]
    net.chain.mine()
    head = net.chain.head()
    # Then eth_getLogs and receipts number them 0, 1, 2 across the block
    logs = _to(net.reader().transfer_logs(head, head, [net.token]), net.to)
    assert [(log.tx_hash, log.log_index) for log in logs] == list(zip(txs, [0, 1, 2], strict=True))
    receipt = net.w3().eth.get_transaction_receipt(HexBytes(txs[2]))
    assert [log["logIndex"] for log in receipt["logs"]] == [2]


def test_node_offers_finalized_only_when_built_with_it(chain: EvmChain) -> None:
    for net in _net(chain, finalized_depth=3):
        chain.mine(5)
        w3 = net.w3()
        assert w3.eth.get_block("finalized")["number"] == chain.head() - 3
        with pytest.raises(Web3RPCError, match="safe block not found"):
            w3.eth.get_block("safe")
    for net in _net(chain):
        with pytest.raises(Web3RPCError, match="finalized block not found"):
            net.w3().eth.get_block("finalized")


def test_node_can_leave_sends_pending_until_the_test_mines(chain: EvmChain) -> None:
    for net in _net(chain, mine_sends=False):
        executor = net.executor()
        tx = executor.transfer(net.token, net.to, 5)
        reader = net.reader()
        # In flight: no receipt, the pending nonce counts it, the balance is unchanged
        assert reader.receipt_status(tx) is None
        w3 = net.w3()
        assert w3.eth.get_transaction_count(executor.address, "pending") == (
            w3.eth.get_transaction_count(executor.address, "latest") + 1
        )
        chain.mine()
        status = reader.receipt_status(tx)
        assert status is not None and status[0] == 1
        assert chain.balance_of(net.token, net.to) == 5


def _signed(net: Net, nonce: int, max_fee: int, amount: int = 1) -> bytes:
    executor = net.executor()
    tx = executor.build_transfer(net.token, net.to, amount)
    del tx["from"]
    tx.update(nonce=nonce, maxFeePerGas=max_fee, maxPriorityFeePerGas=max_fee // 10)
    return bytes(net.payer.sign_transaction(tx).raw_transaction)


def test_node_pool_answers_as_geth_does(chain: EvmChain) -> None:
    for net in _net(chain, mine_sends=False):
        w3 = net.w3()
        nonce = w3.eth.get_transaction_count(net.payer.address, "latest")
        base = 10 * int(w3.eth.get_block("latest")["baseFeePerGas"]) + 10**9
        first = _signed(net, nonce, base)
        tx1 = w3.eth.send_raw_transaction(first).to_0x_hex()
        # Pending: counted by the pending nonce, visible with no block, no receipt
        assert w3.eth.get_transaction_count(net.payer.address, "pending") == nonce + 1
        assert w3.eth.get_transaction(HexBytes(tx1))["blockNumber"] is None
        assert net.node.pooled() == [tx1]
        # The same bytes again: already known; the nonce with a 5 % bump: underpriced
        with pytest.raises(Web3RPCError, match="already known"):
            w3.eth.send_raw_transaction(first)
        with pytest.raises(Web3RPCError, match="replacement transaction underpriced"):
            w3.eth.send_raw_transaction(_signed(net, nonce, base * 105 // 100))
        # A 20 % bump replaces it: only the replacement is mined
        tx2 = w3.eth.send_raw_transaction(_signed(net, nonce, base * 12 // 10, 2)).to_0x_hex()
        assert net.node.pooled() == [tx2]
        chain.mine()
        assert net.reader().receipt_status(tx2) is not None
        assert net.reader().receipt_status(tx1) is None
        # A used nonce: too low
        with pytest.raises(Web3RPCError, match="nonce too low"):
            w3.eth.send_raw_transaction(_signed(net, nonce, base * 2))


def test_node_pool_keeps_underpriced_transactions_and_can_drop_them(chain: EvmChain) -> None:
    for net in _net(chain, mine_sends=False):
        executor = net.executor()
        tx = executor.transfer(net.token, net.to, 5)
        # A fee floor above what it pays: mined blocks leave it pending
        net.node.min_fee_wei = 10**30
        chain.mine(3)
        assert net.reader().receipt_status(tx) is None and net.node.pooled() == [tx]
        # Evicted: it is gone from the node, even once the floor is lifted
        assert net.node.drop(tx) is True
        net.node.min_fee_wei = 0
        chain.mine()
        assert net.reader().receipt_status(tx) is None
        with pytest.raises(TransactionNotFound):
            net.w3().eth.get_transaction(HexBytes(tx))
        assert chain.balance_of(net.token, net.to) == 0


def test_unknown_method_is_method_not_found(net: Net) -> None:
    with pytest.raises(MethodUnavailable):
        net.w3().manager.request_blocking("eth_noSuchMethod", [])  # type: ignore[arg-type]


# -- faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "raised"),
    [
        (Fault.TIMEOUT, requests.exceptions.ReadTimeout),
        (Fault.RESET, requests.exceptions.ConnectionError),
        (Fault.HTTP_429, requests.exceptions.HTTPError),
        (Fault.HTTP_503, requests.exceptions.HTTPError),
        (Fault.RPC_ERROR, Web3RPCError),
    ],
)
def test_broadcast_forwarded_then_failed_reaches_the_chain(
    net: Net, fault: Fault, raised: type[Exception]
) -> None:
    # Given the node takes the broadcast but the client never gets the answer
    net.proxy.fail("eth_sendRawTransaction", fault, forward=True)
    w3 = net.w3()
    raw = _signed(net, w3.eth.get_transaction_count(net.payer.address), 10**11, 7)
    before = net.chain.balance_of(net.token, net.to)
    started = time.monotonic()
    with pytest.raises(raised):
        w3.eth.send_raw_transaction(raw)
    # Then the client saw a failure, yet the transfer was mined
    assert time.monotonic() - started < TIMEOUT_S + 1
    assert net.chain.balance_of(net.token, net.to) == before + 7
    assert net.proxy.count("eth_sendRawTransaction", f"fault:{fault.value} after forward") == 1


@pytest.mark.parametrize("fault", list(Fault))
def test_fault_before_forward_never_reaches_the_chain(net: Net, fault: Fault) -> None:
    net.proxy.fail("eth_sendRawTransaction", fault, forward=False)
    w3 = net.w3()
    raw = _signed(net, w3.eth.get_transaction_count(net.payer.address), 10**11, 7)
    before = net.chain.balance_of(net.token, net.to)
    head = net.chain.head()
    with pytest.raises(Exception):  # noqa: B017 - each fault's own type is pinned above
        w3.eth.send_raw_transaction(raw)
    assert net.chain.balance_of(net.token, net.to) == before
    assert net.chain.head() == head
    # And the same broadcast again goes through: the rule was used up
    w3.eth.send_raw_transaction(raw)
    assert net.chain.balance_of(net.token, net.to) == before + 7


def test_web3_resends_a_timed_out_broadcast_unless_told_not_to(net: Net) -> None:
    # web3's HTTPProvider retries eth_sendRawTransaction (and reads) on timeouts, resets
    # and HTTP errors: after a forwarded timeout its re-send of the same bytes meets the
    # mined transaction, so the caller gets "nonce too low" for a payment that landed.
    net.proxy.fail("eth_sendRawTransaction", Fault.TIMEOUT, forward=True)
    w3 = connect(net.proxy.url, TIMEOUT_S)
    raw = _signed(net, w3.eth.get_transaction_count(net.payer.address), 10**11, 7)
    before = net.chain.balance_of(net.token, net.to)
    with pytest.raises(Web3RPCError, match="nonce too low"):
        w3.eth.send_raw_transaction(raw)
    assert net.chain.balance_of(net.token, net.to) == before + 7
    assert net.proxy.count("eth_sendRawTransaction") == 2
    # The hot wallet's connection sends once: only the payment logic may send again
    net.proxy.fail("eth_sendRawTransaction", Fault.TIMEOUT, forward=True)
    with pytest.raises(requests.exceptions.ReadTimeout):
        net.executor().transfer(net.token, net.to, 7)
    assert net.chain.balance_of(net.token, net.to) == before + 14
    assert net.proxy.count("eth_sendRawTransaction") == 3


def test_receipt_poll_fails_while_the_transaction_is_mined(net: Net) -> None:
    tx = net.executor().transfer(net.token, net.to, 3)
    net.proxy.fail("eth_getTransactionReceipt", Fault.RPC_ERROR, times=None, message="busy")
    w3 = net.w3()
    with pytest.raises(Web3RPCError, match="busy"):
        w3.eth.get_transaction_receipt(HexBytes(tx))
    assert net.chain.receipt(tx)["status"] == 1
    net.proxy.clear()
    assert w3.eth.get_transaction_receipt(HexBytes(tx))["status"] == 1


def test_web3_retries_reads_on_transport_faults_but_not_broadcasts(net: Net) -> None:
    # The reader (web3's HTTPProvider on evm.read_session), as web3's defaults for reads,
    # retries on timeouts, resets and HTTP errors: a fault meant to reach Settle's code
    # must outlast those retries (times=None).
    net.proxy.fail("eth_blockNumber", Fault.HTTP_429, times=2)
    reader = net.reader()
    assert reader.head() == net.chain.head()
    assert net.proxy.count("eth_blockNumber") == 3


def test_reader_goes_through_the_environments_http_proxy(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given HTTP_PROXY naming the proxy, and a node URL nothing listens on (loopback)
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", net.proxy.url)
    monkeypatch.setenv("http_proxy", net.proxy.url)
    reader = Web3ChainReader.from_url("http://127.0.0.2:9/", TIMEOUT_S, net.chain.chain_id)
    # Then the reader's calls reach the node through it, as requests' would
    assert reader.head() == net.chain.head()
    assert net.proxy.count("eth_blockNumber") == 1


def test_delay_holds_the_call(net: Net) -> None:
    net.proxy.delay("eth_blockNumber", 1.5, times=1)
    w3 = net.w3()
    started = time.monotonic()
    assert w3.eth.block_number == net.chain.head()
    assert time.monotonic() - started >= 1.5
    started = time.monotonic()
    assert w3.eth.block_number == net.chain.head()
    assert time.monotonic() - started < 1.5


def test_timeout_is_released_when_the_proxy_stops(chain: EvmChain) -> None:
    for net in _net(chain):
        net.proxy.hold_s = 30
        net.proxy.fail("eth_blockNumber", Fault.TIMEOUT)
        with pytest.raises(requests.exceptions.ReadTimeout):
            _ = net.w3().eth.block_number
    # (leaving the context stopped the proxy without waiting out the 30 s hold)


# -- views -----------------------------------------------------------------------------------


def test_lagging_logs_backend_answers_empty_past_its_head(net: Net) -> None:
    # Given transfers in each of the last three blocks
    txs = []
    for amount in (1, 2, 3):
        txs.append(net.chain.transfer(net.token, net.payer, net.to, amount))
        net.chain.mine()
    head = net.chain.head()
    # When the logs backend is two blocks behind (the head is answered fresh)
    net.proxy.lag(2)
    reader = net.reader()
    assert reader.head() == head
    # Then a range past its head is empty, without an error, and a range across it is cut
    assert _to(reader.transfer_logs(head - 1, head, [net.token]), net.to) == []
    logs = _to(reader.transfer_logs(head - 2, head, [net.token]), net.to)
    assert [log.tx_hash for log in logs] == txs[:1]
    assert net.proxy.count("eth_getLogs", "lagged") == 2
    # And caught up again, everything is there
    net.proxy.lag(0)
    assert [
        log.tx_hash for log in _to(reader.transfer_logs(head - 2, head, [net.token]), net.to)
    ] == txs


def test_lagging_range_backend_beside_an_up_to_date_one_for_queries_by_hash(net: Net) -> None:
    # Given a transfer in the head block
    tx = net.chain.transfer(net.token, net.payer, net.to, 4)
    net.chain.mine()
    head = net.chain.head()
    head_hash = net.chain.block_hash(head)
    reader = net.reader()
    # When range queries reach a backend two blocks behind, queries by hash a fresh one
    net.proxy.lag(2, by_hash=False)
    # Then the range is empty without an error, while the block asked by hash has the log
    assert _to(reader.transfer_logs(head, head, [net.token]), net.to) == []
    by_hash = reader.block_transfer_logs(head_hash, [net.token])
    assert by_hash is not None and [log.tx_hash for log in _to(by_hash, net.to)] == [tx]
    # And by default the by-hash query lags too (the block is unknown: an error, None)
    net.proxy.lag(2)
    assert reader.block_transfer_logs(head_hash, [net.token]) is None


def test_headers_carry_the_logs_bloom_of_their_transfers(net: Net) -> None:
    # Given a block with a transfer of the token and a block without
    net.chain.transfer(net.token, net.payer, net.to, 5)
    net.chain.mine()
    net.chain.mine()
    head = net.chain.head()
    headers = net.reader().block_headers([head - 1, head])
    token_bits = bloom_mask(bytes.fromhex(net.token[2:]))
    # Then the node's logsBloom holds the Transfer topic and the token in the first only
    # (the watcher's bloom check agrees with a real EVM's blooms)
    with_transfer, quiet = headers[head - 1].logs_bloom, headers[head].logs_bloom
    assert with_transfer is not None and quiet is not None
    assert with_transfer & TRANSFER_BLOOM == TRANSFER_BLOOM
    assert with_transfer & token_bits == token_bits
    assert quiet & TRANSFER_BLOOM != TRANSFER_BLOOM
    assert headers[head].hash == net.chain.block_hash(head)


def test_whole_node_behind(net: Net) -> None:
    net.chain.mine(3)
    head = net.chain.head()
    net.proxy.lag(2, WHOLE_NODE)
    reader = net.reader()
    assert reader.head() == head - 2
    assert reader.block(head) is None
    ref = reader.block(head - 2)
    assert ref is not None and ref.hash == net.chain.block_hash(head - 2)


def test_stale_fork_serves_the_branch_a_reorg_replaced(net: Net) -> None:
    # Given a transfer mined, and the branch it is on captured
    net.chain.mine()
    tx = net.chain.transfer(net.token, net.payer, net.to, 9)
    net.chain.mine(2)
    head = net.chain.head()
    fork = net.proxy.capture_fork(head - 2)
    old_hashes = [net.chain.block_hash(n) for n in range(head - 2, head + 1)]
    # When a reorg replaces those blocks with a longer branch without the transfer
    net.chain.reorg(3, length=4)
    assert net.chain.block_hash(head) != old_hashes[-1]
    # Then a node serving the stale fork still shows the old branch and the transfer
    net.proxy.serve_fork(fork)
    reader = net.reader()
    assert reader.head() == head
    ref = reader.block(head)
    assert ref is not None and ref.hash == old_hashes[-1]
    (log,) = _to(reader.transfer_logs(head - 2, head, [net.token]), net.to)
    assert (log.tx_hash, log.block_hash) == (tx, old_hashes[1])
    assert reader.receipt_status(tx) == (1, head - 1)
    # And the shared history below the fork point comes from the node
    below = reader.block(head - 3)
    assert below is not None and below.hash == net.chain.block_hash(head - 3)
    # Back on the canonical chain, the transfer is gone
    net.proxy.serve_fork(None)
    assert reader.head() == head + 1
    assert _to(reader.transfer_logs(head - 2, head + 1, [net.token]), net.to) == []
    assert reader.receipt_status(tx) is None


def test_dropped_broadcast_is_answered_but_never_mined(net: Net) -> None:
    net.proxy.drop_sends()
    executor = net.executor()
    before = net.chain.balance_of(net.token, net.to)
    tx = executor.transfer(net.token, net.to, 4)
    assert net.proxy.dropped == [tx]
    net.chain.mine(2)
    assert net.reader().receipt_status(tx) is None
    with pytest.raises(TransactionNotFound):
        net.chain.receipt(tx)
    assert net.chain.balance_of(net.token, net.to) == before
    # The next broadcast is not dropped
    tx2 = executor.transfer(net.token, net.to, 4)
    assert net.reader().receipt_status(tx2) is not None


# -- reorgs on the in-process chain ------------------------------------------------------------


def test_reorg_re_mines_a_transfer_in_another_block_and_log_position(net: Net) -> None:
    other = net.chain.new_account()
    net.chain.mint(net.token, other.address, 10**9)
    # Given a transfer alone in its block
    tx = net.chain.transfer(net.token, net.payer, net.to, 11)
    net.chain.mine(2)
    reader = net.reader()
    head = net.chain.head()
    (before,) = _to(reader.transfer_logs(head - 1, head, [net.token]), net.to)
    assert before.log_index == 0
    # When a reorg replaces both blocks, re-mining it one block later behind another transfer
    net.chain.rewind(2)
    net.chain.mine()
    ahead = net.chain.transfer(net.token, other, net.to, 1)
    net.chain.replay(tx)
    net.chain.mine(2)
    # Then the same transaction sits in another block at another log index
    logs = _to(reader.transfer_logs(head - 1, head + 1, [net.token]), net.to)
    assert [(log.tx_hash, log.log_index) for log in logs] == [(ahead, 0), (tx, 1)]
    assert logs[1].block_number == before.block_number + 1
    assert logs[1].block_hash != before.block_hash
    assert chain_balance(net) == 12


def chain_balance(net: Net) -> int:
    return net.chain.balance_of(net.token, net.to)


def test_reorg_helper_moves_transfers_and_can_shorten_the_chain(net: Net) -> None:
    tx = net.chain.transfer(net.token, net.payer, net.to, 5)
    net.chain.mine(3)
    head = net.chain.head()
    mined_in = net.chain.receipt(tx)["blockNumber"]
    # A same-length branch with the transfer two blocks later
    net.chain.reorg(3, reinclude=[tx], skip=2)
    assert net.chain.head() == head
    assert net.chain.receipt(tx)["blockNumber"] == mined_in + 2
    # A shorter branch without it
    net.chain.reorg(3, length=1)
    assert net.chain.head() == head - 2
    with pytest.raises(TransactionNotFound):
        net.chain.receipt(tx)
