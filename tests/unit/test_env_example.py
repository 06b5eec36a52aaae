""".env.example lists every setting; `settle keys xpub` makes a deposit key pair."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest
from bip_utils import Bip32Secp256k1

from services import cli
from services.core.addresses import AddressDeriver

ROOT = Path(__file__).resolve().parents[2]


def _settings_read_by_the_code() -> set[str]:
    names: set[str] = set()
    for path in [*ROOT.joinpath("services").rglob("*.py"), *ROOT.joinpath("shared").rglob("*.py")]:
        names |= set(re.findall(r"[\"'](SETTLE_[A-Z0-9_]*[A-Z0-9])[\"']", path.read_text()))
    return names


def test_env_example_lists_every_setting_the_code_reads() -> None:
    text = (ROOT / ".env.example").read_text(encoding="utf-8")
    listed = set(re.findall(r"^#? ?(SETTLE_[A-Z0-9_]+)=", text, flags=re.M))
    read = _settings_read_by_the_code()
    assert len(read) > 40  # the scan finds them
    assert read - listed == set(), "add these to .env.example (and the README table)"
    assert "SETTLE_RPC_URL_1" in listed  # the per-chain pattern, by example


def test_readme_compose_commands_are_settle_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Running it with compose", 1)[1].split("\n## ", 1)[0]
    argvs = [line.split("#")[0].split("settle ", 1)[1].split() for line in section.splitlines()
             if re.search(r"(^|/| )settle (keys|tenants) ", line)]  # fmt: skip
    assert len(argvs) == 2
    parser = cli.build_parser("all")
    for argv in argvs:
        argv = [a.strip('"') for a in argv]
        assert callable(parser.parse_args(argv).func), argv


def test_keys_xpub_writes_a_private_xprv_and_prints_an_xpub_settle_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deposit-xprv.json"
    assert cli.main(["keys", "xpub", "--xprv-out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    # The xpub is the public half of the saved xprv, and Settle derives addresses from it
    assert printed == {"xpub": saved["xpub"], "xprvFile": str(out)}
    node = Bip32Secp256k1.FromExtendedKey(saved["xprv"])
    assert node.PublicKey().ToExtended() == printed["xpub"]
    assert AddressDeriver(printed["xpub"]).derive(137, 7).startswith("0x")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    # Never overwritten: a second run keeps the first key and says why
    assert cli.main(["keys", "xpub", "--xprv-out", str(out)]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert json.loads(out.read_text()) == saved
