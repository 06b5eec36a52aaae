"""Deposit addresses derived from a BIP32 extended public key (secp256k1), by bip-utils.

Settle holds only the xpub; the private keys exist only where the operator keeps the
key file (docs/KEYS.md). Two derivation schemes, told apart by the xpub itself:

- `bip44` (keys from `settle keys new`): the xpub is the node at m/44'/60'/0'/0 of a
  BIP39 mnemonic, and account index i's deposit address is its child `i`, the same
  address on every chain: m/44'/60'/0'/0/i, what any standard wallet derives from the
  words alone.
- `chain/index` (keys from `settle keys xpub`, the dev key file, deployments before
  core_0010): the xpub is a BIP32 root and the address of index i on chain c is its
  child `c/i`, a different address per chain.

Every step is bip-utils' (CKDpub, then its Ethereum address encoder): on the path that
decides where customers' money lands, nothing is written by hand (docs/DECISIONS.md,
"Deposit addresses"). Non-hardened steps are what make public-only derivation
possible; chain ids and indices are both < 2**31.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path

from bip_utils import Bip32Secp256k1, EthAddrEncoder

#: File (in the data dir) holding the dev key pair; never used in production.
DEV_KEY_FILE = "deposit_xprv.json"

#: First hardened BIP32 index: everything we derive must stay below it.
HARDENED = 2**31

#: The xpub is m/44'/60'/0'/0 of a mnemonic; index i is its child i on every chain.
BIP44 = "bip44"
#: The xpub is a BIP32 root; index i on chain c is its child c/i.
CHAIN_INDEX = "chain/index"
SCHEMES = (BIP44, CHAIN_INDEX)
#: Where a `bip44` key sits under the mnemonic's seed (BIP44: purpose, coin type 60,
#: account 0, external chain).
BIP44_KEY_PATH = "m/44'/60'/0'/0"


def check_index(name: str, value: int) -> None:
    # bool is an int subclass; True as an index is always a bug upstream.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < HARDENED:
        raise ValueError(f"{name} must be in [0, 2**31), got {value}")


def parse_extended_key(key: str) -> Bip32Secp256k1:
    if not isinstance(key, str) or not key:
        raise ValueError("extended key must be a non-empty string")
    try:
        return Bip32Secp256k1.FromExtendedKey(key.strip())
    # bip-utils raises a zoo of types (Base58ChecksumError, Bip32KeyError, TypeError...)
    # for malformed input; callers only need to know the key is unusable.
    except Exception as exc:
        raise ValueError(f"invalid BIP32 extended key: {exc}") from exc


def scheme_of(node: Bip32Secp256k1) -> str:
    """The derivation scheme of an extended key, from its depth.

    A root (depth 0) is `chain/index`, as every key Settle made before `settle keys new`;
    depth 4 at child 0 is `bip44` (an xpub cannot show the hardened steps above it, so
    `settle keys new` and the signer check them against the mnemonic). Anything else is
    refused rather than guessed: a wrong guess would move every future address.
    """
    depth, index = node.Depth().ToInt(), node.Index().ToInt()
    if depth == 0:
        return CHAIN_INDEX
    if depth == 4 and index == 0:
        return BIP44
    raise ValueError(
        f"a deposit key is a BIP32 root (settle keys xpub) or the key at {BIP44_KEY_PATH} "
        f"(settle keys new); this one is at depth {depth}, child {index}"
    )


def relative_path(scheme: str, chain_id: int, index: int) -> str:
    """The path of a deposit address under its key (`c/i` or `i`)."""
    check_index("chain_id", chain_id)
    check_index("index", index)
    if scheme == BIP44:
        return str(index)
    if scheme == CHAIN_INDEX:
        return f"{chain_id}/{index}"
    raise ValueError(f"unknown derivation scheme {scheme!r}")


def full_path(scheme: str, chain_id: int, index: int) -> str:
    """The path from the seed (`bip44`) or the root key (`chain/index`), e.g.
    `m/44'/60'/0'/0/7` or `m/137/7`: what a person types into a wallet or a script."""
    top = BIP44_KEY_PATH if scheme == BIP44 else "m"
    return f"{top}/{relative_path(scheme, chain_id, index)}"


def address_of(node: Bip32Secp256k1) -> str:
    """The EIP-55 address of a BIP32 node's public key (bip-utils' encoder)."""
    address: str = EthAddrEncoder.EncodeKey(node.PublicKey().KeyObject())
    return address


class AddressDeriver:
    """Derives EIP-55 deposit addresses from an xpub, by the xpub's scheme.

    Derived nodes above the last step are kept (one per chain for `chain/index`), so an
    address costs bip-utils' one CKDpub and its address encoding.
    """

    def __init__(self, xpub: str) -> None:
        node = parse_extended_key(xpub)
        if not node.IsPublicOnly():
            # Accepting an xprv here would quietly put a deposit private key in Settle.
            raise ValueError("expected an extended public key (xpub), got a private key")
        self.scheme = scheme_of(node)
        #: The xpub as bip-utils serializes it (how the key is recorded).
        self.xpub: str = node.PublicKey().ToExtended()
        self._root = node
        self._chain_nodes: dict[int, Bip32Secp256k1] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AddressDeriver({self.scheme}, {self.xpub[:16]}...)"

    def _parent(self, chain_id: int) -> Bip32Secp256k1:
        """The node whose child `index` is the address on `chain_id`."""
        if self.scheme == BIP44:
            return self._root
        node = self._chain_nodes.get(chain_id)
        if node is None:
            with self._lock:
                node = self._chain_nodes.get(chain_id)
                if node is None:
                    node = self._root.ChildKey(chain_id)
                    self._chain_nodes[chain_id] = node
        return node

    def derive(self, chain_id: int, index: int) -> str:
        """The checksummed deposit address of `index` on `chain_id`."""
        check_index("chain_id", chain_id)
        check_index("index", index)
        return address_of(self._parent(chain_id).ChildKey(index))

    def addresses(self, index: int, chain_ids: Iterable[int]) -> list[tuple[int, str]]:
        """(chain id, address) of `index` on each chain; a `bip44` key derives once, its
        one address serving every chain."""
        chain_ids = list(chain_ids)
        if self.scheme == BIP44 and chain_ids:
            address = self.derive(chain_ids[0], index)
            for chain_id in chain_ids[1:]:
                check_index("chain_id", chain_id)
            return [(chain_id, address) for chain_id in chain_ids]
        return [(chain_id, self.derive(chain_id, index)) for chain_id in chain_ids]

    def path(self, chain_id: int, index: int) -> str:
        """The deposit address's full path (`full_path`) under this key's scheme."""
        return full_path(self.scheme, chain_id, index)


def generate_dev_xprv() -> tuple[str, str]:
    """A fresh random (xprv, xpub) root pair (`chain/index`) for dev use."""
    node = Bip32Secp256k1.FromSeed(secrets.token_bytes(32))
    return node.PrivateKey().ToExtended(), node.PublicKey().ToExtended()


def _read_dev_key_file(path: Path) -> str:
    data = json.loads(path.read_text(encoding="utf-8"))
    xprv, xpub = data["xprv"], data["xpub"]
    # A hand-edited file whose halves disagree would hand out addresses nobody can sweep.
    if parse_extended_key(xprv).PublicKey().ToExtended() != xpub:
        raise ValueError(f"{path}: xpub does not match xprv")
    return str(xpub)


def load_or_create_dev_xpub(data_dir: Path) -> str:
    """The dev deposit xpub from `data_dir/deposit_xprv.json`, created (0600) on first run."""
    path = Path(data_dir) / DEV_KEY_FILE
    if path.exists():
        return _read_dev_key_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    xprv, xpub = generate_dev_xprv()
    body = json.dumps(
        {
            "xprv": xprv,
            "xpub": xpub,
            "scheme": CHAIN_INDEX,
            "note": "dev only: deposit key pair, never for production",
        },
        indent=2,
    )
    tmp = path.with_name(f".{DEV_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    # Written in full under a private name, then hard-linked into place: link() fails if
    # the file exists, so when the API and the worker start together exactly one key pair
    # wins and neither process ever reads a half-written file.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return _read_dev_key_file(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return xpub


def private_key_for(xprv: str, chain_id: int, index: int) -> bytes:
    """The 32-byte private key of the deposit address at `xprv/<chain_id>/<index>`
    (`chain/index`; key files of either scheme: `services.core.keyfiles`)."""
    check_index("chain_id", chain_id)
    check_index("index", index)
    node = parse_extended_key(xprv)
    if node.IsPublicOnly():
        raise ValueError("expected an extended private key (xprv), got a public key")
    key: bytes = node.ChildKey(chain_id).ChildKey(index).PrivateKey().Raw().ToBytes()
    return key
