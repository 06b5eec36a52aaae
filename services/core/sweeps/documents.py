"""The sweep files and the transactions in them (pure: no database, no network).

Three commands hand two files along (docs/KEYS.md, "Sweeping"):

- `settle sweep plan` writes PLAN.json: `{"digest": sha256 of the plan's canonical JSON,
  "plan": {...}}`. Each transfer names its token, amount, nonce, gas and fees; the
  destination is the plan's, one for all.
- `settle sweep sign` (offline) reads it, builds each transaction itself from those
  fields (the calldata is always `transfer(plan destination, amount)`), signs, and writes
  SIGNED.json: the plan's id and digest and the signed bytes.
- `settle sweep send` checks every signed transaction against the plan *as stored in
  the database* (`matches`): a file edited anywhere on its way is refused whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eth_account import Account
from eth_account.typed_transactions import TypedTransaction
from eth_utils import keccak, to_checksum_address
from hexbytes import HexBytes

from services.core.erc20 import transfer_calldata

#: `kind` of each file, and the version of their layout.
PLAN_KIND = "settle.sweep.plan"
SIGNED_KIND = "settle.sweep.signed"
VERSION = 1
#: Gas of a plain native transfer to an account without code (the gas top-up).
NATIVE_TRANSFER_GAS = 21_000


class SweepFileError(ValueError):
    """A plan or signed file that is malformed, or does not match what it claims."""


def canonical(document: Any) -> bytes:
    """The bytes a digest is taken over: sorted keys, no spaces, UTF-8."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def digest(document: Any) -> str:
    return hashlib.sha256(canonical(document)).hexdigest()


def transfer_data(to: str, amount_raw: int) -> str:
    """Calldata of ERC-20 `transfer(to, amount)`."""
    return "0x" + transfer_calldata(to_checksum_address(to), amount_raw).hex()


def transfer_tx(
    *,
    chain_id: int,
    token: str,
    to: str,
    amount_raw: int,
    nonce: int,
    gas: int,
    fees: Mapping[str, int],
) -> dict[str, Any]:
    """The unsigned EIP-1559 transfer a plan asks for (the signer's input, the sender's
    reference)."""
    return {
        "type": 2,
        "chainId": chain_id,
        "nonce": nonce,
        "to": to_checksum_address(token),
        "value": 0,
        "data": transfer_data(to, amount_raw),
        "gas": gas,
        "maxFeePerGas": int(fees["maxFeePerGas"]),
        "maxPriorityFeePerGas": int(fees["maxPriorityFeePerGas"]),
    }


def max_gas_cost(tx: Mapping[str, Any]) -> int:
    """The most the transaction can spend on gas, in wei (what its sender must hold)."""
    return int(tx["gas"]) * int(tx["maxFeePerGas"])


@dataclass(frozen=True)
class SignedTx:
    """A signed transaction, decoded: who signed it and what it does."""

    sender: str
    hash: str
    fields: dict[str, Any]


def decode(raw: str) -> SignedTx:
    """The signer, hash and fields of signed bytes (0x-hex); SweepFileError if they are not
    a well-formed signed transaction of the kind a plan makes (EIP-1559)."""
    try:
        data = bytes(HexBytes(raw))
        if data[:1] != b"\x02":
            raise SweepFileError(
                f"a plan's transactions are EIP-1559 (type 2), not 0x{data[:1].hex()}"
            )
        sender = Account.recover_transaction(data)
        found = dict(TypedTransaction.from_bytes(HexBytes(data)).as_dict())
    except SweepFileError:
        raise
    except Exception as exc:  # eth-account raises many types for bad bytes
        raise SweepFileError(f"not a signed transaction: {exc.__class__.__name__}: {exc}") from None
    if found.get("accessList"):
        raise SweepFileError("a plan's transactions carry no access list")
    fields = {
        "type": 2,
        "chainId": int(found["chainId"]),
        "nonce": int(found["nonce"]),
        "to": to_checksum_address(found["to"]),
        "value": int(found["value"]),
        "data": "0x" + bytes(found["data"]).hex(),
        "gas": int(found["gas"]),
        "maxFeePerGas": int(found["maxFeePerGas"]),
        "maxPriorityFeePerGas": int(found["maxPriorityFeePerGas"]),
    }
    return SignedTx(to_checksum_address(sender), "0x" + keccak(data).hex(), fields)


def normalized(tx: Mapping[str, Any]) -> dict[str, Any]:
    """A stored or built transaction in `decode`'s form, for an exact comparison."""
    out = dict(tx)
    out["to"] = to_checksum_address(out["to"])
    out["data"] = str(out["data"]).lower()
    return out


def mismatch(signed: SignedTx, sender: str, expected: Mapping[str, Any]) -> str | None:
    """Why `signed` is not the transaction the plan asked `sender` to sign (None: it is)."""
    if signed.sender != to_checksum_address(sender):
        return f"signed by {signed.sender}, not by the deposit address {sender}"
    want = normalized(expected)
    got = normalized(signed.fields)
    for field in sorted(set(want) | set(got)):
        if want.get(field) != got.get(field):
            return f"{field} is {got.get(field)!r}, the plan says {want.get(field)!r}"
    return None


def load(text: str, kind: str) -> dict[str, Any]:
    """A sweep file's document, checked to be of `kind` and this version."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise SweepFileError(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise SweepFileError("not a JSON object")
    body = document.get("plan") if kind == PLAN_KIND else document
    if not isinstance(body, dict) or body.get("kind") != kind:
        raise SweepFileError(f"not a {kind} file")
    if body.get("version") != VERSION:
        raise SweepFileError(f"version {body.get('version')!r}; this Settle reads {VERSION}")
    return document


def checked_plan(document: Mapping[str, Any]) -> dict[str, Any]:
    """The plan of a PLAN.json document, its digest checked (an edit shows here, and the
    database's copy decides at send)."""
    plan = document["plan"]
    if digest(plan) != document.get("digest"):
        raise SweepFileError("the plan's digest does not match its content: it was edited")
    return dict(plan)
