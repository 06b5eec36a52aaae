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
    for module in _command_modules():
        module.register(sub)  # type: ignore[attr-defined]
    return parser


def _command_modules() -> list[object]:
    """Modules with a `register(subparsers)`: each part owns its commands."""
    from services import reconcile
    from services.core.deposits import commands as deposit_commands
    from services.notifier import commands as notifier_commands
    from services.notifier import ops

    return [deposit_commands, notifier_commands, ops, reconcile]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # Alembic narrates every plugin it loads; keep its warnings only.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
