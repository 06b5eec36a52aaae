"""The command line for people: fast help, a data dir found from anywhere, clear errors, output."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import sqlalchemy.exc

from services import cli, output
from shared.settings import SettingsError, data_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_table_names_what_each_module_registers() -> None:
    # Given the parser with every module's commands
    parser = cli.build_parser("all")
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    registered = {action.dest: action.help for action in sub._choices_actions}
    # Then the table (what `settle --help` shows without importing them) is exact
    assert registered == {name: help_text for name, (_, help_text) in cli.COMMANDS.items()}
    for name in cli.COMMANDS:
        assert sub.choices[name].add_help, f"{name} is still a placeholder"


def test_help_imports_none_of_the_services() -> None:
    # `settle --help` and `settle listen --help` stay fast: no SQLAlchemy, Flask, web3, Alembic
    code = (
        "import sys\n"
        "from services import cli\n"
        "for argv in (['--help'], ['listen', '--help']):\n"
        "    try:\n"
        "        cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('sqlalchemy', 'flask', 'web3', 'alembic', 'marshmallow') "
        "if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert "HEAVY []" in ran.stdout, ran.stdout + ran.stderr


@pytest.mark.parametrize(
    "argv",
    [["tenants", "create", "--name", "x"], ["--json", "api-keys", "revoke", "key_1"]],
)
def test_outside_any_project_a_command_says_what_is_missing_without_a_trace(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a directory with no .settle in it or above, and no database named
    monkeypatch.chdir(tmp_path)
    for name in ("SETTLE_DATABASE_URL", "SETTLE_DATA_DIR", "SETTLE_ENV"):
        monkeypatch.delenv(name, raising=False)
    # When a command that needs the database runs
    code = cli.main(argv)
    # Then it stops at once with one clear paragraph and makes nothing here
    err = capsys.readouterr().err
    assert code == 2
    assert "no Settle data here" in err and "SETTLE_DATA_DIR" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_data_dir_is_found_from_any_directory_inside_the_project(tmp_path: Path) -> None:
    (tmp_path / "project" / ".settle").mkdir(parents=True)
    deep = tmp_path / "project" / "services" / "core"
    deep.mkdir(parents=True)
    assert data_dir({}, cwd=deep) == tmp_path / "project" / ".settle"
    # An explicit SETTLE_DATA_DIR wins; with none found, ./.settle (settle dev makes it)
    assert data_dir({"SETTLE_DATA_DIR": "/srv/settle"}, cwd=deep) == Path("/srv/settle")
    assert data_dir({}, cwd=tmp_path) == tmp_path / ".settle"


def test_failures_a_person_can_fix_are_one_line() -> None:
    refused = sqlalchemy.exc.OperationalError(
        "SELECT 1", {}, Exception('connection to server at "127.0.0.1", port 5432 failed\nmore')
    )
    assert cli.explain(refused) == (
        'cannot reach the database: connection to server at "127.0.0.1", port 5432 failed. '
        "Is PostgreSQL running, and is SETTLE_DATABASE_URL right?"
    )
    # psycopg's own error too: the fast executor connects through psycopg directly
    assert cli.explain(
        psycopg.OperationalError('connection to server at "127.0.0.1", port 5432 failed\nmore')
    ) == (
        'cannot reach the database: connection to server at "127.0.0.1", port 5432 failed. '
        "Is PostgreSQL running, and is SETTLE_DATABASE_URL right?"
    )
    assert cli.explain(SettingsError("SETTLE_ENV must be dev or production")) == (
        "setting: SETTLE_ENV must be dev or production"
    )
    assert cli.explain(ValueError("a bug")) is None  # bugs keep their traceback


def test_a_bug_still_shows_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise ZeroDivisionError

    parser = argparse.ArgumentParser()
    parser.add_argument("--log-level", default="INFO")
    parser.add_subparsers(dest="command").add_parser("db").set_defaults(func=broken)
    monkeypatch.setattr(cli, "build_parser", lambda command=None: parser)
    monkeypatch.setenv("SETTLE_DATABASE_URL", "postgresql://nowhere/none")
    with pytest.raises(ZeroDivisionError):
        cli.main(["db"])


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_for_scripts_and_a_listing_on_a_terminal() -> None:
    payload = {"tenantId": "6f1c", "apiKey": "sk_x", "scopes": ["a", "b"], "note": None}
    try:
        # A pipe (a script capturing stdout) gets the JSON contract
        pipe = io.StringIO()
        output.set_json(None)
        output.emit(payload, pipe)
        assert json.loads(pipe.getvalue()) == payload
        # A terminal gets aligned lines
        tty = Tty()
        output.emit(payload, tty)
        assert tty.getvalue().splitlines() == [
            "tenantId  6f1c",
            "apiKey    sk_x",
            'scopes    ["a","b"]',
            "note      -",
        ]
        # --json wins on a terminal too
        output.set_json(True)
        forced = Tty()
        output.emit(payload, forced)
        assert json.loads(forced.getvalue()) == payload
    finally:
        output.set_json(None)


def test_a_list_of_objects_is_a_table() -> None:
    text = output.render(
        {"webhookEndpoints": [{"id": "we_1", "status": "enabled"}, {"id": "we_22", "status": "x"}]}
    )
    assert text.splitlines() == [
        "webhookEndpoints:",
        "  id     status",
        "  we_1   enabled",
        "  we_22  x",
    ]
