"""The fake chain behaves like a node where the chain watcher can tell."""

from __future__ import annotations

import pytest
from eth_utils import is_checksum_address

from services.core.evm import ChainReader, InMemoryChain, TransferLog

USDC = "0x" + "a0" * 20
DAI = "0x" + "da" * 20
SENDER = "0x" + "11" * 20
ALICE = "0x" + "a1" * 20
BOB = "0x" + "b0" * 20
CAROL = "0x" + "c0" * 20


def test_is_a_chain_reader() -> None:
    chain: ChainReader = InMemoryChain(137)
    assert chain.head() == 0
    genesis = chain.block(0)
    assert genesis is not None and genesis.number == 0
    assert chain.block(1) is None


def test_transfer_lands_in_next_mined_block() -> None:
    chain = InMemoryChain(137)
    tx = chain.transfer(USDC, SENDER, ALICE, 5_000_000)
    assert tx.startswith("0x") and len(tx) == 66
    assert chain.receipt_status(tx) is None
    assert chain.transfers(0, chain.head(), None, [ALICE]) == []

    (ref,) = chain.mine()
    assert chain.head() == ref.number == 1
    assert chain.block(1) == ref
    assert chain.receipt_status(tx) == (1, 1)
    (log,) = chain.transfers(0, 1, [USDC], [ALICE])
    assert log == TransferLog(
        chain_id=137,
        block_number=1,
        block_hash=ref.hash,
        tx_hash=tx,
        log_index=0,
        token_address=log.token_address,
        from_address=log.from_address,
        to_address=log.to_address,
        amount_raw=5_000_000,
    )
    # Addresses come back checksummed whatever case went in.
    for address, given in ((log.token_address, USDC), (log.to_address, ALICE)):
        assert is_checksum_address(address) and address.lower() == given


def test_filters_by_recipient_and_token() -> None:
    chain = InMemoryChain(1)
    chain.transfer(USDC, SENDER, ALICE, 1)
    chain.transfer(DAI, SENDER, ALICE, 2)
    chain.transfer(USDC, SENDER, BOB, 3)
    chain.transfer(USDC, SENDER, CAROL, 4)
    chain.mine()
    chain.transfer(USDC, SENDER, BOB, 5)
    chain.mine(3)
    assert chain.head() == 4

    def amounts(logs: list[TransferLog]) -> list[int]:
        return [log.amount_raw for log in logs]

    assert amounts(chain.transfers(0, 4, [USDC], [ALICE, BOB])) == [1, 3, 5]
    assert amounts(chain.transfers(0, 4, None, [ALICE, BOB])) == [1, 2, 3, 5]
    assert amounts(chain.transfers(0, 4, [USDC.upper().replace("0X", "0x")], [BOB])) == [3, 5]
    assert amounts(chain.transfers(2, 4, None, [ALICE, BOB])) == [5]
    assert chain.transfers(0, 4, [], [ALICE]) == []
    assert chain.transfers(0, 4, None, []) == []
    assert chain.transfers(3, 2, None, [ALICE]) == []
    # Log indices are block-wide, in order, and skip nobody.
    block1 = chain.transfers(1, 1, None, [ALICE, BOB, CAROL])
    assert [log.log_index for log in block1] == [0, 1, 2, 3]


def test_string_instead_of_address_list_is_refused() -> None:
    chain = InMemoryChain()
    with pytest.raises(TypeError):
        chain.transfers(0, 0, None, ALICE)


def test_deterministic() -> None:
    def run() -> list[object]:
        chain = InMemoryChain(8453)
        tx = chain.transfer(USDC, SENDER, ALICE, 7)
        refs = chain.mine(2)
        refs += chain.reorg(1)
        return [tx, *refs, chain.transfers(0, chain.head(), None, [ALICE])]

    assert run() == run()
    # ...but chains with different ids do not share hashes.
    assert InMemoryChain(1).block(0) != InMemoryChain(137).block(0)


def test_reorg_replaces_blocks_and_drops_their_transfers() -> None:
    chain = InMemoryChain(1)
    chain.mine()  # block 1
    kept = chain.transfer(USDC, SENDER, ALICE, 10)
    chain.mine()  # block 2
    lost = chain.transfer(USDC, SENDER, ALICE, 20)
    chain.mine(2)  # blocks 3 (with `lost`) and 4
    before = [chain.block(n) for n in range(5)]

    new = chain.reorg(2)
    assert [b.number for b in new] == [3, 4]
    assert chain.head() == 4
    after = [chain.block(n) for n in range(5)]
    assert after[:3] == before[:3]
    assert all(a != b for a, b in zip(after[3:], before[3:], strict=True))
    assert [log.tx_hash for log in chain.transfers(0, 4, None, [ALICE])] == [kept]
    assert chain.receipt_status(lost) is None
    assert chain.receipt_status(kept) == (1, 2)

    # Two reorgs at the same height still give fresh hashes.
    again = chain.reorg(2)
    assert {b.hash for b in again}.isdisjoint({b.hash for b in new})


def test_reorg_with_reinclude_moves_transfer_higher() -> None:
    chain = InMemoryChain(1)
    tx = chain.transfer(USDC, SENDER, ALICE, 10)
    chain.mine()
    chain.reorg(1, reinclude=True)
    assert chain.receipt_status(tx) is None
    chain.mine()
    assert chain.receipt_status(tx) == (1, 2)
    (log,) = chain.transfers(0, 2, None, [ALICE])
    assert (log.block_number, log.tx_hash) == (2, tx)


def test_reorg_depth_bounds() -> None:
    chain = InMemoryChain()
    chain.mine(2)
    for depth in (0, 3):
        with pytest.raises(ValueError):
            chain.reorg(depth)


def test_reverted_transfer_has_receipt_but_no_log() -> None:
    chain = InMemoryChain()
    tx = chain.transfer(USDC, SENDER, ALICE, 1, reverted=True)
    chain.mine()
    assert chain.receipt_status(tx) == (0, 1)
    assert chain.transfers(0, 1, None, [ALICE]) == []


def test_gas_price_is_settable() -> None:
    chain = InMemoryChain(gas_price_wei=7)
    assert chain.gas_price_wei() == 7
    chain.gas_price = 30_000_000_000
    assert chain.gas_price_wei() == 30_000_000_000


def test_fail_next_simulates_node_errors() -> None:
    chain = InMemoryChain()
    chain.fail_next(ConnectionError("node down"), times=2)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            chain.head()
    assert chain.head() == 0


def test_malformed_addresses_are_refused() -> None:
    chain = InMemoryChain()
    with pytest.raises(ValueError):
        chain.transfer("0x1234", SENDER, ALICE, 1)
    with pytest.raises(ValueError):
        chain.transfers(0, 0, None, ["alice"])
