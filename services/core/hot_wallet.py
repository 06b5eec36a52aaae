"""The hot wallet: signs and sends ERC-20 `transfer(to, amount)` from Settle's own key.

The paying side of the chain (the reading side is `services.core.evm`).
"""

from __future__ import annotations

import math
import time
from typing import Any, cast

from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from web3 import Web3
from web3.types import TxParams

from services.core.evm import connect, hex0x, receipt_status

#: 4-byte selector of `transfer(address,uint256)`.
TRANSFER_SELECTOR = keccak(text="transfer(address,uint256)")[:4]


class ReceiptTimeout(TimeoutError):
    """No receipt for a sent transaction within the allowed time."""


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
        self.gas_margin = gas_margin

    @classmethod
    def from_url(
        cls, url: str, private_key: bytes | str, timeout: float, **kwargs: Any
    ) -> Erc20TransferExecutor:
        """An executor over the JSON-RPC node at `url`."""
        return cls(connect(url, timeout), private_key, **kwargs)

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

    def build_transfer(self, token_address: str, to: str, amount_raw: int) -> dict[str, Any]:
        """The unsigned transaction (nonce, fees, gas filled in from the node)."""
        if amount_raw < 0:
            raise ValueError("amount_raw must be >= 0")
        token = to_checksum_address(token_address)
        data = TRANSFER_SELECTOR + abi_encode(
            ["address", "uint256"], [to_checksum_address(to), amount_raw]
        )
        tx: dict[str, Any] = {
            "from": self.address,
            "to": token,
            "value": 0,
            "data": hex0x(data),
            "chainId": self.chain_id,
            # "pending" counts our own unmined transactions, so back-to-back sends
            # through one node do not reuse a nonce.
            "nonce": self.w3.eth.get_transaction_count(self._account.address, "pending"),
        }
        estimate = self.w3.eth.estimate_gas(cast(TxParams, dict(tx)))
        tx["gas"] = math.ceil(estimate * self.gas_margin)
        tx.update(self._fees())
        return tx

    def _fees(self) -> dict[str, int]:
        base_fee = self.w3.eth.get_block("latest").get("baseFeePerGas")
        if base_fee is None:
            return {"gasPrice": int(self.w3.eth.gas_price)}
        # web3 falls back to fee history when eth_maxPriorityFeePerGas is missing.
        priority = int(self.w3.eth.max_priority_fee)
        # 2x base fee absorbs six full blocks of base-fee growth before the tx stalls;
        # only base fee + tip is actually paid.
        return {
            "type": 2,
            "maxPriorityFeePerGas": priority,
            "maxFeePerGas": 2 * int(base_fee) + priority,
        }

    def transfer(self, token_address: str, to: str, amount_raw: int) -> str:
        """Sign and broadcast `transfer(to, amount_raw)` on `token_address`; the tx hash."""
        tx = self.build_transfer(token_address, to, amount_raw)
        del tx["from"]  # the signer implies it; eth-account rejects a mismatch anyway
        signed = self._account.sign_transaction(tx)
        sent = self.w3.eth.send_raw_transaction(signed.raw_transaction)
        return hex0x(sent)

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
