"""What a sweep reads from a chain about deposit addresses: token and native balances and
nonces at one block (JSON-RPC batches), and the gas of a transfer.

Signing, broadcasting and following transactions is the gas wallet's executor
(`services.core.hot_wallet.Erc20TransferExecutor`), the same code the hot wallet pays
with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

from eth_abi import encode as abi_encode
from eth_utils import keccak, to_checksum_address
from web3 import Web3
from web3.types import BlockIdentifier, TxParams

from services.core.sweeps.documents import transfer_data

#: Calls per JSON-RPC batch.
BATCH = 200
#: A transfer's gas limit is the node's estimate times this (as the hot wallet's).
GAS_MARGIN = 1.25
_BALANCE_OF = keccak(text="balanceOf(address)")[:4]

T = TypeVar("T")


class SweepChain:
    """Reads of one chain's node for sweeps."""

    def __init__(self, w3: Web3) -> None:
        self.w3 = w3

    def chain_id(self) -> int:
        """The chain the node serves (asked every time: a wrong URL must not pass)."""
        return int(self.w3.eth.chain_id)

    def head(self) -> int:
        return int(self.w3.eth.block_number)

    def _batched(self, items: Sequence[T], add: Callable[[Any, T], None]) -> list[Any]:
        out: list[Any] = []
        for start in range(0, len(items), BATCH):
            with self.w3.batch_requests() as batch:
                for item in items[start : start + BATCH]:
                    add(batch, item)
                out.extend(batch.execute())
        return out

    def token_balances(
        self, pairs: Sequence[tuple[str, str]], block: BlockIdentifier
    ) -> dict[tuple[str, str], int]:
        """{(token, owner): balance} at `block`."""

        def add(batch: Any, pair: tuple[str, str]) -> None:
            token, owner = pair
            data = _BALANCE_OF + abi_encode(["address"], [to_checksum_address(owner)])
            call = cast(TxParams, {"to": to_checksum_address(token), "data": "0x" + data.hex()})
            batch.add(self.w3.eth.call(call, block))

        answers = self._batched(pairs, add)
        return {
            pair: int.from_bytes(bytes(raw), "big")
            for pair, raw in zip(pairs, answers, strict=True)
        }

    def native_balances(self, owners: Sequence[str], block: BlockIdentifier) -> dict[str, int]:
        answers = self._batched(
            owners, lambda batch, owner: batch.add(self.w3.eth.get_balance(owner, block))
        )
        return {owner: int(wei) for owner, wei in zip(owners, answers, strict=True)}

    def nonces(self, owners: Sequence[str], block: BlockIdentifier) -> dict[str, int]:
        """Each owner's transaction count at `block` (its next nonce, as mined there)."""
        answers = self._batched(
            owners,
            lambda batch, owner: batch.add(self.w3.eth.get_transaction_count(owner, block)),
        )
        return {owner: int(count) for owner, count in zip(owners, answers, strict=True)}

    def block_hashes(self, numbers: Iterable[int]) -> dict[int, str | None]:
        """The canonical block hash at each height (None past the head)."""
        heights = sorted(set(numbers))
        answers = self._batched(
            heights, lambda batch, number: batch.add(self.w3.eth.get_block(number))
        )
        return {
            n: (None if block is None else "0x" + bytes(block["hash"]).hex())
            for n, block in zip(heights, answers, strict=True)
        }

    def transfer_gas(self, token: str, sender: str, to: str, amount_raw: int) -> int:
        """A gas limit for `sender`'s `transfer(to, amount)`: the node's estimate plus margin."""
        call = {
            "from": to_checksum_address(sender),
            "to": to_checksum_address(token),
            "data": transfer_data(to, amount_raw),
        }
        return math.ceil(self.w3.eth.estimate_gas(cast(TxParams, call)) * GAS_MARGIN)
