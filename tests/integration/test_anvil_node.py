"""Settle's chain reader against a real node (anvil): what eth-tester cannot show.

A real node reorgs (`anvil_reorg`), keeps a mempool with automine off and forgets a
dropped transaction; these tests pin that the reader sees exactly what the node does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.core.addresses import AddressDeriver
from services.core.evm import ChainIdMismatch, Web3ChainReader
from tests.support import keys
from tests.support.anvil import AnvilNode

pytestmark = pytest.mark.integration


@pytest.fixture
def node() -> Iterator[AnvilNode]:
    with AnvilNode(chain_id=8453) as running:
        yield running


def test_the_reader_sees_a_transfer_and_loses_it_in_a_real_reorg(node: AnvilNode) -> None:
    # Given a token transfer to a deposit address, mined in a block of its own
    token = node.deploy_token("USDC", 6)
    deposit = AddressDeriver(keys.test_xpub()).derive(8453, 0)
    node.mint(token, node.accounts[1].address, 10**6)
    tx_hash = node.transfer(token, node.accounts[1], deposit, 250_000)
    mined_at = int(node.receipt(tx_hash)["blockNumber"], 16)
    reader = Web3ChainReader.from_url(node.url, 5.0, 8453)
    [log] = reader.transfer_logs(mined_at, mined_at, [token])
    assert (log.tx_hash, log.to_address, log.amount_raw) == (tx_hash, deposit.lower(), 250_000)
    old_hash = reader.block(mined_at).hash

    # When the node reorgs that block away (the new branch has no transfer)
    node.reorg(depth=node.head() - mined_at + 1)

    # Then the block at that height has another hash, and no transfer is read there
    assert reader.block(mined_at).hash != old_hash
    assert reader.transfer_logs(mined_at, node.head(), [token]) == []
    assert reader.block_transfer_logs(old_hash, [token]) is None
    assert node.balance_of(token, deposit) == 0


def test_a_dropped_transaction_is_forgotten_by_the_node(node: AnvilNode) -> None:
    # Given automine off and a transfer in the mempool
    token = node.deploy_token("USDC", 6)
    node.mint(token, node.accounts[1].address, 10**6)
    node.set_automine(False)
    tx_hash = node.transfer(token, node.accounts[1], node.accounts[2].address, 1, wait=False)
    assert tx_hash in node.pending()

    # When it is dropped and a block is mined
    node.drop(tx_hash)
    node.mine()

    # Then the node never mined it and does not know it
    assert node.receipt(tx_hash) is None
    assert node.rpc("eth_getTransactionByHash", tx_hash) is None


def test_a_reader_configured_for_another_chain_refuses_the_node(node: AnvilNode) -> None:
    reader = Web3ChainReader.from_url(node.url, 5.0, 137)
    with pytest.raises(ChainIdMismatch):
        reader.transfer_logs(0, node.head(), None)
