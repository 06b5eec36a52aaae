"""In-process EVM for tests: eth-tester + py-evm, with our own ERC-20 (TestToken.vy).

What we found about eth-tester 0.14 / py-evm (and why the harness works as it does):

- Auto-mining is left ON. A transaction sent through web3 (`eth_sendTransaction` or
  `eth_sendRawTransaction`, e.g. by `Erc20TransferExecutor`) is mined at once into a
  block of its own, together with anything already queued in the pending block.
- `disable_auto_mine_transactions()` is a trap for multi-transaction blocks: each
  transaction is validated against the *latest* state and held in a side queue, so a
  second transaction from the same sender fails ("Invalid transaction nonce"),
  `eth_getTransactionCount(pending)` does not count queued ones, and every web3 send
  in that mode resets the backend's pending block (wiping anything queued there).
- What works: the harness signs its own transactions and hands them to
  `tester.backend.send_raw_transaction`, which applies them to py-evm's pending block
  without mining; `mine()` then seals them all into one block (several per sender are
  fine, `eth_getTransactionCount(pending)` sees them). Hence `transfer()` queues and
  returns at once: the transfer lands in the next mined block, as on `InMemoryChain`.
  `deploy_token`, `mint` and `fund` mine immediately (taking queued transfers along).
- A queued (unmined) transaction has no receipt: web3 raises TransactionNotFound.
- `logIndex` restarts at 0 in every transaction (real nodes number logs per block).
- Reorgs: `snapshot()` remembers the head; `revert(id)` makes it canonical again
  (dropping the pending block too); blocks mined afterwards get new hashes at the
  same heights because py-evm draws a random mix_hash per block. `rewind(depth)` does
  the same without a snapshot taken beforehand (py-evm's snapshot is a block hash), and
  `replay(tx_hash)` queues a transaction the harness signed again, so a reorg can re-mine
  a transfer in another block or behind other transactions (`reorg()` does both).
- One lock (`EvmChain.lock`) serialises every use of the tester: `EvmNode` serves the
  same chain to other threads over HTTP while the test mines and transfers.
- eth_gasPrice is a constant 1 gwei, while the base fee falls ~12.5% per empty block.
- The chain id is 131277322940537 (not 1); the 10 prefunded accounts' keys are
  `tester.backend.account_keys`.
- vyper 0.4 compiles TestToken offline in-process in ~0.15 s (cached per process); a new
  chain takes ~10 ms, a queued transfer ~12 ms.
- eth-tester's eth_getLogs is slow and not a benchmark: every call RLP-decodes every
  block in the range and matches topics in Python (~0.4 s for 20 blocks of 200
  transfers, minutes for thousands of logs x thousands of addresses). Keep ranges and
  address lists small here; test volume on `InMemoryChain`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import vyper
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_tester import EthereumTester, PyEVMBackend
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3 import EthereumTesterProvider, Web3
from web3.contract import Contract

from services.core.evm import Web3ChainReader

TOKEN_SOURCE = Path(__file__).with_name("contracts") / "TestToken.vy"
#: Where the test contracts' sources are (`compiled_token(name)`).
CONTRACTS = TOKEN_SOURCE.parent

#: Fixed gas limits: queued transactions cannot be estimated against the pending state.
DEPLOY_GAS = 2_000_000
CALL_GAS = 120_000
ETH_TRANSFER_GAS = 21_000

#: ETH the harness gives an account it signs for but did not fund yet.
DEFAULT_FUNDING_WEI = 10**18

PRIORITY_FEE_WEI = 10**9


@dataclass(frozen=True)
class CompiledContract:
    abi: list[dict[str, Any]]
    bytecode: str


@cache
def compiled_token(name: str = "TestToken") -> CompiledContract:
    """A token of tests/support/contracts (TestToken.vy by default) compiled with vyper's
    Python API (once per process)."""
    source = CONTRACTS / f"{name}.vy"
    out = vyper.compile_code(
        source.read_text(encoding="utf-8"),
        contract_path=str(source),
        output_formats=["abi", "bytecode"],
    )
    return CompiledContract(abi=out["abi"], bytecode=out["bytecode"])


Sender = str | bytes | LocalAccount


class EvmChain:
    """An eth-tester chain with helpers to deploy, mint, transfer, mine and reorg."""

    def __init__(self) -> None:
        self.tester = EthereumTester(PyEVMBackend())
        self.w3 = Web3(EthereumTesterProvider(self.tester))
        self.chain_id = int(self.w3.eth.chain_id)
        #: eth-tester's ten prefunded accounts, as signers.
        self.accounts: list[LocalAccount] = [
            Account.from_key(k.to_bytes()) for k in self.tester.backend.account_keys
        ]
        self.deployer = self.accounts[0]
        self._by_address = {a.address: a for a in self.accounts}
        self._funded: set[str] = {a.address for a in self.accounts}
        #: Held around every use of the tester (the HTTP node serves it from other threads).
        self.lock = threading.RLock()
        #: Raw signed transactions the harness sent, by hash, so a reorg can replay them.
        self._raw: dict[str, bytes] = {}
        #: Called (under the lock) before blocks are mined: a node's pool adds its
        #: transactions to the pending block there.
        self.before_mine: list[Callable[[], None]] = []
        self._node: Any = None

    # -- readers ------------------------------------------------------------------------

    def reader(self, **kwargs: int) -> Web3ChainReader:
        """A Web3ChainReader on this chain, over HTTP JSON-RPC as in production.

        The node (`EvmNode`, sends mined at once) starts on first use and serves this
        chain for the rest of the process.
        """
        if self._node is None:
            from tests.support.evm_node import EvmNode  # it imports this module

            self._node = EvmNode(self).start()
        return Web3ChainReader.from_url(self._node.url, 10.0, self.chain_id, **kwargs)

    def head(self) -> int:
        """Number of the latest mined block."""
        with self.lock:
            return int(self.w3.eth.block_number)

    def block_hash(self, number: int) -> str:
        """0x-hex hash of the canonical block at `number`."""
        with self.lock:
            return HexBytes(self.w3.eth.get_block(number)["hash"]).to_0x_hex()

    def receipt(self, tx_hash: str) -> Any:
        """The receipt of a mined transaction (web3 raises TransactionNotFound otherwise)."""
        with self.lock:
            return self.w3.eth.get_transaction_receipt(HexBytes(tx_hash))

    def token(self, address: str) -> Contract:
        """A web3 contract object for a deployed TestToken."""
        return self.w3.eth.contract(address=to_checksum_address(address), abi=compiled_token().abi)

    def balance_of(self, token: str, owner: str) -> int:
        """Token balance (raw units) of `owner` at the latest block."""
        with self.lock:
            return int(self.token(token).functions.balanceOf(to_checksum_address(owner)).call())

    # -- accounts -----------------------------------------------------------------------

    def account(self, sender: Sender) -> LocalAccount:
        """A signer: a prefunded account's address, a private key, or a LocalAccount."""
        if isinstance(sender, LocalAccount):
            return sender
        if isinstance(sender, str) and len(sender) == 42:
            try:
                return self._by_address[to_checksum_address(sender)]
            except KeyError:
                raise ValueError(f"{sender} is not an eth-tester account") from None
        signer: LocalAccount = Account.from_key(sender)
        return signer

    def new_account(self, eth_wei: int = DEFAULT_FUNDING_WEI) -> LocalAccount:
        """A fresh key pair funded with `eth_wei` (mined at once)."""
        acct: LocalAccount = Account.create()
        self.fund(acct.address, eth_wei)
        return acct

    def fund(self, address: str, wei: int = DEFAULT_FUNDING_WEI, *, mine: bool = True) -> str:
        """Send ETH from the deployer; mined at once unless `mine=False`."""
        address = to_checksum_address(address)
        self._funded.add(address)
        return self._send(
            self.deployer, {"to": address, "value": wei, "gas": ETH_TRANSFER_GAS}, mine=mine
        )

    # -- tokens -------------------------------------------------------------------------

    def deploy_token(self, symbol: str, decimals: int, name: str | None = None) -> str:
        """Deploy a TestToken (deployer = minter); its checksummed address."""
        compiled = compiled_token()
        factory = self.w3.eth.contract(abi=compiled.abi, bytecode=compiled.bytecode)
        data = factory.constructor(name or f"Test {symbol}", symbol, decimals).data_in_transaction
        tx_hash = self._send(self.deployer, {"data": data, "gas": DEPLOY_GAS}, mine=True)
        receipt = self.receipt(tx_hash)
        if receipt["status"] != 1 or receipt["contractAddress"] is None:
            raise RuntimeError(f"TestToken deployment failed: {receipt}")
        return to_checksum_address(receipt["contractAddress"])

    def mint(self, token: str, to: str, amount_raw: int) -> str:
        """Mint tokens to `to` (mined at once); the tx hash."""
        data = self._call_data(token, "mint", to_checksum_address(to), amount_raw)
        return self._send(
            self.deployer,
            {"to": to_checksum_address(token), "data": data, "gas": CALL_GAS},
            mine=True,
        )

    def transfer(
        self, token: str, from_account: Sender, to: str, amount_raw: int, *, mine: bool = False
    ) -> str:
        """Queue `transfer(to, amount)` from `from_account` for the next mined block."""
        signer = self.account(from_account)
        if signer.address not in self._funded:
            # Gas money rides in the same pending block, ahead of the transfer.
            self.fund(signer.address, mine=False)
        data = self._call_data(token, "transfer", to_checksum_address(to), amount_raw)
        return self._send(
            signer, {"to": to_checksum_address(token), "data": data, "gas": CALL_GAS}, mine=mine
        )

    # -- blocks -------------------------------------------------------------------------

    def mine(self, n: int = 1) -> list[str]:
        """Mine `n` blocks (the first takes queued transactions); their hashes."""
        with self.lock:
            for hook in self.before_mine:
                hook()
            return [HexBytes(h).to_0x_hex() for h in self.tester.mine_blocks(n)]

    def snapshot(self) -> int:
        """Remember the current head, for `revert`."""
        with self.lock:
            return int(self.tester.take_snapshot())

    def revert(self, snapshot_id: int) -> None:
        """Make the snapshot's head canonical again; later heights are mined anew."""
        with self.lock:
            self.tester.revert_to_snapshot(snapshot_id)

    def rewind(self, depth: int) -> int:
        """Drop the last `depth` blocks (and the pending block): the new head's number.

        Blocks mined afterwards replace them with new hashes; their transactions are
        gone unless replayed (`replay`).
        """
        with self.lock:
            head = self.head()
            if not 1 <= depth <= head:
                raise ValueError(f"depth must be in [1, {head}], got {depth}")
            base = self.w3.eth.get_block(head - depth)["hash"]
            # py-evm's snapshot is the hash of the block to return to.
            self.tester.backend.revert_to_snapshot(bytes(base))
            return head - depth

    def replay(self, tx_hash: str) -> str:
        """Queue a transaction this harness signed before (e.g. one a reorg dropped)."""
        try:
            raw = self._raw[HexBytes(tx_hash).to_0x_hex()]
        except KeyError:
            raise ValueError(f"{tx_hash} was not sent by this harness") from None
        with self.lock:
            return HexBytes(self.tester.backend.send_raw_transaction(raw)).to_0x_hex()

    def reorg(
        self,
        depth: int,
        *,
        reinclude: Sequence[str] = (),
        skip: int = 0,
        length: int | None = None,
    ) -> list[str]:
        """Replace the last `depth` blocks with a new branch; its block hashes.

        `reinclude`: transactions re-mined on the new branch, in this order, in its
        block `skip` (0: the first), so a transfer moves to another block (`skip` > 0)
        or another log position (other transactions listed or queued ahead of it, the
        caller may also queue its own after `rewind`). `length`: blocks of the new
        branch (default `depth`; shorter or longer is allowed, at least `skip` + 1 when
        re-including).
        """
        length = depth if length is None else length
        if reinclude and length < skip + 1:
            raise ValueError("the new branch is too short for the re-included transactions")
        with self.lock:
            self.rewind(depth)
            hashes = self.mine(skip) if skip else []
            for tx_hash in reinclude:
                self.replay(tx_hash)
            if length > len(hashes):
                hashes += self.mine(length - len(hashes))
            return hashes

    # -- internals ----------------------------------------------------------------------

    def _call_data(self, token: str, fn: str, *args: Any) -> str:
        data: str = self.token(token).encode_abi(fn, args=list(args))
        return data

    def _send(self, signer: LocalAccount, tx: dict[str, Any], *, mine: bool) -> str:
        with self.lock:
            # Pending nonce and pending base fee: several queued transactions per sender.
            nonce = self.w3.eth.get_transaction_count(signer.address, "pending")
            base_fee = int(self.w3.eth.get_block("latest")["baseFeePerGas"])
            full = {
                "value": 0,
                **tx,
                "nonce": nonce,
                "chainId": self.chain_id,
                "type": 2,
                "maxPriorityFeePerGas": PRIORITY_FEE_WEI,
                "maxFeePerGas": 2 * base_fee + PRIORITY_FEE_WEI,
            }
            signed = signer.sign_transaction(full)
            raw = bytes(signed.raw_transaction)
            # Straight to py-evm's pending block: eth-tester's own send path would either
            # mine at once (auto-mine) or validate against the latest state (manual mining).
            tx_hash = HexBytes(self.tester.backend.send_raw_transaction(raw)).to_0x_hex()
            self._raw[tx_hash] = raw
            if mine:
                self.mine(1)
            return tx_hash
