"""The hot wallet: signs ERC-20 `transfer(to, amount)` from Settle's own key, broadcasts
and looks the transactions up.

The paying side of the chain (the reading side is `services.core.evm`). The steps are
separate on purpose: a payment is drafted (node calls), signed with a nonce Settle
allocated itself (no I/O), stored, and only then broadcast (`deposits/payments.py`).
Once signed, a transaction is only ever broadcast again as the same bytes, or replaced
by one with the same nonce and calldata and higher fees (`bump`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, cast

from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.datastructures import AttributeDict
from web3.exceptions import (
    BlockNotFound,
    TransactionIndexingInProgress,
    TransactionNotFound,
    Web3RPCError,
)
from web3.types import TxParams

from services.core.erc20 import transfer_calldata
from services.core.evm import TRANSFER_TOPIC, ChainIdMismatch, connect, hex0x, receipt_status

#: `balanceOf(address)`.
BALANCE_OF_SELECTOR = keccak(text="balanceOf(address)")[:4]
#: Gas of a plain transfer of the native token (a cancel: zero value to oneself).
NATIVE_TRANSFER_GAS = 21_000


class ReceiptTimeout(TimeoutError):
    """No receipt for a sent transaction within the allowed time."""


@dataclass(frozen=True)
class Signed:
    """A signed transaction: its bytes (0x-hex) and hash."""

    raw: str
    hash: str


@dataclass(frozen=True)
class Receipt:
    status: int
    block_number: int
    block_hash: str


@dataclass(frozen=True)
class Market:
    """What the network asks per gas now: the fee fields a new transaction would carry,
    and the latest block's base fee (None on a chain without EIP-1559)."""

    fees: dict[str, int]
    base_fee: int | None


class Erc20TransferExecutor:
    """Signs and sends ERC-20 `transfer(to, amount)` from a hot wallet key."""

    def __init__(
        self,
        w3: Web3,
        private_key: bytes | str,
        *,
        chain_id: int | None = None,
        gas_margin: float = 1.25,
    ) -> None:
        if gas_margin < 1.0:
            raise ValueError("gas_margin must be >= 1.0")
        self.w3 = w3
        self._account: LocalAccount = Account.from_key(private_key)
        self._chain_id = chain_id
        self._chain_verified = False
        self.gas_margin = gas_margin

    @classmethod
    def from_url(
        cls, url: str, private_key: bytes | str, timeout: float, **kwargs: Any
    ) -> Erc20TransferExecutor:
        """An executor over the JSON-RPC node at `url`."""
        w3 = connect(url, timeout)
        # web3's HTTPProvider re-sends a timed-out or reset call itself (broadcasts
        # included, up to 5 times): only the payment logic may decide to send again.
        w3.provider.exception_retry_configuration = None  # type: ignore[attr-defined]
        return cls(w3, private_key, **kwargs)

    def __repr__(self) -> str:
        # Never let the key reach a log line through a repr.
        return f"Erc20TransferExecutor(address={self.address})"

    @property
    def address(self) -> str:
        """The hot wallet's checksummed address."""
        return str(self._account.address)

    @property
    def chain_id(self) -> int:
        """The chain id signed into every transaction (EIP-155 replay protection)."""
        if self._chain_id is None:
            self._chain_id = int(self.w3.eth.chain_id)
        return self._chain_id

    def verify_chain(self) -> None:
        """ChainIdMismatch unless the node serves the chain this wallet signs for (asked
        once, then remembered): nonces, receipts and balances of another chain would be
        judged as this one's."""
        if self._chain_verified:
            return
        served = int(self.w3.eth.chain_id)
        if self._chain_id is not None and served != self._chain_id:
            raise ChainIdMismatch(self._chain_id, served)
        self._chain_id = served
        self._chain_verified = True

    # -- drafting and signing --------------------------------------------------------------

    def draft(
        self,
        token_address: str,
        to: str,
        amount_raw: int,
        tag: bytes = b"",
        *,
        fees: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """The unsigned transaction without its nonce (gas, and fees unless given, filled
        in from the node); `tag` is appended to the calldata (deposits/payout_tag.py)."""
        if amount_raw < 0:
            raise ValueError("amount_raw must be >= 0")
        data = transfer_calldata(to_checksum_address(to), amount_raw, tag)
        tx: dict[str, Any] = {
            "to": to_checksum_address(token_address),
            "value": 0,
            "data": hex0x(data),
            "chainId": self.chain_id,
        }
        estimate = self.w3.eth.estimate_gas(cast(TxParams, {"from": self.address, **tx}))
        tx["gas"] = math.ceil(estimate * self.gas_margin)
        tx.update(self.fees() if fees is None else fees)
        return tx

    def build_transfer(self, token_address: str, to: str, amount_raw: int) -> dict[str, Any]:
        """The unsigned transaction with the node's pending nonce (tools and tests)."""
        tx = self.draft(token_address, to, amount_raw)
        return {"from": self.address, **tx, "nonce": self.nonce("pending")}

    def fees(self) -> dict[str, int]:
        """The fee fields the network asks for now."""
        return self.market().fees

    def market(self) -> Market:
        """The fee fields the network asks for now, and the latest base fee."""
        base_fee = self.w3.eth.get_block("latest").get("baseFeePerGas")
        if base_fee is None:
            return Market({"gasPrice": int(self.w3.eth.gas_price)}, None)
        # web3 falls back to fee history when eth_maxPriorityFeePerGas is missing.
        priority = int(self.w3.eth.max_priority_fee)
        # 2x base fee absorbs six full blocks of base-fee growth before the tx stalls;
        # only base fee + tip is actually paid.
        fees = {
            "type": 2,
            "maxPriorityFeePerGas": priority,
            "maxFeePerGas": 2 * int(base_fee) + priority,
        }
        return Market(fees, int(base_fee))

    def cancel_tx(self, fees: dict[str, int]) -> dict[str, Any]:
        """An unsigned zero-value transfer to the wallet itself with these fees: signed
        with a payment's nonce, it makes that payment unminable."""
        return {
            "to": self.address,
            "value": 0,
            "data": "0x",
            "gas": NATIVE_TRANSFER_GAS,
            "chainId": self.chain_id,
            **fees,
        }

    def token_balance(self, token_address: str, block: str = "pending") -> int:
        """The wallet's balance of a token (base units) at `block`."""
        data = BALANCE_OF_SELECTOR + abi_encode(["address"], [self.address])
        call = cast(TxParams, {"to": to_checksum_address(token_address), "data": hex0x(data)})
        return int.from_bytes(self.w3.eth.call(call, block), "big")

    def native_balance(self, block: str = "pending") -> int:
        """The wallet's balance of the chain's native token (wei) at `block`."""
        return int(self.w3.eth.get_balance(self.address, block))

    def sign(self, tx: dict[str, Any], nonce: int) -> Signed:
        """Sign `tx` with `nonce` (no I/O)."""
        signed = self._account.sign_transaction({**tx, "nonce": nonce})
        return Signed(hex0x(signed.raw_transaction), hex0x(signed.hash))

    # -- the network -----------------------------------------------------------------------

    def broadcast(self, raw: str) -> str:
        """Send signed bytes; the hash the node answered. Errors propagate: the caller
        decides what an error after signing means (unknown, never "not sent")."""
        return hex0x(self.w3.eth.send_raw_transaction(HexBytes(raw)))

    def transfer(self, token_address: str, to: str, amount_raw: int) -> str:
        """Sign with the pending nonce and broadcast at once; the tx hash.

        For tools and tests only: credits are paid through `deposits/payments.py`, which
        stores what it signed before it broadcasts.
        """
        tx = self.build_transfer(token_address, to, amount_raw)
        signed = self.sign(tx, tx.pop("nonce"))
        return self.broadcast(signed.raw)

    def nonce(self, block: str | int = "latest") -> int:
        """The wallet's transaction count at `block` ("latest": mined; "pending")."""
        return int(self.w3.eth.get_transaction_count(self._account.address, block))

    def head(self) -> int:
        return int(self.w3.eth.block_number)

    def nonce_user(self, nonce: int, at_block: int, since: int = 0) -> str | None:
        """Hash of the canonical transaction that used the wallet's `nonce`, if it was
        used at or before `at_block` (None: not used there, or not found).

        Finds the block where the wallet's count passed `nonce` (a binary search on
        `eth_getTransactionCount` at block heights), then reads that block's
        transactions: the proof a payment can no longer be mined is another
        transaction with its nonce, not a missing receipt (receipts can be missing or
        stale on a lagging or load-balanced node).

        `since`: a block where the nonce was still unused (the head when the payment's
        first transaction was signed), so the search stays within recent state (a full
        node keeps ~128 blocks of it). Should the count have passed `nonce` there
        already, the search first steps back (1, 2, 4... blocks) to where it had not:
        starting where the nonce was already used would never find its block.
        """
        if self.nonce(at_block) <= nonce:
            return None
        lo, hi = min(since, at_block), at_block  # count(hi) > nonce: find the first such
        step = 1
        while lo > 0 and self.nonce(lo) > nonce:
            hi = lo
            lo = max(0, lo - step)
            step *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            if self.nonce(mid) > nonce:
                hi = mid
            else:
                lo = mid + 1
        block = self.w3.eth.get_block(lo, full_transactions=True)
        for tx in block["transactions"]:
            if (
                isinstance(tx, dict | AttributeDict)
                and str(tx["from"]).lower() == self.address.lower()
                and int(tx["nonce"]) == nonce
            ):
                return hex0x(tx["hash"]).lower()
        return None

    def block_hash(self, number: int) -> str | None:
        """The canonical block hash at `number` (None past the head)."""
        try:
            block = self.w3.eth.get_block(number)
        except Exception as exc:  # web3's BlockNotFound, by its name across versions
            if type(exc).__name__ == "BlockNotFound":
                return None
            raise
        return hex0x(block["hash"]).lower()

    def receipt(self, tx_hash: str) -> Receipt | None:
        """The transaction's receipt, or None when the node has none (not mined)."""
        try:
            receipt = self.w3.eth.get_transaction_receipt(HexBytes(tx_hash))
        except (TransactionNotFound, TransactionIndexingInProgress):
            return None
        if receipt.get("blockNumber") is None:
            return None
        return Receipt(
            int(receipt["status"]), int(receipt["blockNumber"]), hex0x(receipt["blockHash"]).lower()
        )

    def tagged_block(self, tag: str) -> int | None:
        """The number of the block a tag names (`finalized`, `safe`); None when the node
        does not offer it."""
        try:
            return int(self.w3.eth.get_block(tag)["number"])  # type: ignore[arg-type]
        except (Web3RPCError, BlockNotFound):  # a node without the tag answers an error
            return None

    def transferred(self, block_hash: str, tx_hash: str, token_address: str, to: str) -> int | None:
        """The amount the transaction moved from the wallet to `to` in `token_address`'s
        `Transfer` logs of that block, asked by the block's hash (0: none; None: the node
        does not have the block)."""
        wallet_topic = "0x" + "00" * 12 + self.address[2:].lower()
        to_topic = "0x" + "00" * 12 + to_checksum_address(to)[2:].lower()
        try:
            logs = self.w3.eth.get_logs(
                {
                    "blockHash": HexBytes(block_hash),
                    "address": to_checksum_address(token_address),
                    "topics": [TRANSFER_TOPIC, wallet_topic, to_topic],
                }
            )
        except Web3RPCError:  # a node that does not have the block answers an error
            return None
        return sum(
            int.from_bytes(HexBytes(log["data"]), "big")
            for log in logs
            if hex0x(log["transactionHash"]).lower() == tx_hash.lower() and not log.get("removed")
        )

    def known(self, tx_hash: str) -> bool:
        """Whether the node has the transaction (pooled or mined)."""
        try:
            return self.w3.eth.get_transaction(HexBytes(tx_hash)) is not None
        except TransactionNotFound:
            return False

    def wait_receipt(
        self, tx_hash: str, timeout_s: float = 120.0, poll_s: float = 1.0
    ) -> tuple[int, int]:
        """(status, block number) once mined; ReceiptTimeout after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = receipt_status(self.w3, tx_hash)
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReceiptTimeout(f"no receipt for {tx_hash} after {timeout_s}s")
            time.sleep(min(poll_s, remaining))
