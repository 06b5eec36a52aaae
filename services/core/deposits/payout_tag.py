"""The tag every hot-wallet payout carries, so a payout found on chain names its deposit
without Settle's database (after a restore from a backup, say).

32 bytes (one ABI word) appended to the calldata of `transfer(address,uint256)`, after
its two arguments:

| bytes | content |
|---|---|
| 0-3 | `53 54 4c 01`: `STL` and the format's version, 1 |
| 4-19 | the deposit id's ULID (`dep_<ulid>`) as its 128-bit value, big-endian |
| 20-31 | the first 12 bytes of keccak256 of the deposit's source transfer identity |

The source transfer identity is the text `<chainId>:<sourceTxHash>:<tokenAddress>:
<depositAddress>:<transferSeq>` (hashes and addresses lowercase 0x-hex, numbers in
decimal): what makes a transfer one deposit (`models.TRANSFER_IDENTITY`). A deposit
detected again under another id (a database restored from before it was detected)
still matches its payout by that digest.

ERC-20 contracts ignore calldata past their arguments (Solidity's and Vyper's decoders
read what they need, USDT's size check asks for at least two words); a token that
refused it would fail the gas estimate, before anything is signed. 32 bytes cost
about 500 gas of calldata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from eth_utils import keccak

from services.core.erc20 import TRANSFER_ARGS_END
from shared.ids import ulid_bytes, ulid_text

#: The tag's first four bytes: `STL` and the format's version.
MAGIC = b"STL\x01"
TAG_SIZE = 32
_DEPOSIT_PREFIX = "dep_"


@dataclass(frozen=True)
class PayoutTag:
    """What a payout's tag says: its deposit, and a digest of that deposit's source."""

    deposit_id: str
    source_digest: bytes

    def encode(self) -> bytes:
        return (
            MAGIC + ulid_bytes(self.deposit_id.removeprefix(_DEPOSIT_PREFIX)) + (self.source_digest)
        )


def source_digest(
    chain_id: int, source_tx_hash: str, token_address: str, deposit_address: str, seq: int
) -> bytes:
    """12 bytes naming a deposit's source transfer (see the module's docstring)."""
    identity = (
        f"{int(chain_id)}:{source_tx_hash.lower()}:{token_address.lower()}:"
        f"{deposit_address.lower()}:{int(seq)}"
    )
    return keccak(text=identity)[:12]


class TaggedDeposit(Protocol):
    """What a payout's tag is made of: a deposit's id and its source transfer identity."""

    id: str
    chain_id: int
    source_tx_hash: str
    token_address: str
    deposit_address: str
    transfer_seq: int


def tag_for(deposit: TaggedDeposit) -> PayoutTag:
    """The tag of a deposit's payout."""
    d = deposit
    digest = source_digest(
        d.chain_id, d.source_tx_hash, d.token_address, d.deposit_address, d.transfer_seq
    )
    return PayoutTag(d.id, digest)


def decode(calldata: bytes) -> PayoutTag | None:
    """The tag of a transfer's calldata; None when it carries none (not a Settle payout,
    or one paid before payouts were tagged)."""
    tag = calldata[TRANSFER_ARGS_END:]
    if len(tag) != TAG_SIZE or not tag.startswith(MAGIC):
        return None
    return PayoutTag(_DEPOSIT_PREFIX + ulid_text(tag[4:20]), tag[20:32])
