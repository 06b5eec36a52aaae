"""`settle`: the command line of DESIGN.md. Each part registers its own commands."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence

#: Commands that need no database of an existing data dir: `dev` makes one, `listen`
#: talks to a running Settle over HTTP, `keys` only makes a key pair.
_NO_DATA_DIR = frozenset({"dev", "listen", "keys", "events"})


#: Every top-level command: the module that registers it, and its one-line help.
#: `settle --help` and a command's parsing import only what they name, and those
#: modules import nothing heavy (handlers are imported when their command runs:
#: services/commands.py), so help answers at once without SQLAlchemy, Flask, web3...
COMMANDS: dict[str, tuple[str, str]] = {
    "dev": ("services.commands", "everything in one process (embedded PostgreSQL and broker)"),
    "listen": (
        "services.listen",
        "receive, verify and print webhooks locally (registers a dev endpoint)",
    ),
    "tenants": ("services.core.commands", "tenants"),
    "api-keys": ("services.core.commands", "API keys"),
    "members": ("services.core.commands", "portal members"),
    "db": ("services.core.commands", "database"),
    "audit": ("services.core.commands", "the audit log"),
    "core": ("services.core.commands", "core processes"),
    "deposits": (
        "services.core.deposits.cli",
        "deposits: list and show over the API; credit, fail, retry (ops-only, server-side)",
    ),
    "notifier": ("services.notifier.commands", "notifier processes"),
    "deliveries": (
        "services.support",
        "webhook deliveries (over the API with a key, or server-side)",
    ),
    "endpoints": (
        "services.support",
        "webhook endpoints (over the API with a key, or server-side)",
    ),
    "events": ("services.support", "the event catalog: every type and pattern"),
    "sla": (
        "services.support",
        "delivery SLA per tenant and endpoint: counts, success rate, p50/p99 of "
        "first-attempt latency and commit-to-success time, oldest pending",
    ),
    "keys": ("services.keys", "deposit keys for a deployment"),
    "reconcile": (
        "services.commands",
        "check that every event reached the notifier, once, intact, and that the hot wallet "
        "paid only what Settle recorded (exit 1 if not)",
    ),
    "incidents": ("services.core.deposits.cli", "chain incidents Settle raised (ops)"),
    "prune": (
        "services.prune",
        "drop data past its retention (old partitions), as JSON (--dry-run: only say what)",
    ),
    "doctor": ("services.doctor", "check this deployment's wiring (exit 1 names a failure)"),
    "sweep": (
        "services.core.sweeps.cli",
        "deposits to the treasury (plan, sign offline, send, status)",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `command`, that command's module registers its full sub-parser.

    Without one (or for an unknown one) every command is a placeholder with its help:
    enough for `settle --help` and for argparse's "invalid choice" message.
    """
    import importlib

    parser = argparse.ArgumentParser(prog="settle", description="Settle deposit settlement")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [COMMANDS[command][0]] if command in COMMANDS else []
    if command == "all":
        modules = list(dict.fromkeys(module for module, _ in COMMANDS.values()))
    for module in modules:
        importlib.import_module(module).register(sub)
    for name, (_, help_text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=help_text, add_help=False)
    for leaf in (parser, *_leaves(parser)):
        if "--json" not in leaf._option_string_actions and leaf.add_help:
            leaf.add_argument(
                "--json",
                action="store_true",
                default=argparse.SUPPRESS,
                help="print JSON (the default when stdout is not a terminal)",
            )
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The command word of `argv` (the first argument that is not an option)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--log-level":
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def _leaves(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every sub-command's parser, at any depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield child
                yield from _leaves(child)


def missing_data_dir(command: str, env: Mapping[str, str]) -> str | None:
    """Why `command` cannot run here (no database named and no data dir), or None."""
    from shared.settings import DATA_DIR_NAME, data_dir

    if command in _NO_DATA_DIR or env.get("SETTLE_DATABASE_URL"):
        return None
    if env.get("SETTLE_ENV", "dev") != "dev":
        return None  # production settings say themselves what they lack
    folder = data_dir(env)
    if folder.is_dir():
        return None
    where = (
        f"SETTLE_DATA_DIR={folder}"
        if env.get("SETTLE_DATA_DIR")
        else (f"no {DATA_DIR_NAME} in {os.getcwd()} or any directory above it")
    )
    return (
        f"no Settle data here ({where}). Run this from the project where `settle dev` "
        "runs (it makes the data dir), set SETTLE_DATA_DIR to that data dir, or set "
        "SETTLE_DATABASE_URL to a PostgreSQL database."
    )


def explain(exc: BaseException) -> str | None:
    """A one-line message for a failure a person can fix, or None for a real bug."""
    from shared.settings import SettingsError

    if isinstance(exc, SettingsError):
        return f"setting: {exc}"
    try:
        from shared.embedded_postgres import EmbeddedPostgresError

        if isinstance(exc, EmbeddedPostgresError):
            return str(exc)
    except ImportError:  # pragma: no cover
        pass
    import psycopg
    import sqlalchemy.exc

    # psycopg's own: the fast executor's connections are opened by psycopg directly.
    if isinstance(exc, sqlalchemy.exc.OperationalError | psycopg.OperationalError):
        orig = getattr(exc, "orig", None)
        first = (str(orig or exc).strip().splitlines() or [""])[0]
        return (
            f"cannot reach the database: {first}. Is PostgreSQL running, and is "
            "SETTLE_DATABASE_URL right?"
        )
    if isinstance(exc, sqlalchemy.exc.ProgrammingError) and "does not exist" in str(exc):
        return "the database has no Settle tables yet: run `settle db upgrade`"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    # A sub-command that reads no database says so (`settle sweep sign`, offline).
    needs_data = getattr(args, "needs_data_dir", True)
    if callable(needs_data):  # e.g. only when no API URL is given (services/support.py)
        needs_data = needs_data(args)
    problem = missing_data_dir(args.command, os.environ) if needs_data else None
    if problem is not None:
        sys.stderr.write(f"settle {args.command}: {problem}\n")
        return 2
    from services import output
    from shared import logs

    output.set_json(True if getattr(args, "json", False) else None)
    mode = "production" if os.environ.get("SETTLE_ENV") == "production" else "dev"
    logs.configure(mode, str(args.log_level))
    # Alembic narrates every plugin it loads; keep its warnings only.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = explain(exc)
        if message is None or os.environ.get("SETTLE_DEBUG"):
            raise
        sys.stderr.write(f"settle {args.command}: {message}\n(SETTLE_DEBUG=1 shows the trace)\n")
        return 2
    finally:
        logs.unconfigure()
    return code


if __name__ == "__main__":
    sys.exit(main())
