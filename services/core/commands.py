"""Registers core's commands: tenants, api-keys, members, audit, db, core.

Imports nothing heavy: each handler is in services/core/cli.py, imported when its
command runs (services/commands.py).
"""

from __future__ import annotations

import argparse

from services.commands import lazy
from shared.identity.scopes import SCOPES


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError("must be 1..10000")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenants = sub.add_parser("tenants", help="tenants").add_subparsers(dest="action", required=True)
    p = tenants.add_parser("create", help="create a tenant and its first API key")
    p.add_argument("--name", required=True)
    p.add_argument("--sandbox", action="store_true", help="a sandbox tenant (simulated deposits)")
    p.set_defaults(func=lazy("services.core.cli:tenants_create"))

    keys = sub.add_parser("api-keys", help="API keys").add_subparsers(dest="action", required=True)
    p = keys.add_parser("create", help="create an API key")
    p.add_argument("--tenant", required=True)
    p.add_argument("--scope", action="append", choices=SCOPES, help="repeat; default: all")
    p.set_defaults(func=lazy("services.core.cli:api_keys_create"))
    p = keys.add_parser("revoke", help="revoke an API key (emits tenant.api_key_revoked)")
    p.add_argument("key_id")
    p.set_defaults(func=lazy("services.core.cli:api_keys_revoke"))

    members = sub.add_parser("members", help="portal members").add_subparsers(
        dest="action", required=True
    )
    p = members.add_parser("add", help="add a member; the password is read from stdin")
    p.add_argument("--tenant", required=True)
    p.add_argument("--email", required=True)
    p.add_argument("--role", required=True, choices=["viewer", "developer", "admin", "owner"])
    p.set_defaults(func=lazy("services.core.cli:members_add"))

    audit = sub.add_parser("audit", help="the audit log").add_subparsers(
        dest="action", required=True
    )
    p = audit.add_parser(
        "verify",
        help="prove every tenant's hash chain unbroken; exit 1 naming the first bad entry",
    )
    p.add_argument(
        "--anchor",
        metavar="FILE",
        help="the output of an earlier run, kept elsewhere: its heads must still be there",
    )
    p.set_defaults(func=lazy("services.core.cli:audit_verify"))

    db = sub.add_parser("db", help="database").add_subparsers(dest="action", required=True)
    db.add_parser("upgrade", help="apply all migrations").set_defaults(
        func=lazy("services.core.cli:db_upgrade")
    )

    core = sub.add_parser("core", help="core processes").add_subparsers(
        dest="action", required=True
    )
    p = core.add_parser("api", help="serve core's HTTP API with gunicorn")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, help="default: the number of CPUs (at least 2)")
    p.add_argument("--threads", type=int, default=4)
    p.set_defaults(func=lazy("services.core.cli:core_api"))
    core.add_parser(
        "worker", help="outbox relay, fee oracle, deposit pipeline and address backfill"
    ).set_defaults(func=lazy("services.core.cli:core_worker"))
    p = core.add_parser(
        "backfill-addresses",
        help="give existing accounts an address on every active chain they lack (one pass)",
    )
    p.add_argument("--batch", type=_batch_size, default=500, help="accounts per transaction")
    p.set_defaults(func=lazy("services.core.cli:core_backfill_addresses"))
