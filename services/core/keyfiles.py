"""Deposit key files: the private half of a deposit key, which the operator keeps offline.

Settle itself never reads these: only `settle keys new|xpub` (which write them) and
`settle sweep sign` (offline) do. Two kinds, each recording its derivation scheme
(services/core/addresses.py) so that an old file keeps deriving the addresses it
always did:

- `{"mnemonic": "<24 words>", "scheme": "bip44", "path": "m/44'/60'/0'/0", "xpub": ...}`
  from `settle keys new`: BIP39 words (the `mnemonic` package), no passphrase, so any
  standard wallet recovers address i at m/44'/60'/0'/0/i from the words alone. A plain
  text file holding just the words (typed back from paper) is read the same way.
- `{"xprv": ..., "xpub": ...}` from `settle keys xpub` (scheme `chain/index`, also when
  the file predates the field), or a plain text file holding just the xprv.

Key material is held in bip-utils' objects only as long as a signature needs it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bip_utils import Bip32Secp256k1
from mnemonic import Mnemonic

from services.core.addresses import (
    BIP44,
    BIP44_KEY_PATH,
    CHAIN_INDEX,
    address_of,
    check_index,
    generate_dev_xprv,
    parse_extended_key,
    scheme_of,
)

#: BIP39 strength of `settle keys new`: 256 bits, 24 words.
MNEMONIC_BITS = 256
_WORDLIST = "english"


class KeyFileError(ValueError):
    """A key file that cannot be used (unreadable, malformed, or disagreeing with itself)."""


def new_mnemonic() -> str:
    """24 fresh BIP39 words (English wordlist; entropy from the OS)."""
    words: str = Mnemonic(_WORDLIST).generate(strength=MNEMONIC_BITS)
    return words


def bip44_key(words: str) -> Bip32Secp256k1:
    """The private node at m/44'/60'/0'/0 of a BIP39 mnemonic (no passphrase)."""
    words = " ".join(words.split())
    if not Mnemonic(_WORDLIST).check(words):
        raise KeyFileError("not a valid BIP39 mnemonic (a word or the checksum is wrong)")
    seed = Mnemonic.to_seed(words, passphrase="")
    return Bip32Secp256k1.FromSeed(seed).DerivePath(BIP44_KEY_PATH)


@dataclass(frozen=True)
class SigningKey:
    """A deposit key's private node and scheme: derives each deposit address's key."""

    scheme: str
    #: The extended public key Settle was given (what the plan names).
    xpub: str
    _node: Bip32Secp256k1

    def __repr__(self) -> str:
        # Never let key material reach a log line through a repr.
        return f"SigningKey({self.scheme}, {self.xpub[:16]}...)"

    def _child(self, chain_id: int, index: int) -> Bip32Secp256k1:
        check_index("chain_id", chain_id)
        check_index("index", index)
        if self.scheme == BIP44:
            return self._node.ChildKey(index)
        return self._node.ChildKey(chain_id).ChildKey(index)

    def private_key(self, chain_id: int, index: int) -> bytes:
        """The 32-byte private key of deposit address `index` on `chain_id`."""
        key: bytes = self._child(chain_id, index).PrivateKey().Raw().ToBytes()
        return key

    def address(self, chain_id: int, index: int) -> str:
        """The deposit address this key derives there (EIP-55)."""
        return address_of(self._child(chain_id, index))

    @classmethod
    def from_mnemonic(cls, words: str) -> SigningKey:
        node = bip44_key(words)
        return cls(BIP44, node.PublicKey().ToExtended(), node)

    @classmethod
    def from_xprv(cls, xprv: str) -> SigningKey:
        node = parse_extended_key(xprv)
        if node.IsPublicOnly():
            raise KeyFileError("expected an extended private key (xprv), got a public key")
        scheme = scheme_of(node)
        if scheme != CHAIN_INDEX:
            raise KeyFileError("an xprv key file holds a BIP32 root key (settle keys xpub)")
        return cls(scheme, node.PublicKey().ToExtended(), node)


def _plain(text: str) -> SigningKey:
    words = text.split()
    if len(words) in (12, 15, 18, 21, 24):
        return SigningKey.from_mnemonic(text)
    if len(words) == 1 and words[0].startswith(("xprv", "tprv")):
        return SigningKey.from_xprv(words[0])
    raise KeyFileError("neither JSON nor BIP39 words nor an xprv")


def _from_document(data: dict[str, Any]) -> SigningKey:
    if "mnemonic" in data:
        key = SigningKey.from_mnemonic(str(data["mnemonic"]))
        recorded = (data.get("scheme", BIP44), data.get("path", BIP44_KEY_PATH))
        if recorded != (BIP44, BIP44_KEY_PATH):
            raise KeyFileError(f"a mnemonic's key is {BIP44} at {BIP44_KEY_PATH}, not {recorded}")
    elif "xprv" in data:
        key = SigningKey.from_xprv(str(data["xprv"]))
        if data.get("scheme", CHAIN_INDEX) != CHAIN_INDEX:
            raise KeyFileError(f"an xprv file's scheme is {CHAIN_INDEX}, not {data['scheme']}")
    else:
        raise KeyFileError("no 'mnemonic' and no 'xprv' in it")
    xpub = data.get("xpub")
    # A hand-edited file whose halves disagree would sign for addresses Settle never made.
    if xpub is not None and xpub != key.xpub:
        raise KeyFileError("its xpub is not the one its private half derives")
    return key


def load_key_file(path: Path) -> SigningKey:
    """The signing key in `path` (either kind); KeyFileError says what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read it: {exc}") from None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    try:
        if isinstance(data, dict):
            return _from_document(data)
        return _plain(text)
    except KeyFileError as exc:
        raise KeyFileError(f"{path}: {exc}") from None
    except ValueError as exc:  # bip-utils' own, for a malformed xprv
        raise KeyFileError(f"{path}: {exc}") from None


def mnemonic_document(words: str) -> dict[str, str]:
    """What `settle keys new` writes: the words and the xpub Settle is given."""
    key = SigningKey.from_mnemonic(words)
    return {
        "mnemonic": words,
        "scheme": BIP44,
        "path": BIP44_KEY_PATH,
        "xpub": key.xpub,
        "note": "deposit key: whoever holds these words can move every deposit. Keep offline.",
    }


def xprv_document() -> dict[str, str]:
    """What `settle keys xpub` writes: a fresh BIP32 root pair (`chain/index`)."""
    xprv, xpub = generate_dev_xprv()
    return {"xprv": xprv, "xpub": xpub, "scheme": CHAIN_INDEX}


def write_new(path: Path, document: dict[str, str]) -> None:
    """Write a key file 0600; an existing file is never overwritten (FileExistsError)."""
    body = json.dumps(document, indent=2) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
