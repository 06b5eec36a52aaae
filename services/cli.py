"""`settle`: the command line of DESIGN.md. Each part registers its own commands."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from services import dev
    from services.core import commands as core_commands

    parser = argparse.ArgumentParser(prog="settle", description="Settle deposit settlement")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    dev.register(sub)
    core_commands.register(sub)
    for module in _optional_command_modules():
        module.register(sub)
    return parser


def _optional_command_modules() -> list[object]:
    import importlib

    modules = []
    for name in (
        "services.core.deposits.commands",
        "services.notifier.commands",
        "services.notifier.ops",
    ):
        modules.append(importlib.import_module(name))
    return modules


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
