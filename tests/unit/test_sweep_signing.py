"""`settle sweep sign`, offline: the right key signs exactly the plan; a wrong key, an
edited plan or a missing key signs nothing; no database, no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from services.core.addresses import full_path, generate_dev_xprv
from services.core.keyfiles import SigningKey, mnemonic_document, new_mnemonic, write_new
from services.core.sweeps.documents import PLAN_KIND, VERSION, decode, digest, transfer_tx
from services.core.sweeps.signer import SigningRefused, sign_plan
from tests.support import keys

ROOT = Path(__file__).resolve().parents[2]
CHAIN = 137
TOKEN = "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359"
TREASURY = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
FEES = {"maxFeePerGas": 60 * 10**9, "maxPriorityFeePerGas": 30 * 10**9}


def _entry(key: SigningKey, index: int, amount: int, *, named: bool = True) -> dict[str, Any]:
    tx = transfer_tx(
        chain_id=CHAIN, token=TOKEN, to=TREASURY, amount_raw=amount, nonce=0, gas=60_000, fees=FEES
    )
    return {
        "address": key.address(CHAIN, index),
        "key": {
            "xpub": key.xpub if named else None,
            "scheme": key.scheme,
            "index": index,
            "path": full_path(key.scheme, CHAIN, index),
        },
        "nonce": 0,
        "transfers": [
            {
                "token": TOKEN,
                "asset": "USDC",
                "decimals": 6,
                "amountRaw": str(amount),
                "tx": tx,
            }
        ],
    }


def _plan(entries: list[dict[str, Any]]) -> dict[str, Any]:
    plan = {
        "kind": PLAN_KIND,
        "version": VERSION,
        "planId": "swp_test",
        "chainId": CHAIN,
        "destination": TREASURY,
        "fees": FEES,
        "addresses": entries,
    }
    return {"digest": digest(plan), "plan": plan}


@pytest.fixture
def new_key() -> SigningKey:
    return SigningKey.from_mnemonic(new_mnemonic())


@pytest.fixture
def old_key() -> SigningKey:
    return SigningKey.from_xprv(keys.test_xprv())


def test_each_address_is_signed_by_its_own_key_exactly_as_planned(
    new_key: SigningKey, old_key: SigningKey
) -> None:
    # Given a plan spanning a rotation: an old root key's address (recorded before keys
    # were, so unnamed) and two of a mnemonic's
    plan = _plan(
        [
            _entry(new_key, 3, 10**6),
            _entry(old_key, 9, 5 * 10**6, named=False),
            _entry(new_key, 4, 7),
        ]
    )
    # When it is signed with both key files
    signed, summary = sign_plan(plan, [old_key, new_key], expect_destination=TREASURY.lower())
    # Then each transaction is signed by its deposit address and is the planned one
    for entry, item in zip(plan["plan"]["addresses"], signed["transactions"], strict=True):
        decoded = decode(item["raw"])
        assert decoded.sender == entry["address"] == item["address"]
        assert decoded.fields == entry["transfers"][0]["tx"]
        assert decoded.hash == item["hash"]
    assert (signed["planId"], signed["planDigest"], signed["chainId"]) == (
        "swp_test",
        plan["digest"],
        CHAIN,
    )
    assert (summary.transactions, summary.assets, summary.destination) == (
        3,
        {"USDC": "6.000007"},
        TREASURY,
    )


def test_the_wrong_key_file_signs_nothing(new_key: SigningKey, old_key: SigningKey) -> None:
    plan = _plan([_entry(new_key, 3, 10**6)])
    other = SigningKey.from_mnemonic(new_mnemonic())
    # A key the plan does not name
    with pytest.raises(SigningRefused, match="no key file given"):
        sign_plan(plan, [other])
    # A file claiming the plan's xpub but holding another key cannot exist (its halves
    # are checked on load); an unnamed (older) address needs a key that derives it
    unnamed = _plan([_entry(old_key, 9, 10**6, named=False)])
    with pytest.raises(SigningRefused, match="does not derive"):
        sign_plan(unnamed, [SigningKey.from_xprv(generate_dev_xprv()[0])])


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda p: p["addresses"][0].update(address=Account.create().address), "does not derive"),
        (lambda p: p["addresses"][0]["key"].update(index=4), "path"),
        (lambda p: p["addresses"][0]["transfers"][0]["tx"].update(nonce=5), "fields describe"),
        (lambda p: p.update(destination=Account.create().address), "fields describe"),
    ],
)
def test_an_edited_plan_signs_nothing(new_key: SigningKey, edit: Any, problem: str) -> None:
    plan = _plan([_entry(new_key, 3, 10**6)])
    edit(plan["plan"])
    # Caught by the digest first; an editor who recomputes it is caught by the checks
    with pytest.raises(ValueError, match="digest"):
        sign_plan(plan, [new_key])
    plan["digest"] = digest(plan["plan"])
    with pytest.raises(SigningRefused, match=problem):
        sign_plan(plan, [new_key])


def test_a_plan_paying_elsewhere_than_expected_signs_nothing(new_key: SigningKey) -> None:
    plan = _plan([_entry(new_key, 3, 10**6)])
    with pytest.raises(SigningRefused, match="pays"):
        sign_plan(plan, [new_key], expect_destination=Account.create().address)


def test_sign_runs_with_no_database_and_no_network(tmp_path: Path) -> None:
    # Given a key file and a plan file, and a process where opening any socket fails and
    # no database or data dir is configured
    key_file = tmp_path / "key.json"
    write_new(key_file, mnemonic_document(new_mnemonic()))
    key = SigningKey.from_mnemonic(json.loads(key_file.read_text())["mnemonic"])
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(_plan([_entry(key, 1, 10**6), _entry(key, 2, 2)])))
    out = tmp_path / "signed.json"
    script = (
        "import socket, sys\n"
        "def refuse(*a, **k):\n"
        "    raise OSError('no network on the signing machine')\n"
        "socket.socket.connect = refuse\n"
        "socket.socket.connect_ex = refuse\n"
        "socket.getaddrinfo = refuse\n"
        "from services.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLE_")}
    env.update(SETTLE_DATA_DIR=str(tmp_path / "no-such-data-dir"), SETTLE_DEBUG="1")
    argv = [
        "sweep",
        "sign",
        "--plan",
        str(plan_file),
        "--key-file",
        str(key_file),
        "--out",
        str(out),
    ]
    # When `settle sweep sign` runs there
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Then it signs both transfers
    assert done.returncode == 0, done.stderr
    signed = json.loads(out.read_text())
    assert [decode(t["raw"]).sender for t in signed["transactions"]] == [
        key.address(CHAIN, 1),
        key.address(CHAIN, 2),
    ]
    assert f"every transfer pays {TREASURY}" in done.stderr
    # And a second run never overwrites the signed file
    again = subprocess.run(
        [sys.executable, "-c", script, *argv],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "never overwritten" in again.stderr
