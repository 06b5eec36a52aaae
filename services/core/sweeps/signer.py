"""`settle sweep sign`: sign a plan's transfers with the deposit key, offline.

Needs no database and no network: the plan file and the key file(s) are all it reads.
For every address it derives the key at the path the plan names, checks that the key
derives exactly the plan's address (a wrong key file, or a plan whose addresses were
edited, signs nothing), and builds each transaction itself from the plan's fields: the
calldata is always `transfer(<the plan's destination>, amount)`, so the destination
printed for the person signing is the only one any transaction pays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_account import Account
from eth_utils import to_checksum_address

from services.core.addresses import full_path
from services.core.amounts import format_amount, token_units
from services.core.keyfiles import SigningKey
from services.core.sweeps.documents import (
    SIGNED_KIND,
    VERSION,
    SweepFileError,
    checked_plan,
    normalized,
    transfer_tx,
)
from shared.timefmt import iso_ms, utcnow


class SigningRefused(SweepFileError):
    """Nothing was signed: the message names the address and why."""


@dataclass(frozen=True)
class Summary:
    """What a person checks before taking SIGNED.json online."""

    plan_id: str
    chain_id: int
    destination: str
    digest: str
    transactions: int
    assets: dict[str, str]

    def lines(self) -> list[str]:
        amounts = ", ".join(f"{amount} {asset}" for asset, amount in sorted(self.assets.items()))
        return [
            f"plan {self.plan_id} (digest {self.digest})",
            f"chain {self.chain_id}: {self.transactions} transfers, {amounts or 'nothing'}",
            f"every transfer pays {self.destination}",
        ]


def _key_for(entry: Mapping[str, Any], keys: Sequence[SigningKey], chain_id: int) -> SigningKey:
    """The key that derives this entry's address at its path (SigningRefused if none)."""
    address = to_checksum_address(entry["address"])
    named = entry["key"]
    index, scheme = int(named["index"]), str(named["scheme"])
    if named.get("path") != full_path(scheme, chain_id, index):
        raise SigningRefused(
            f"{address}: its path {named.get('path')!r} is not {scheme} index {index}"
        )
    if named.get("xpub") is not None:
        chosen = [k for k in keys if k.xpub == named["xpub"]]
        if not chosen:
            raise SigningRefused(
                f"{address}: no key file given for its key {str(named['xpub'])[:20]}... "
                "(give every key the plan names: --key-file, repeated)"
            )
    else:  # recorded before keys were: any chain/index key that derives it
        chosen = [k for k in keys if k.scheme == scheme]
    for key in chosen:
        if key.scheme == scheme and key.address(chain_id, index) == address:
            return key
    raise SigningRefused(
        f"{address}: the key file does not derive this address at {named.get('path')}: "
        "the wrong key file, or a plan whose addresses were changed"
    )


def sign_plan(
    document: Mapping[str, Any],
    keys: Sequence[SigningKey],
    *,
    expect_destination: str | None = None,
) -> tuple[dict[str, Any], Summary]:
    """SIGNED.json's document for a PLAN.json document, and what to show the signer.

    All or nothing: any address that cannot be signed exactly as planned refuses the
    whole plan (SigningRefused), so no partial file ever leaves the signing machine.
    """
    plan = checked_plan(document)
    chain_id = int(plan["chainId"])
    destination = to_checksum_address(plan["destination"])
    if expect_destination is not None and to_checksum_address(expect_destination) != destination:
        raise SigningRefused(
            f"the plan pays {destination}, not {to_checksum_address(expect_destination)}"
        )
    fees = plan["fees"]
    signed: list[dict[str, Any]] = []
    assets: dict[str, int] = {}
    decimals: dict[str, int] = {}
    for entry in plan["addresses"]:
        address = to_checksum_address(entry["address"])
        key = _key_for(entry, keys, chain_id)
        private = key.private_key(chain_id, int(entry["key"]["index"]))
        for n, transfer in enumerate(entry["transfers"]):
            tx = transfer_tx(
                chain_id=chain_id,
                token=transfer["token"],
                to=destination,
                amount_raw=int(transfer["amountRaw"]),
                nonce=int(entry["nonce"]) + n,
                gas=int(transfer["tx"]["gas"]),
                fees=fees,
            )
            if normalized(tx) != normalized(transfer["tx"]):
                raise SigningRefused(
                    f"{address}: its transaction is not the one its fields describe"
                )
            done = Account.sign_transaction(tx, private)
            signed.append(
                {
                    "address": address,
                    "token": to_checksum_address(transfer["token"]),
                    "nonce": tx["nonce"],
                    "amountRaw": str(transfer["amountRaw"]),
                    "hash": "0x" + bytes(done.hash).hex(),
                    "raw": "0x" + bytes(done.raw_transaction).hex(),
                }
            )
            asset = str(transfer["asset"])
            assets[asset] = assets.get(asset, 0) + int(transfer["amountRaw"])
            decimals[asset] = int(transfer["decimals"])
    summary = Summary(
        plan_id=str(plan["planId"]),
        chain_id=chain_id,
        destination=destination,
        digest=str(document["digest"]),
        transactions=len(signed),
        assets={a: format_amount(token_units(raw, decimals[a])) for a, raw in assets.items()},
    )
    return (
        {
            "kind": SIGNED_KIND,
            "version": VERSION,
            "planId": plan["planId"],
            "planDigest": document["digest"],
            "chainId": chain_id,
            "destination": destination,
            "signedAt": iso_ms(utcnow()),
            "transactions": signed,
        },
        summary,
    )
