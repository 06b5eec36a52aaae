"""Deposit key files: `settle keys new` words recover every deposit address in any
standard wallet, and older xprv files keep their addresses."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from eth_account import Account
from mnemonic import Mnemonic

from services import cli
from services.core.addresses import BIP44, CHAIN_INDEX, AddressDeriver, private_key_for
from services.core.keyfiles import KeyFileError, SigningKey, load_key_file
from tests.support import keys

Account.enable_unaudited_hdwallet_features()


def _keys_new(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, dict[str, str]]:
    out = tmp_path / "deposit-key.json"
    assert cli.main(["keys", "new", "--out", str(out), "--json"]) == 0
    return out, json.loads(capsys.readouterr().out)


def test_words_from_keys_new_recover_each_deposit_address_in_a_standard_wallet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a key made by `settle keys new`
    out, printed = _keys_new(tmp_path, capsys)
    saved = json.loads(out.read_text())
    words = saved["mnemonic"]
    assert len(words.split()) == 24 and Mnemonic("english").check(words)
    assert (saved["scheme"], saved["path"], saved["xpub"]) == (
        BIP44,
        "m/44'/60'/0'/0",
        printed["xpub"],
    )
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    # When Settle derives deposit addresses from the xpub it printed
    deriver = AddressDeriver(printed["xpub"])
    for index in (0, 1, 7, 2**31 - 1):
        # Then eth-account's own BIP44 derivation of the words alone gives the same
        # address and its key, on every chain
        wallet = Account.from_mnemonic(words, account_path=f"m/44'/60'/0'/0/{index}")
        for chain_id in (1, 137, 8453):
            assert deriver.derive(chain_id, index) == wallet.address
        assert load_key_file(out).private_key(137, index) == bytes(wallet.key)
    assert printed["firstAddress"] == Account.from_mnemonic(words).address


def test_keys_new_never_overwrites_a_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = _keys_new(tmp_path, capsys)
    before = out.read_bytes()
    assert cli.main(["keys", "new", "--out", str(out)]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert out.read_bytes() == before


def test_an_xprv_file_from_keys_xpub_keeps_its_chain_index_addresses(tmp_path: Path) -> None:
    # Given an xprv file as `settle keys xpub` wrote them before keys recorded a scheme
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"xprv": keys.test_xprv(), "xpub": keys.test_xpub()}))
    key = load_key_file(path)
    # Then it signs for the addresses Settle always derived from its xpub
    assert key.scheme == CHAIN_INDEX
    deriver = AddressDeriver(keys.test_xpub())
    assert (
        key.address(8453, 42)
        == deriver.derive(8453, 42)
        == ("0xFe65488766957B9C8b27112b8A139f0c12F32a7d")
    )
    assert key.private_key(8453, 42) == private_key_for(keys.test_xprv(), 8453, 42)
    # And the bare xprv in a text file is the same key
    bare = tmp_path / "bare.txt"
    bare.write_text(keys.test_xprv() + "\n")
    assert load_key_file(bare).address(1, 3) == deriver.derive(1, 3)


def test_words_typed_back_from_paper_are_a_key_file(tmp_path: Path) -> None:
    words = Mnemonic("english").generate(256)
    path = tmp_path / "words.txt"
    path.write_text("  " + words.replace(" ", "\n", 3) + "\n")
    assert load_key_file(path).address(1, 5) == SigningKey.from_mnemonic(words).address(137, 5)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("abandon " * 23 + "abandon", "checksum"),
        (json.dumps({"xprv": keys.test_xprv(), "xpub": "xpub" + "1" * 107}), "xpub"),
        (json.dumps({"mnemonic": "abandon " * 11 + "about", "scheme": CHAIN_INDEX}), "bip44"),
        (json.dumps({"xprv": keys.test_xpub()}), "public"),
        (json.dumps({"key": "x"}), "no 'mnemonic'"),
        ("hello world", "neither"),
    ],
)
def test_a_key_file_that_is_wrong_is_refused_with_a_reason(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "key.json"
    path.write_text(content)
    with pytest.raises(KeyFileError, match=problem):
        load_key_file(path)


def test_a_key_never_shows_its_material_in_a_repr() -> None:
    key = SigningKey.from_xprv(keys.test_xprv())
    assert "xprv" not in repr(key) and keys.test_xprv()[4:20] not in repr(key)
