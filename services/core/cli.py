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
        workers=args.workers or default_workers(),
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
