"""Erc20TransferExecutor (the hot wallet) on an in-process EVM (eth-tester + py-evm).

No database: these run everywhere, offline, in about a second.
"""

from __future__ import annotations

from typing import Any

import pytest
from eth_tester.exceptions import TransactionFailed
from hexbytes import HexBytes
from web3.exceptions import ContractLogicError

from services.core.hot_wallet import Erc20TransferExecutor, ReceiptTimeout
from tests.support.evm_chain import EvmChain


@pytest.fixture
def chain() -> EvmChain:
    return EvmChain()


def test_executor_moves_tokens_from_a_hot_wallet(chain: EvmChain) -> None:
    usdc = chain.deploy_token("USDC", 6)
    hot = chain.new_account()
    chain.mint(usdc, hot.address, 100_000_000)
    dest = chain.accounts[5].address
    executor = Erc20TransferExecutor(chain.w3, hot.key)
    assert executor.address == hot.address
    assert hot.key.hex() not in repr(executor)

    tx_hash = executor.transfer(usdc, dest, 25_000_000)
    status, block_number = executor.wait_receipt(tx_hash, timeout_s=5, poll_s=0.01)
    assert (status, block_number) == (1, chain.head())
    # Back-to-back sends get consecutive nonces.
    second = executor.transfer(usdc, dest, 5_000_000)
    assert executor.wait_receipt(second, timeout_s=5, poll_s=0.01)[0] == 1
    assert chain.balance_of(usdc, dest) == 30_000_000
    assert chain.balance_of(usdc, hot.address) == 70_000_000

    sent = chain.w3.eth.get_transaction(HexBytes(tx_hash))
    assert sent["type"] == 2 and sent["chainId"] == chain.chain_id
    (log,) = [
        t
        for t in chain.reader().transfer_logs(block_number, block_number, [usdc])
        if t.to_address == dest.lower()
    ]
    assert (log.tx_hash, log.from_address, log.amount_raw) == (
        tx_hash,
        hot.address.lower(),
        25_000_000,
    )


def test_executor_uses_legacy_gas_price_without_base_fee(
    chain: EvmChain, monkeypatch: pytest.MonkeyPatch
) -> None:
    usdc = chain.deploy_token("USDC", 6)
    hot = chain.new_account()
    chain.mint(usdc, hot.address, 10)
    real_get_block = chain.w3.eth.get_block

    def pre_london(block_id: Any, *args: Any) -> Any:
        block = dict(real_get_block(block_id, *args))
        block.pop("baseFeePerGas", None)
        return block

    monkeypatch.setattr(chain.w3.eth, "get_block", pre_london)
    executor = Erc20TransferExecutor(chain.w3, hot.key, chain_id=chain.chain_id)
    tx = executor.build_transfer(usdc, chain.accounts[3].address, 10)
    assert "gasPrice" in tx and "maxFeePerGas" not in tx
    tx_hash = executor.transfer(usdc, chain.accounts[3].address, 10)
    assert executor.wait_receipt(tx_hash, timeout_s=5, poll_s=0.01)[0] == 1
    assert chain.w3.eth.get_transaction(HexBytes(tx_hash))["type"] == 0


def test_executor_refuses_a_transfer_that_would_revert(chain: EvmChain) -> None:
    usdc = chain.deploy_token("USDC", 6)
    hot = chain.new_account()
    executor = Erc20TransferExecutor(chain.w3, hot.key)
    # The gas estimate fails first, so nothing is signed or sent. Real nodes surface it
    # as web3's ContractLogicError, eth-tester as its own TransactionFailed.
    with pytest.raises((ContractLogicError, TransactionFailed)):
        executor.transfer(usdc, chain.accounts[3].address, 1)  # no balance
    assert chain.w3.eth.get_transaction_count(hot.address, "pending") == 0


def test_wait_receipt_times_out(chain: EvmChain) -> None:
    executor = Erc20TransferExecutor(chain.w3, chain.accounts[1].key)
    with pytest.raises(ReceiptTimeout) as info:
        executor.wait_receipt("0x" + "ab" * 32, timeout_s=0.05, poll_s=0.01)
    assert isinstance(info.value, TimeoutError)
