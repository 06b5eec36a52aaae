"""Deposit address derivation from the xpub, checked against the private side."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from bip_utils import Bip32Secp256k1
from eth_account import Account
from eth_utils import is_checksum_address
from mnemonic import Mnemonic

from services.core.addresses import (
    BIP44,
    BIP44_KEY_PATH,
    CHAIN_INDEX,
    DEV_KEY_FILE,
    AddressDeriver,
    generate_dev_xprv,
    load_or_create_dev_xpub,
    private_key_for,
)
from tests.support import keys

#: anvil's (and hardhat's) development mnemonic and its first two accounts.
DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEV_ADDRESS_0 = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
DEV_ADDRESS_1 = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"

CHAIN_IDS = (1, 137, 8453, 42161, 2**31 - 1)
INDICES = (0, 1, 2, 1000, 2**31 - 1)


def test_derived_address_matches_private_key() -> None:
    deriver = AddressDeriver(keys.test_xpub())
    for chain_id in CHAIN_IDS:
        for index in INDICES:
            address = deriver.derive(chain_id, index)
            assert is_checksum_address(address)
            key = private_key_for(keys.test_xprv(), chain_id, index)
            assert len(key) == 32
            assert Account.from_key(key).address == address


def test_derivation_is_deterministic_across_instances() -> None:
    first = AddressDeriver(keys.test_xpub())
    second = AddressDeriver(keys.test_xpub())
    got = [first.derive(c, i) for c in CHAIN_IDS for i in INDICES]
    # Second call on a warm cache, and a cold instance, agree.
    assert got == [first.derive(c, i) for c in CHAIN_IDS for i in INDICES]
    assert got == [second.derive(c, i) for c in CHAIN_IDS for i in INDICES]


def test_pinned_vectors() -> None:
    # Pinned so a library upgrade that changed derivation fails loudly instead of
    # silently moving every deposit address.
    deriver = AddressDeriver(keys.test_xpub())
    assert deriver.derive(1, 0) == "0x6BC0C12fc06a06d8d323133770b0342E135aB0b2"
    assert deriver.derive(8453, 42) == "0xFe65488766957B9C8b27112b8A139f0c12F32a7d"


def test_distinct_across_chains_and_indices() -> None:
    deriver = AddressDeriver(keys.test_xpub())
    addresses = {deriver.derive(c, i) for c in CHAIN_IDS for i in range(50)}
    assert len(addresses) == len(CHAIN_IDS) * 50


@pytest.mark.parametrize(
    "bad", ["", "xpub", "not a key", keys.test_xpub()[:-1] + "1", "tpub" + "1" * 107]
)
def test_bad_xpub_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        AddressDeriver(bad)


def test_xprv_is_refused_by_the_deriver() -> None:
    with pytest.raises(ValueError, match="public"):
        AddressDeriver(keys.test_xprv())


def test_private_key_for_refuses_an_xpub() -> None:
    with pytest.raises(ValueError, match="private"):
        private_key_for(keys.test_xpub(), 1, 0)


@pytest.mark.parametrize(
    ("chain_id", "index"), [(1, -1), (1, 2**31), (-1, 0), (2**31, 0), (1, True)]
)
def test_out_of_range_raises_value_error(chain_id: int, index: int) -> None:
    deriver = AddressDeriver(keys.test_xpub())
    with pytest.raises(ValueError):
        deriver.derive(chain_id, index)
    with pytest.raises(ValueError):
        private_key_for(keys.test_xprv(), chain_id, index)


def test_generate_dev_xprv_pairs_match() -> None:
    xprv, xpub = generate_dev_xprv()
    assert xprv.startswith("xprv") and xpub.startswith("xpub")
    assert Account.from_key(private_key_for(xprv, 8453, 7)).address == AddressDeriver(xpub).derive(
        8453, 7
    )
    assert generate_dev_xprv() != (xprv, xpub)


def test_dev_key_file_created_once_with_private_mode(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    xpub = load_or_create_dev_xpub(data_dir)
    path = data_dir / DEV_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert stored["xpub"] == xpub
    assert Account.from_key(private_key_for(stored["xprv"], 1, 3)).address == AddressDeriver(
        xpub
    ).derive(1, 3)
    # Second run reads the same pair back; no stray temp files are left.
    assert load_or_create_dev_xpub(data_dir) == xpub
    assert [p.name for p in data_dir.iterdir()] == [DEV_KEY_FILE]


def test_dev_key_file_with_mismatched_halves_is_rejected(tmp_path: Path) -> None:
    xprv, _ = generate_dev_xprv()
    _, other_xpub = generate_dev_xprv()
    (tmp_path / DEV_KEY_FILE).write_text(json.dumps({"xprv": xprv, "xpub": other_xpub}))
    with pytest.raises(ValueError, match="does not match"):
        load_or_create_dev_xpub(tmp_path)


def test_a_bip44_key_gives_index_i_the_standard_wallet_address_on_every_chain() -> None:
    """An xpub at m/44'/60'/0'/0 derives account index i at m/44'/60'/0'/0/i, on every
    chain: the addresses anvil's well-known development mnemonic opens with."""
    node = Bip32Secp256k1.FromSeed(Mnemonic.to_seed(DEV_MNEMONIC)).DerivePath(BIP44_KEY_PATH)
    deriver = AddressDeriver(node.PublicKey().ToExtended())
    assert deriver.scheme == BIP44
    assert {deriver.derive(c, 0) for c in CHAIN_IDS} == {DEV_ADDRESS_0}
    assert deriver.derive(1, 1) == DEV_ADDRESS_1
    assert deriver.addresses(1, [1, 137, 8453]) == [(c, DEV_ADDRESS_1) for c in (1, 137, 8453)]
    assert deriver.path(137, 1) == "m/44'/60'/0'/0/1"


def test_a_root_key_keeps_its_chain_index_addresses() -> None:
    deriver = AddressDeriver(keys.test_xpub())
    assert deriver.scheme == CHAIN_INDEX
    assert deriver.addresses(42, [1, 8453]) == [
        (1, deriver.derive(1, 42)),
        (8453, "0xFe65488766957B9C8b27112b8A139f0c12F32a7d"),
    ]
    assert deriver.path(8453, 42) == "m/8453/42"


@pytest.mark.parametrize("path", ["m/44'/60'/0'", "m/0", "m/44'/60'/0'/1"])
def test_a_key_of_no_known_scheme_is_refused(path: str) -> None:
    """Guessing a scheme would move every future address: an xpub that is neither a
    root nor the key at m/44'/60'/0'/0 is refused."""
    node = Bip32Secp256k1.FromSeed(bytes(32)).DerivePath(path)
    with pytest.raises(ValueError, match="depth"):
        AddressDeriver(node.PublicKey().ToExtended())
