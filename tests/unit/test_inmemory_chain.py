"""The fake chain behaves like a node where the chain watcher can tell."""

from __future__ import annotations

import pytest

from services.core.evm import ChainReader, InMemoryChain, TransferLog

USDC = "0x" + "a0" * 20
DAI = "0x" + "da" * 20
#: Mixed case (a checksummed-looking token address) comes back lowercase.
USDC_MIXED = "0x" + "A0" * 20
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


def to(
    chain: InMemoryChain, *recipients: str, start: int = 0, tokens: list[str] | None = None
) -> list[TransferLog]:
    wanted = {r.lower() for r in recipients}
    return [
        log for log in chain.transfer_logs(start, chain.head(), tokens) if log.to_address in wanted
    ]


def test_transfer_lands_in_next_mined_block() -> None:
    chain = InMemoryChain(137)
    tx = chain.transfer(USDC_MIXED, SENDER, ALICE, 5_000_000)
    assert tx.startswith("0x") and len(tx) == 66
    assert chain.receipt_status(tx) is None
    assert chain.transfer_logs(0, chain.head(), None) == []

    (ref,) = chain.mine()
    assert chain.head() == ref.number == 1
    assert chain.block(1) == ref
    assert chain.block_hashes([0, 1, 2]) == {0: chain.block(0).hash, 1: ref.hash}  # type: ignore[union-attr]
    assert chain.receipt_status(tx) == (1, 1)
    (log,) = chain.transfer_logs(0, 1, [USDC])
    # Addresses come back lowercase whatever case went in.
    assert log == TransferLog(
        chain_id=137,
        block_number=1,
        block_hash=ref.hash,
        tx_hash=tx,
        log_index=0,
        token_address=USDC,
        from_address=SENDER,
        to_address=ALICE,
        amount_raw=5_000_000,
        tx_index=0,
    )
    assert chain.block_transfer_logs(ref.hash, [USDC]) == [log]
    assert chain.block_transfer_logs("0x" + "00" * 32, [USDC]) is None


def test_filters_by_token() -> None:
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

    assert amounts(chain.transfer_logs(0, 4, [USDC])) == [1, 3, 4, 5]
    assert amounts(chain.transfer_logs(0, 4, None)) == [1, 2, 3, 4, 5]
    assert amounts(chain.transfer_logs(0, 4, [USDC_MIXED, DAI])) == [1, 2, 3, 4, 5]
    assert amounts(chain.transfer_logs(2, 4, None)) == [5]
    assert chain.transfer_logs(0, 4, []) == []
    assert chain.transfer_logs(3, 2, None) == []
    # Log indices are block-wide, in order, and skip nobody.
    assert [log.log_index for log in chain.transfer_logs(1, 1, None)] == [0, 1, 2, 3]
    assert [log.tx_index for log in chain.transfer_logs(1, 1, None)] == [0, 1, 2, 3]


def test_finality_tags_only_when_offered() -> None:
    chain = InMemoryChain(1, finalized_depth=3)
    chain.mine(10)
    tagged = chain.tagged_block("finalized")
    assert tagged is not None and tagged.number == 7 and tagged == chain.block(7)
    assert chain.tagged_block("safe") is None
    assert InMemoryChain(1).tagged_block("finalized") is None


def test_string_instead_of_address_list_is_refused() -> None:
    chain = InMemoryChain()
    with pytest.raises(TypeError):
        chain.transfer_logs(0, 0, USDC)


def test_deterministic() -> None:
    def run() -> list[object]:
        chain = InMemoryChain(8453)
        tx = chain.transfer(USDC, SENDER, ALICE, 7)
        refs = chain.mine(2)
        refs += chain.reorg(1)
        return [tx, *refs, chain.transfer_logs(0, chain.head(), None)]

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
    assert [log.tx_hash for log in to(chain, ALICE)] == [kept]
    assert chain.receipt_status(lost) is None
    assert chain.receipt_status(kept) == (1, 2)

    # Two reorgs at the same height still give fresh hashes.
    again = chain.reorg(2)
    assert {b.hash for b in again}.isdisjoint({b.hash for b in new})
    # A dropped transfer can be mined again later; a shorter branch is allowed
    chain.reorg(2, length=1)
    assert chain.head() == 3
    chain.replay(lost)
    chain.mine()
    assert chain.receipt_status(lost) == (1, 4)
    with pytest.raises(ValueError):
        chain.replay(lost)  # on the chain already


def test_reorg_with_reinclude_moves_transfer_higher() -> None:
    chain = InMemoryChain(1)
    tx = chain.transfer(USDC, SENDER, ALICE, 10)
    chain.mine()
    chain.reorg(1, reinclude=True)
    assert chain.receipt_status(tx) is None
    chain.mine()
    assert chain.receipt_status(tx) == (1, 2)
    (log,) = to(chain, ALICE)
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
    assert chain.transfer_logs(0, 1, None) == []


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
        chain.transfer_logs(0, 0, ["alice"])
