"""Foundry's anvil: a real Ethereum node for the tests where a behaviour depends on one.

eth-tester (`tests/support/evm_chain.py`) is fast and in-process; anvil is what a node
really does: a mempool (automine off, `drop`), reorgs (`anvil_reorg`), base-fee control,
state dumps. `make test` and `.ci/run` install it from npm (tools/anvil, version and
integrity pinned in its package-lock.json); a test that needs it skips on a laptop
without it and fails in CI (`CI` set).

    with AnvilNode(chain_id=137) as node:
        token = node.deploy_token("USDC", 6)
        node.mint(token, address, 5 * 10**6)
        reader = Web3ChainReader.from_url(node.url, 10.0, node.chain_id)

Every node listens on 127.0.0.1 on a free port and is stopped with the context.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3 import HTTPProvider, Web3
from web3.contract import Contract

from tests.support.evm_chain import CALL_GAS, DEPLOY_GAS, compiled_token
from tests.support.processes import free_port

#: Where `make test` installs anvil (tools/anvil/package.json).
ANVIL_IN_REPO = Path(__file__).resolve().parents[2] / "tools" / "anvil" / "node_modules" / ".bin"
#: anvil's well-known development mnemonic: its ten prefunded accounts (10,000 ETH each).
DEV_MNEMONIC = "test test test test test test test test test test test junk"
START_TIMEOUT_S = 20.0

Account.enable_unaudited_hdwallet_features()


def anvil_binary() -> str | None:
    """The anvil executable: SETTLE_TEST_ANVIL, the repository's tools/anvil, or PATH."""
    explicit = os.environ.get("SETTLE_TEST_ANVIL")
    if explicit:
        return explicit
    in_repo = ANVIL_IN_REPO / "anvil"
    if in_repo.exists():
        return str(in_repo)
    return shutil.which("anvil")


def require_anvil() -> str:
    """The anvil executable; skip without one (fail in CI, which must install it)."""
    binary = anvil_binary()
    if binary:
        return binary
    message = "anvil is not installed (make test-tools installs it into tools/anvil)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must install it", pytrace=False)
    pytest.skip(message)


class AnvilError(RuntimeError):
    """A JSON-RPC error answered by anvil."""


class AnvilNode:
    """One anvil process on 127.0.0.1, with helpers for tokens, blocks, mempool and reorgs."""

    def __init__(
        self,
        chain_id: int = 31337,
        *,
        automine: bool = True,
        block_time_s: float | None = None,
        base_fee_wei: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.chain_id = chain_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._args = [
            require_anvil(),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--chain-id",
            str(chain_id),
            "--mnemonic",
            DEV_MNEMONIC,
            "--accounts",
            "10",
            "--silent",
        ]
        if not automine:
            self._args.append("--no-mining")
        if block_time_s is not None:
            self._args += ["--block-time", str(block_time_s)]
        if base_fee_wei is not None:
            self._args += ["--base-fee", str(base_fee_wei)]
        self._args += list(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._http = requests.Session()
        self.w3 = Web3(HTTPProvider(self.url, request_kwargs={"timeout": 10}))
        #: The ten prefunded development accounts; the first deploys and mints tokens.
        self.accounts: list[LocalAccount] = [
            Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}")
            for i in range(10)
        ]
        self.deployer = self.accounts[0]
        #: The contract each deployed token is (for its ABI).
        self._contracts: dict[str, str] = {}

    # -- process ------------------------------------------------------------------------

    def start(self) -> AnvilNode:
        self._process = subprocess.Popen(
            self._args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if int(self.rpc("eth_chainId"), 16) == self.chain_id:
                    return self
            except (requests.ConnectionError, AnvilError):
                pass
            if self._process.poll() is not None:
                err = self._process.stderr.read().decode() if self._process.stderr else ""
                raise RuntimeError(f"anvil exited with {self._process.returncode}: {err}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"anvil did not answer on {self.url} in {START_TIMEOUT_S} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the process (the node's state is gone unless dumped)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._http.close()

    def __enter__(self) -> AnvilNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- JSON-RPC -----------------------------------------------------------------------

    def rpc(self, method: str, *params: Any) -> Any:
        """One JSON-RPC call; its result, or AnvilError with the node's message."""
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}
        answer = self._http.post(self.url, json=body, timeout=10).json()
        if "error" in answer:
            raise AnvilError(f"{method}: {answer['error'].get('message')}")
        return answer.get("result")

    # -- blocks and mempool -------------------------------------------------------------

    def head(self) -> int:
        return int(self.rpc("eth_blockNumber"), 16)

    def block_hash(self, number: int) -> str:
        return str(self.rpc("eth_getBlockByNumber", hex(number), False)["hash"])

    def mine(self, blocks: int = 1) -> int:
        """Mine `blocks` blocks (pending transactions go in the first); the new head."""
        self.rpc("anvil_mine", hex(blocks))
        return self.head()

    def set_automine(self, on: bool) -> None:
        self.rpc("evm_setAutomine", on)

    def drop(self, tx_hash: str) -> None:
        """Evict a pending transaction from the mempool (as a node forgets one)."""
        self.rpc("anvil_dropTransaction", tx_hash)

    def pending(self) -> list[str]:
        """Hashes of the transactions in the mempool."""
        content = self.rpc("txpool_content")
        return [
            tx["hash"]
            for by_sender in content.get("pending", {}).values()
            for tx in by_sender.values()
        ]

    def set_next_base_fee(self, wei: int) -> None:
        self.rpc("anvil_setNextBlockBaseFeePerGas", hex(wei))

    def reorg(self, depth: int, transactions: Sequence[tuple[str, int]] = ()) -> None:
        """Replace the last `depth` blocks (`anvil_reorg`); `transactions`: (raw signed
        tx hex, offset of the new block it goes in) re-included on the new branch."""
        self.rpc("anvil_reorg", depth, [list(pair) for pair in transactions])

    def snapshot(self) -> str:
        return str(self.rpc("evm_snapshot"))

    def revert(self, snapshot_id: str) -> None:
        if not self.rpc("evm_revert", snapshot_id):
            raise AnvilError(f"evm_revert: no snapshot {snapshot_id}")

    def dump_state(self) -> str:
        """The node's whole state (hex), for `load_state` on this or another node."""
        return str(self.rpc("anvil_dumpState"))

    def load_state(self, state: str) -> None:
        self.rpc("anvil_loadState", state)

    # -- accounts and balances ----------------------------------------------------------

    def set_balance(self, address: str, wei: int) -> None:
        self.rpc("anvil_setBalance", to_checksum_address(address), hex(wei))

    def balance(self, address: str) -> int:
        return int(self.rpc("eth_getBalance", to_checksum_address(address), "latest"), 16)

    def nonce(self, address: str, block: str = "latest") -> int:
        return int(self.rpc("eth_getTransactionCount", to_checksum_address(address), block), 16)

    def receipt(self, tx_hash: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.rpc("eth_getTransactionReceipt", tx_hash)
        return result

    # -- tokens -------------------------------------------------------------------------

    def token(self, address: str) -> Contract:
        compiled = compiled_token(self._contracts.get(to_checksum_address(address), "TestToken"))
        return self.w3.eth.contract(address=to_checksum_address(address), abi=compiled.abi)

    def deploy_token(
        self, symbol: str, decimals: int, name: str | None = None, *, contract: str = "TestToken"
    ) -> str:
        """Deploy a token of tests/support/contracts (TestToken unless told) minted by the
        deployer; its address."""
        compiled = compiled_token(contract)
        factory = self.w3.eth.contract(abi=compiled.abi, bytecode=compiled.bytecode)
        data = factory.constructor(name or f"Test {symbol}", symbol, decimals).data_in_transaction
        tx_hash = self.send(self.deployer, {"data": data, "gas": DEPLOY_GAS}, wait=True)
        receipt = self.receipt(tx_hash)
        if not receipt or int(receipt["status"], 16) != 1 or not receipt["contractAddress"]:
            raise RuntimeError(f"{contract} deployment failed: {receipt}")
        address = to_checksum_address(receipt["contractAddress"])
        self._contracts[address] = contract
        return address

    def mint(self, token: str, to: str, amount_raw: int) -> str:
        data = self.token(token).encode_abi("mint", args=[to_checksum_address(to), amount_raw])
        return self.send(self.deployer, {"to": to_checksum_address(token), "data": data}, wait=True)

    def transfer(
        self, token: str, sender: LocalAccount, to: str, amount_raw: int, *, wait: bool = True
    ) -> str:
        """`transfer(to, amount)` signed by `sender`; with `wait`, mined (automine on)."""
        data = self.token(token).encode_abi("transfer", args=[to_checksum_address(to), amount_raw])
        return self.send(sender, {"to": to_checksum_address(token), "data": data}, wait=wait)

    def balance_of(self, token: str, owner: str) -> int:
        return int(self.token(token).functions.balanceOf(to_checksum_address(owner)).call())

    def send(self, signer: LocalAccount, tx: dict[str, Any], *, wait: bool = False) -> str:
        """Sign `tx` (EIP-1559, pending nonce) and send it raw; its hash."""
        return self.send_raw(self.sign(signer, tx), wait=wait)

    def sign(self, signer: LocalAccount, tx: dict[str, Any]) -> str:
        """A raw signed transaction (hex), nonce and fees filled from the node."""
        base_fee = int(self.rpc("eth_getBlockByNumber", "latest", False)["baseFeePerGas"], 16)
        full = {
            "value": 0,
            "gas": CALL_GAS,
            "nonce": self.nonce(signer.address, "pending"),
            "chainId": self.chain_id,
            "type": 2,
            "maxPriorityFeePerGas": 10**9,
            "maxFeePerGas": 2 * base_fee + 10**9,
            **tx,
        }
        return HexBytes(signer.sign_transaction(full).raw_transaction).to_0x_hex()

    def send_raw(self, raw: str, *, wait: bool = False) -> str:
        tx_hash = str(self.rpc("eth_sendRawTransaction", raw))
        if wait:
            self.wait_mined(tx_hash)
        return tx_hash

    def wait_mined(self, tx_hash: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (receipt := self.receipt(tx_hash)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{tx_hash} not mined in {timeout} s")
            time.sleep(0.02)
        return receipt


@contextmanager
def anvil_nodes(*chain_ids: int, **kwargs: Any) -> Iterator[list[AnvilNode]]:
    """Several anvil nodes at once (one per chain id), all stopped at the end."""
    nodes: list[AnvilNode] = []
    try:
        for chain_id in chain_ids:
            nodes.append(AnvilNode(chain_id, **kwargs).start())
        yield nodes
    finally:
        for node in nodes:
            node.stop()
