"""`settle keys xpub`: a deposit key pair for a deployment (compose, production).

Settle holds only the extended public key (SETTLE_DEPOSIT_XPUB) and derives every
deposit address from it; the private key is written to a file the operator keeps
offline, because it is what moves the deposited funds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from services import output


def xpub(args: argparse.Namespace) -> int:
    from services.core.addresses import AddressDeriver, generate_dev_xprv

    path = Path(args.xprv_out)
    xprv, public = generate_dev_xprv()
    # Checked before anything is written: Settle will accept this xpub.
    AddressDeriver(public).derive(1, 0)
    body = json.dumps({"xprv": xprv, "xpub": public}, indent=2) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        sys.stderr.write(f"settle keys xpub: {path} exists; never overwritten (it holds a key)\n")
        return 2
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(body)
    output.emit({"xpub": public, "xprvFile": str(path.absolute())})
    if not output.wants_json():
        sys.stderr.write(
            f"\nPut this line in .env (compose) or the environment (production):\n"
            f"  SETTLE_DEPOSIT_XPUB={public}\n"
            f"Keep {path} offline and backed up: it holds the private key of every deposit "
            "address, and Settle never needs it.\n"
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="deposit keys for a deployment").add_subparsers(
        dest="action", required=True
    )
    p = keys.add_parser("xpub", help="make a deposit key pair: prints the xpub, writes the xprv")
    p.add_argument(
        "--xprv-out",
        required=True,
        metavar="FILE",
        help="where to write the private half (created 0600; never overwritten)",
    )
    p.set_defaults(func=xpub)
