"""`settle keys new|xpub`: a deposit key for a deployment (compose, production).

Settle holds only the extended public key (SETTLE_DEPOSIT_XPUB) and derives every
deposit address from it; the private half goes to a file the operator keeps offline,
because it is what moves the deposited funds (docs/KEYS.md).

- `keys new`: 24 BIP39 words and the xpub at m/44'/60'/0'/0 (scheme `bip44`): any
  standard wallet recovers deposit address i (m/44'/60'/0'/0/i) from the words alone.
- `keys xpub`: a BIP32 root pair (scheme `chain/index`), as deployments before
  `keys new` were made; kept so their files and scripts go on working.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services import output


def _write(path: Path, document: dict[str, str], command: str) -> bool:
    from services.core.keyfiles import write_new

    try:
        write_new(path, document)
    except FileExistsError:
        sys.stderr.write(
            f"settle keys {command}: {path} exists; never overwritten (it holds a key)\n"
        )
        return False
    return True


def _explain(xpub: str, path: Path, what: str) -> None:
    if output.wants_json():
        return
    sys.stderr.write(
        f"\nPut this line in .env (compose) or the environment (production):\n"
        f"  SETTLE_DEPOSIT_XPUB={xpub}\n"
        f"Keep {path} offline and backed up ({what}): it holds the private key of every "
        "deposit address, and Settle never needs it. docs/KEYS.md says how.\n"
    )


def new(args: argparse.Namespace) -> int:
    from services.core.addresses import AddressDeriver
    from services.core.keyfiles import mnemonic_document, new_mnemonic

    path = Path(args.out)
    document = mnemonic_document(new_mnemonic())
    # Checked before anything is written: Settle will accept this xpub, as `bip44`.
    deriver = AddressDeriver(document["xpub"])
    if deriver.scheme != document["scheme"]:
        raise RuntimeError(f"the new key derives as {deriver.scheme}, not {document['scheme']}")
    if not _write(path, document, "new"):
        return 2
    output.emit(
        {
            "xpub": document["xpub"],
            "scheme": document["scheme"],
            "path": document["path"],
            "keyFile": str(path.absolute()),
            "firstAddress": deriver.derive(1, 0),
        }
    )
    _explain(document["xpub"], path, "and the 24 words on paper: they alone recover it")
    return 0


def xpub(args: argparse.Namespace) -> int:
    from services.core.addresses import AddressDeriver
    from services.core.keyfiles import xprv_document

    path = Path(args.xprv_out)
    document = xprv_document()
    AddressDeriver(document["xpub"]).derive(1, 0)  # Settle will accept this xpub
    if not _write(path, document, "xpub"):
        return 2
    output.emit({"xpub": document["xpub"], "xprvFile": str(path.absolute())})
    _explain(document["xpub"], path, "a copy on another offline medium")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="deposit keys for a deployment").add_subparsers(
        dest="action", required=True
    )
    p = keys.add_parser(
        "new",
        help="make a deposit key: 24 BIP39 words and the xpub at m/44'/60'/0'/0",
        description="Writes the words and the xpub to FILE (0600, never overwritten) and "
        "prints the xpub Settle needs (SETTLE_DEPOSIT_XPUB). Deposit address i is "
        "m/44'/60'/0'/0/i on every chain: any standard wallet recovers it from the words.",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the key file to write")
    p.set_defaults(func=new)
    p = keys.add_parser(
        "xpub", help="make a BIP32 root key pair (the older chain/index scheme): prints the xpub"
    )
    p.add_argument(
        "--xprv-out",
        required=True,
        metavar="FILE",
        help="where to write the private half (created 0600; never overwritten)",
    )
    p.set_defaults(func=xpub)
