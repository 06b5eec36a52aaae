"""Deposit addresses derived from a BIP32 extended public key (secp256k1).

Settle holds only the xpub: every deposit address is the non-hardened child
`xpub/<chain_id>/<index>`, so the matching private keys exist only where the xprv is
kept (the sweeper's signer, or `deposit_xprv.json` in dev). Non-hardened steps are
what make public-only derivation possible; chain ids and indices are both < 2**31.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

import coincurve
from bip_utils import Bip32Secp256k1, EthAddrEncoder

from services.core.checksums import eip55, keccak

#: File (in the data dir) holding the dev key pair; never used in production.
DEV_KEY_FILE = "deposit_xprv.json"

#: First hardened BIP32 index: everything we derive must stay below it.
HARDENED = 2**31
#: secp256k1's group order: a BIP32 tweak at or above it makes an invalid child.
_CURVE_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def _check_index(name: str, value: int) -> None:
    # bool is an int subclass; True as an index is always a bug upstream.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < HARDENED:
        raise ValueError(f"{name} must be in [0, 2**31), got {value}")


def _parse_extended_key(key: str) -> Bip32Secp256k1:
    if not isinstance(key, str) or not key:
        raise ValueError("extended key must be a non-empty string")
    try:
        return Bip32Secp256k1.FromExtendedKey(key.strip())
    # bip-utils raises a zoo of types (Base58ChecksumError, Bip32KeyError, TypeError...)
    # for malformed input; callers only need to know the key is unusable.
    except Exception as exc:
        raise ValueError(f"invalid BIP32 extended key: {exc}") from exc


@dataclass(frozen=True)
class _ChainNode:
    """`xpub/<chain_id>`: the parent of that chain's deposit addresses."""

    node: Bip32Secp256k1
    public_key: coincurve.PublicKey
    #: ser_P(K): the compressed public key, as BIP32 hashes it.
    compressed: bytes
    chain_code: bytes

    @classmethod
    def of(cls, node: Bip32Secp256k1) -> _ChainNode:
        compressed = bytes(node.PublicKey().RawCompressed().ToBytes())
        return cls(
            node=node,
            public_key=coincurve.PublicKey(compressed),
            compressed=compressed,
            chain_code=bytes(node.ChainCode().ToBytes()),
        )


class AddressDeriver:
    """Derives EIP-55 deposit addresses at `xpub/<chain_id>/<index>`.

    The last step (one per account and chain, on every account creation) is BIP32's
    CKDpub written out on the same primitives bip-utils uses (HMAC-SHA512 and
    libsecp256k1 through coincurve): a third of bip-utils' cost, which wraps each
    intermediate in objects and checksums through Python per character. The rare
    invalid child (probability below 2**-127) goes to bip-utils, which decides it
    as before; tests hold the two paths to the same addresses.
    """

    def __init__(self, xpub: str) -> None:
        node = _parse_extended_key(xpub)
        if not node.IsPublicOnly():
            # Accepting an xprv here would quietly put a deposit private key in Settle.
            raise ValueError("expected an extended public key (xpub), got a private key")
        self._root = node
        self._chain_nodes: dict[int, _ChainNode] = {}
        self._lock = threading.Lock()

    def _chain_node(self, chain_id: int) -> _ChainNode:
        node = self._chain_nodes.get(chain_id)
        if node is None:
            with self._lock:
                node = self._chain_nodes.get(chain_id)
                if node is None:
                    node = _ChainNode.of(self._root.ChildKey(chain_id))
                    self._chain_nodes[chain_id] = node
        return node

    def derive(self, chain_id: int, index: int) -> str:
        """The checksummed deposit address of `index` on `chain_id`."""
        _check_index("chain_id", chain_id)
        _check_index("index", index)
        parent = self._chain_node(chain_id)
        # CKDpub: I = HMAC-SHA512(c_par, ser_P(K_par) || ser_32(i)); K_i = I_L*G + K_par.
        tweak = hmac.digest(
            parent.chain_code, parent.compressed + index.to_bytes(4, "big"), "sha512"
        )[:32]
        if int.from_bytes(tweak, "big") >= _CURVE_ORDER:
            return _derive_with_bip_utils(parent.node, index)
        try:
            child = parent.public_key.add(tweak)
        except ValueError:  # the point at infinity
            return _derive_with_bip_utils(parent.node, index)
        # The address: the last 20 bytes of keccak256 of the uncompressed key's X||Y.
        return eip55("0x" + keccak(child.format(compressed=False)[1:])[-20:].hex())


def _derive_with_bip_utils(parent: Bip32Secp256k1, index: int) -> str:
    """bip-utils' CKDpub and address: it refuses an invalid child as it always has."""
    child = parent.ChildKey(index)
    address: str = EthAddrEncoder.EncodeKey(child.PublicKey().KeyObject())
    return address


def generate_dev_xprv() -> tuple[str, str]:
    """A fresh random (xprv, xpub) pair for dev use."""
    node = Bip32Secp256k1.FromSeed(secrets.token_bytes(32))
    return node.PrivateKey().ToExtended(), node.PublicKey().ToExtended()


def _read_dev_key_file(path: Path) -> str:
    data = json.loads(path.read_text(encoding="utf-8"))
    xprv, xpub = data["xprv"], data["xpub"]
    # A hand-edited file whose halves disagree would hand out addresses nobody can sweep.
    if _parse_extended_key(xprv).PublicKey().ToExtended() != xpub:
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
        {"xprv": xprv, "xpub": xpub, "note": "dev only: deposit key pair, never for production"},
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
    """The 32-byte private key of the deposit address at `xprv/<chain_id>/<index>`."""
    _check_index("chain_id", chain_id)
    _check_index("index", index)
    node = _parse_extended_key(xprv)
    if node.IsPublicOnly():
        raise ValueError("expected an extended private key (xprv), got a public key")
    key: bytes = node.ChildKey(chain_id).ChildKey(index).PrivateKey().Raw().ToBytes()
    return key
