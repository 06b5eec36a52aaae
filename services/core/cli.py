"""Core's command line: identity, migrations, and core's processes."""

from __future__ import annotations

import argparse
import sys

from services import output
from services.core.api_keys import revoke_key
from services.core.config import CoreConfig
from shared import components, migrate
from shared.audit.changes import key_created, key_revoked, member_added
from shared.audit.log import Actor, Change, record
from shared.db import Database
from shared.errors import ApiError
from shared.identity import service as identity
from shared.identity.models import SCOPES
from shared.serve import default_workers, serve
from shared.settings import env_str, environ
from shared.timefmt import iso_ms


def _print(payload: dict[str, object]) -> None:
    output.emit(payload)


def _identity_db() -> Database:
    return Database(CoreConfig.from_env().identity_database_url, pool_size=1)


def tenants_create(args: argparse.Namespace) -> int:
    with _identity_db().transaction() as session:
        tenant, issued = identity.create_tenant(session, args.name, sandbox=args.sandbox)
        after = {"name": tenant.name, "sandbox": tenant.sandbox}
        ops = Actor.ops()
        record(session, tenant.id, Change("tenant.created", "tenant", tenant.id, after=after), ops)
        record(session, tenant.id, key_created(issued.record), ops)
        _print({"tenantId": tenant.id, "apiKey": issued.api_key, "apiKeyId": issued.record.id})
    return 0


def api_keys_create(args: argparse.Namespace) -> int:
    with _identity_db().transaction() as session:
        issued = identity.create_api_key(session, args.tenant, args.scope or SCOPES)
        record(session, args.tenant, key_created(issued.record), Actor.ops())
        _print(
            {"apiKey": issued.api_key, "apiKeyId": issued.record.id, "scopes": issued.record.scopes}
        )
    return 0


def api_keys_revoke(args: argparse.Namespace) -> int:
    # Identity lives in core's database, so the key and its event commit together.
    config = CoreConfig.from_env()
    log = Database(config.identity_database_url, pool_size=1)
    with Database(config.database_url, pool_size=1).transaction() as session:
        key, newly = revoke_key(session, args.key_id)
        if newly:
            record(session, key.tenant_id, key_revoked(key), Actor.ops(), log=log)
        assert key.revoked_at is not None
        _print({"apiKeyId": key.id, "revokedAt": iso_ms(key.revoked_at), "changed": newly})
    return 0


def members_add(args: argparse.Namespace) -> int:
    password = sys.stdin.readline().rstrip("\r\n")
    with _identity_db().transaction() as session:
        member = identity.add_member(session, args.tenant, args.email, args.role, password)
        record(session, member.tenant_id, member_added(member), Actor.ops())
        _print(
            {
                "memberId": member.id,
                "tenantId": member.tenant_id,
                "email": member.email,
                "role": member.role,
            }
        )
    return 0


def audit_verify(args: argparse.Namespace) -> int:
    """Check every tenant's audit chain; exit 1 naming the first bad entry."""
    import json

    from shared.audit.chain import Head
    from shared.audit.log import verify

    anchors: list[Head] = []
    if args.anchor:
        with open(args.anchor, encoding="utf-8") as anchor_file:
            printed = json.load(anchor_file)
        anchors = [Head(h["tenantId"], int(h["sequence"]), h["hash"]) for h in printed["heads"]]
    db = _identity_db()
    try:
        found = verify(db, anchors=anchors)
    finally:
        db.dispose()
    _print(found.document())
    if found.ok:
        return 0
    for bad in found.breaks:
        sys.stderr.write(
            f"audit verify: tenant {bad.tenant_id}: entry {bad.id or '-'} (sequence "
            f"{bad.sequence}): {bad.reason}\n"
        )
    return 1


def db_upgrade(args: argparse.Namespace) -> int:
    """Migrate identity and core (core's URL) and the notifier (its URL)."""
    env = environ()
    core_url = CoreConfig.from_env(env).database_url
    identity_url = env_str(env, "SETTLE_IDENTITY_DATABASE_URL", core_url) or core_url
    notifier_url = env_str(env, "SETTLE_NOTIFIER_DATABASE_URL", core_url) or core_url
    migrate.upgrade(components.IDENTITY, identity_url)
    migrate.upgrade(components.CORE, core_url)
    migrate.upgrade(components.NOTIFIER, notifier_url)
    _print({"upgraded": ["identity", "core", "notifier"]})
    return 0


def core_api(args: argparse.Namespace) -> int:
    serve(
        "services.core.wsgi:app",
        host=args.host,
        port=args.port,
        workers=args.workers,
        threads=args.threads,
    )
    return 0


def core_worker(args: argparse.Namespace) -> int:
    from services.core.worker import run_worker

    return run_worker(CoreConfig.from_env())


def core_backfill_addresses(args: argparse.Namespace) -> int:
    """One full backfill pass (the worker also runs one at start); prints the counts."""
    from services.core.backfill import backfill_addresses
    from services.core.context import CoreContext

    ctx = CoreContext.build(CoreConfig.from_env())
    try:
        result = backfill_addresses(ctx.db, ctx.registry, ctx.deriver, batch=args.batch)
    finally:
        ctx.db.dispose()
    _print(result.document())
    return 0


def _guard(fn: object) -> object:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)  # type: ignore[operator,no-any-return]
        except ApiError as err:
            sys.stderr.write(f"error: {err.code}: {err.message}\n")
            return 2

    return run


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
    p.set_defaults(func=_guard(tenants_create))

    keys = sub.add_parser("api-keys", help="API keys").add_subparsers(dest="action", required=True)
    p = keys.add_parser("create", help="create an API key")
    p.add_argument("--tenant", required=True)
    p.add_argument("--scope", action="append", choices=SCOPES, help="repeat; default: all")
    p.set_defaults(func=_guard(api_keys_create))
    p = keys.add_parser("revoke", help="revoke an API key (emits tenant.api_key_revoked)")
    p.add_argument("key_id")
    p.set_defaults(func=_guard(api_keys_revoke))

    members = sub.add_parser("members", help="portal members").add_subparsers(
        dest="action", required=True
    )
    p = members.add_parser("add", help="add a member; the password is read from stdin")
    p.add_argument("--tenant", required=True)
    p.add_argument("--email", required=True)
    p.add_argument("--role", required=True, choices=["viewer", "developer", "admin", "owner"])
    p.set_defaults(func=_guard(members_add))

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
    p.set_defaults(func=audit_verify)

    db = sub.add_parser("db", help="database").add_subparsers(dest="action", required=True)
    db.add_parser("upgrade", help="apply all migrations").set_defaults(func=db_upgrade)

    core = sub.add_parser("core", help="core processes").add_subparsers(
        dest="action", required=True
    )
    p = core.add_parser("api", help="serve core's HTTP API with gunicorn")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=default_workers())
    p.add_argument("--threads", type=int, default=4)
    p.set_defaults(func=core_api)
    core.add_parser(
        "worker", help="outbox relay, fee oracle, deposit pipeline and address backfill"
    ).set_defaults(func=core_worker)
    p = core.add_parser(
        "backfill-addresses",
        help="give existing accounts an address on every active chain they lack (one pass)",
    )
    p.add_argument("--batch", type=_batch_size, default=500, help="accounts per transaction")
    p.set_defaults(func=core_backfill_addresses)
