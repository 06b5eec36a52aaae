"""ERC-20 `transfer(address,uint256)` calldata, built and read (pure: no node, no web3).

The hot wallet builds payouts with it (`hot_wallet.py`, a tag appended: see
`deposits/payout_tag.py`); the payment's judge reads back what a payout moves.
"""

from __future__ import annotations

from eth_utils import keccak

#: 4-byte selector of `transfer(address,uint256)`.
TRANSFER_SELECTOR = keccak(text="transfer(address,uint256)")[:4]
#: Where the two arguments end: anything after is not the call's (a payout's tag).
TRANSFER_ARGS_END = 4 + 64


def transfer_calldata(to: str, amount_raw: int, tag: bytes = b"") -> bytes:
    """Calldata of `transfer(to, amount)` with `tag` appended."""
    address = bytes.fromhex(to[2:] if to.startswith("0x") else to)
    if len(address) != 20 or not 0 <= amount_raw < 2**256:
        raise ValueError("transfer(address,uint256) takes a 20-byte address and a uint256")
    return TRANSFER_SELECTOR + bytes(12) + address + amount_raw.to_bytes(32, "big") + tag


def transfer_args(data: str | bytes) -> tuple[str, int]:
    """(to, amount) of a `transfer(to, amount)` call's calldata (0x-hex or bytes); the
    address lowercase. ValueError for other calldata."""
    if isinstance(data, str):
        data = bytes.fromhex(data[2:] if data.startswith("0x") else data)
    if data[:4] != TRANSFER_SELECTOR or len(data) < TRANSFER_ARGS_END:
        raise ValueError("not a transfer(address,uint256) call")
    return "0x" + data[16:36].hex(), int.from_bytes(data[36:68], "big")
