"""The audit log: every change a tenant cares about, with who made it, append-only and
chained, read through GET /v1/audit-events and checked by `settle audit verify`."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import subprocess
import threading
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pyotp
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from services.core.context import CoreContext
from services.core.deposits import cli as deposits_cli
from services.core.deposits.settings import PipelineSettings
from shared import components, migrate
from shared.audit import chain
from shared.audit.log import MEMBER, Actor, Change, record_alone, verify
from shared.db import Database
from shared.identity.models import AuditEvent
from shared.timefmt import iso_ms, utcnow
from tests.conftest import PASSWORD, TenantKeys, make_tenant
from tests.integration.conftest import USDC_BASE, WALLET_2, destination
from tests.integration.notifier_fixtures import (  # noqa: F401  (fixtures)
    enqueued_fixture,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
)
from tests.support.deposits import deposit_parts, make_account
from tests.support.processes import ROOT, settle_argv
from tests.support.services import create_database, drop_database

pytestmark = pytest.mark.integration

HOOK = "https://hooks.example.com/settle"
#: Sandbox deposits that move at once (no simulated blocks to wait for).
SETTINGS = PipelineSettings(sandbox_block_s=0.01, batch_size=1000, poll_s=0.0)


def audit_events(client: FlaskClient, tenant: TenantKeys, **query: Any) -> list[dict[str, Any]]:
    """Every audit event of the tenant matching `query`, following the cursors."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {**query, "limit": 200, **({"cursor": cursor} if cursor else {})}
        response = client.get("/v1/audit-events", query_string=params, headers=tenant.headers)
        assert response.status_code == 200, response.get_json()
        body = response.get_json()
        found.extend(body["auditEvents"])
        cursor = body["nextCursor"]
        if cursor is None:
            return found


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True))
    return response.get_json() if response.data else None


def test_every_audited_change_is_found_with_its_actor(
    core_app: Flask,
    notifier_app: Flask,
    pg_db: Database,
    core_context: CoreContext,
) -> None:
    # Given a sandbox tenant, its full-scope key, an owner signed in (just now: a fresh
    # factor) and the portal's session calls of both services
    tenant = make_tenant(pg_db, sandbox=True)
    key = tenant.api_key_id
    api = core_app.test_client()
    hooks = notifier_app.test_client()
    owner = tenant.signed_in("owner")
    portal = owner.client(core_app)
    portal_hooks = owner.client(notifier_app)
    csrf = owner.headers
    expected: list[tuple[str, str, str | None]] = []  # (action, actor type, actor id)

    def by_key(action: str) -> None:
        expected.append((action, "api_key", key))

    def by_owner(action: str) -> None:
        expected.append((action, MEMBER, owner.member_id))

    # When every audited change is made once, by the key (as a tenant's server) ...
    ok(
        api.put(
            "/v1/destination-policy", json={"destination": destination()}, headers=tenant.headers
        )
    )
    by_key("destination_policy.updated")
    user = f"user-{uuid.uuid4().hex[:8]}"
    ok(api.post("/v1/deposit-accounts", json={"externalUserId": user}, headers=tenant.headers))
    ok(
        api.patch(
            f"/v1/deposit-accounts/{user}/destination",
            json={"destination": destination(address=WALLET_2)},
            headers=tenant.headers,
        )
    )
    by_key("deposit_account.destination_updated")
    made = ok(api.post("/v1/api-keys", json={"scopes": ["deposits:read"]}, headers=tenant.headers))
    by_key("api_key.created")
    ok(api.delete(f"/v1/api-keys/{made['apiKey']['id']}", headers=tenant.headers), 204)
    by_key("api_key.revoked")
    email = f"new-{uuid.uuid4().hex[:8]}@example.com"
    added = ok(
        api.post(
            "/v1/members",
            json={"email": email, "role": "viewer", "password": PASSWORD},
            headers=tenant.headers,
        )
    )
    by_key("member.added")
    member_id = added["member"]["id"]
    ok(api.patch(f"/v1/members/{member_id}", json={"role": "developer"}, headers=tenant.headers))
    by_key("member.role_changed")
    ok(api.delete(f"/v1/members/{member_id}", headers=tenant.headers), 204)
    by_key("member.removed")
    link = ok(api.post("/v1/portal-links", json={"role": "developer"}, headers=tenant.headers))
    by_key("portal_link.created")
    token = link["portalLink"]["url"].split("#", 1)[1]
    ok(api.post("/v1/sessions/portal-link", json={"token": token}))
    expected.append(("portal_link.opened", "portal_link", link["portalLink"]["id"]))
    endpoint = ok(
        hooks.post(
            "/v1/webhook-endpoints",
            json={"name": "hook", "url": HOOK, "eventTypes": ["webhook.test"]},
            headers=tenant.headers,
        )
    )["webhookEndpoint"]
    by_key("webhook_endpoint.created")
    path = f"/v1/webhook-endpoints/{endpoint['id']}"
    ok(hooks.patch(path, json={"name": "renamed"}, headers=tenant.headers))
    by_key("webhook_endpoint.updated")
    ok(hooks.post(f"{path}/rotate-secret", json={}, headers=tenant.headers))
    by_key("webhook_endpoint.secret_rotated")
    sent = ok(hooks.post(f"{path}/test", headers=tenant.headers))["webhookDelivery"]
    by_key("webhook_endpoint.test_sent")
    ok(hooks.post(f"/v1/webhook-deliveries/{sent['id']}/replay", headers=tenant.headers))
    by_key("webhook_delivery.replayed")
    since = iso_ms(utcnow() - timedelta(hours=1))
    ok(hooks.post(f"{path}/recover", json={"since": since}, headers=tenant.headers))
    by_key("webhook_endpoint.recovered")

    # ... by the owner in the portal (session calls, as the pages make them) ...
    bad = api.post("/v1/sessions", json={"email": owner.email, "password": "wrong password!"})
    assert bad.status_code == 401
    expected.append(("session.sign_in_failed", "anonymous", None))
    signed = ok(api.post("/v1/sessions", json={"email": owner.email, "password": PASSWORD}))
    assert signed["session"]["memberId"] == owner.member_id
    by_owner("session.signed_in")
    ok(
        portal.put(
            f"/v1/tenants/{tenant.tenant_id}/destination-policy",
            json={"destination": destination(address=WALLET_2)},
            headers=csrf,
        )
    )
    by_owner("destination_policy.updated")
    ok(portal.post("/v1/sessions/current/step-up", json={"password": PASSWORD}, headers=csrf))
    by_owner("session.stepped_up")
    enrolment = ok(portal.post("/v1/me/mfa/enrolment", headers=csrf))["enrolment"]
    totp = pyotp.TOTP(enrolment["secret"])
    confirmed = ok(
        portal.post("/v1/me/mfa/enrolment/confirm", json={"code": totp.now()}, headers=csrf)
    )
    by_owner("mfa.enabled")
    ok(portal.post("/v1/me/mfa/recovery-codes", headers=csrf))
    by_owner("mfa.recovery_codes_replaced")
    ok(
        portal.put(
            f"/v1/tenants/{tenant.tenant_id}/security", json={"requireMfa": True}, headers=csrf
        )
    )
    by_owner("tenant.mfa_requirement_changed")
    ok(
        portal.put(
            f"/v1/tenants/{tenant.tenant_id}/security", json={"requireMfa": False}, headers=csrf
        )
    )
    by_owner("tenant.mfa_requirement_changed")
    ok(portal.delete("/v1/me/mfa", headers=csrf), 204)
    by_owner("mfa.disabled")
    assert len(confirmed["recoveryCodes"]) == 10
    admin = tenant.signed_in("owner")  # another owner (an admin never touches an owner)
    ok(
        admin.client(core_app).delete(f"/v1/members/{owner.member_id}/mfa", headers=admin.headers),
        204,
    )
    expected.append(("mfa.reset", MEMBER, admin.member_id))
    ok(portal_hooks.patch(path, json={"status": "disabled"}, headers=csrf))
    by_owner("webhook_endpoint.updated")
    ok(portal_hooks.delete(path, headers=csrf), 204)
    by_owner("webhook_endpoint.deleted")

    # ... and by ops at the command line (a manual credit and a manual fail)
    parts = deposit_parts(pg_db, core_context.registry, settings=SETTINGS)
    account = make_account(
        pg_db,
        tenant.tenant_id,
        core_context.registry,
        dest_chain_id=8453,
        dest_token_address=USDC_BASE,
    )
    reviewed = []
    for _ in range(2):
        deposit = parts.sandbox.create(
            tenant.tenant_id,
            chain_id=8453,
            deposit_address=account.address(8453),
            asset="USDC",
            amount=Decimal("300"),
            outcome="manual_review",
        )
        assert parts.detection.confirm(deposit.id, 99) is not None
        assert parts.settling.settle(deposit.id) == "manual_review_required"
        reviewed.append(deposit.id)
    credit = argparse.Namespace(
        deposit_id=reviewed[0], tx="0x" + "ab" * 32, by="alice", reason="checked"
    )
    assert deposits_cli.credit(credit, ops=parts.ops) == 0
    expected.append(("deposit.credited_by_ops", "ops", "alice"))
    failed = argparse.Namespace(
        deposit_id=reviewed[1], reason="sender asked for a refund", by="bob"
    )
    assert deposits_cli.fail(failed, ops=parts.ops) == 0
    expected.append(("deposit.failed_by_ops", "ops", "bob"))

    # Then GET /v1/audit-events lists each change once, in order, with its actor
    events = list(reversed(audit_events(api, tenant)))
    assert [(e["action"], e["actor"]["type"], e["actor"]["id"]) for e in events] == expected
    # the member's email is shown with their id, ops' OS user@host with their name
    assert {e["actor"]["name"] for e in events if e["actor"]["id"] == owner.member_id} == {
        owner.email
    }
    assert all("@" in (e["actor"]["name"] or "") for e in events if e["actor"]["type"] == "ops")
    # and each carries its request id and client address (the CLI's have none)
    for event in events:
        if event["actor"]["type"] != "ops":
            assert event["requestId"], event
            assert event["ip"] == "127.0.0.1", event
    # and before/after say what changed, with no secret anywhere
    changed = {e["action"]: e for e in events}
    assert changed["member.role_changed"]["before"]["role"] == "viewer"
    assert changed["member.role_changed"]["after"]["role"] == "developer"
    assert (
        changed["deposit_account.destination_updated"]["after"]["destination"]["address"]
        == WALLET_2
    )
    assert changed["api_key.created"]["after"]["scopes"] == ["deposits:read"]
    text = json.dumps(events)
    for secret in (made["secret"], enrolment["secret"], PASSWORD, *confirmed["recoveryCodes"]):
        assert secret not in text
    assert "whsec_" not in text
    # and the chain is whole: 1, 2, 3 ..., each holding the hash of the one before
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["prevHash"] == chain.GENESIS
    assert all(b["prevHash"] == a["hash"] for a, b in itertools.pairwise(events))


def test_a_tenant_can_recompute_every_hash_from_the_api(
    client: FlaskClient, tenant: TenantKeys
) -> None:
    # Given a few changes
    for address in (WALLET_2, destination()["address"]):
        ok(
            client.put(
                "/v1/destination-policy",
                json={"destination": destination(address=address)},
                headers=tenant.headers,
            )
        )
    # When the tenant recomputes each hash from what the API shows (docs/SECURITY.md)
    for event in audit_events(client, tenant):
        document = {
            "v": 1,
            "id": event["id"],
            "tenantId": event["tenantId"],
            "sequence": event["sequence"],
            "createdAt": event["chainTime"],
            "action": event["action"],
            "actor": event["actor"],
            "target": event["target"],
            "before": event["before"],
            "after": event["after"],
            "ip": event["ip"],
            "requestId": event["requestId"],
            "prevHash": event["prevHash"],
        }
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        # Then it is the hash the API shows
        assert hashlib.sha256(text.encode()).hexdigest() == event["hash"]


def test_filters_cursors_scope_and_isolation(
    client: FlaskClient, tenant: TenantKeys, other_tenant: TenantKeys
) -> None:
    # Given a policy change and a key creation by the tenant's key
    ok(
        client.put(
            "/v1/destination-policy", json={"destination": destination()}, headers=tenant.headers
        )
    )
    ok(client.post("/v1/api-keys", json={"scopes": ["fees:read"]}, headers=tenant.headers))
    ok(
        client.put(
            "/v1/destination-policy",
            json={"destination": destination(address=WALLET_2)},
            headers=tenant.headers,
        )
    )
    # Then filters narrow by action (exact or a family), actor and time
    assert [e["action"] for e in audit_events(client, tenant, action="api_key.created")] == [
        "api_key.created"
    ]
    assert len(audit_events(client, tenant, action="destination_policy.*")) == 2
    assert len(audit_events(client, tenant, actorId=tenant.api_key_id)) == 3
    assert audit_events(client, tenant, actorId="key_someone_else") == []
    assert audit_events(client, tenant, createdAfter="2999-01-01T00:00:00Z") == []
    assert len(audit_events(client, tenant, createdBefore="2999-01-01T00:00:00Z")) == 3
    # And pages of one follow the cursor newest first, neither skipping nor repeating
    seen, cursor = [], None
    while True:
        q = {"limit": 1, **({"cursor": cursor} if cursor else {})}
        body = ok(client.get("/v1/audit-events", query_string=q, headers=tenant.headers))
        seen += [e["sequence"] for e in body["auditEvents"]]
        cursor = body["nextCursor"]
        if not cursor:
            break
    assert seen == [3, 2, 1]
    # And another tenant sees none of it; a key without audit:read is refused
    assert audit_events(client, other_tenant) == []
    narrow = tenant.key_with("deposits:read")
    refused = client.get("/v1/audit-events", headers=narrow)
    assert refused.status_code == 403 and refused.get_json()["code"] == "insufficient_scope"
    # And a misspelt filter, a bad time or a bad cursor is a 400, never a 500
    for query in (
        {"actor": "x"},
        {"createdAfter": "yesterday"},
        {"cursor": "nope"},
        {"action": "a\x00b"},
    ):
        bad = client.get("/v1/audit-events", query_string=query, headers=tenant.headers)
        assert bad.status_code == 400, (query, bad.get_json())


def test_members_below_admin_cannot_read_the_log(core_app: Flask, tenant: TenantKeys) -> None:
    for role, status in (("viewer", 403), ("developer", 403), ("admin", 200), ("owner", 200)):
        member = tenant.signed_in(role)
        response = member.client(core_app).get("/v1/audit-events")
        assert response.status_code == status, (role, response.get_json())


def test_the_table_refuses_update_delete_and_truncate(
    client: FlaskClient, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given an entry
    ok(
        client.put(
            "/v1/destination-policy", json={"destination": destination()}, headers=tenant.headers
        )
    )
    # When anyone but a superuser with triggers off edits, deletes or truncates: refused
    for statement in (
        "UPDATE audit_events SET action = 'nothing' WHERE tenant_id = :t",
        "DELETE FROM audit_events WHERE tenant_id = :t",
        "TRUNCATE audit_events",
    ):
        with (
            pytest.raises(sa.exc.DBAPIError, match="append-only"),
            pg_db.transaction() as session,
        ):
            session.execute(sa.text(statement), {"t": tenant.tenant_id})
    assert len(audit_events(client, tenant)) == 1


def test_concurrent_writers_never_fork_a_chain(pg_db: Database, tenant: TenantKeys) -> None:
    # Given 8 threads appending 10 entries each to one tenant's chain at once
    actor = Actor("ops", "load", "load@test")
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            start.wait()
            for i in range(10):
                record_alone(
                    pg_db, tenant.tenant_id, Change("test.append", "test", f"{n}-{i}"), actor
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then all 80 are in one unbroken chain
    assert errors == []
    with pg_db.reader() as session:
        rows = session.scalars(
            sa.select(AuditEvent)
            .where(AuditEvent.tenant_id == tenant.tenant_id)
            .order_by(AuditEvent.sequence)
        ).all()
        outcomes = list(chain.check_chain(rows))
    assert [r.sequence for r in rows] == list(range(1, 81))
    assert isinstance(outcomes[-1], chain.Head) and outcomes[-1].sequence == 80


def test_a_dba_edit_of_any_row_fails_settle_audit_verify_naming_it() -> None:
    # Given a database of its own with three tenants' chains of four entries each
    name = f"settle_test_audit_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    db = Database(url, pool_size=2)
    try:
        migrate.upgrade(components.IDENTITY, url)
        tenants = [make_tenant(db).tenant_id for _ in range(3)]
        actor = Actor("ops", "alice", "alice@host")
        for tenant_id in tenants:
            for i in range(4):
                change = Change("test.change", "thing", str(i), {"n": i}, {"n": i + 1})
                record_alone(db, tenant_id, change, actor)
        rows = {t: _chain_ids(db, t) for t in tenants}
        env = {**os.environ, "SETTLE_DATABASE_URL": url, "SETTLE_ENV": "dev"}

        def run_verify() -> tuple[int, dict[str, Any], str]:
            ran = subprocess.run(
                settle_argv("audit", "verify", "--json"),
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            return ran.returncode, json.loads(ran.stdout), ran.stderr

        # When it is verified untouched: exit 0, every chain and entry counted
        code, report, _ = run_verify()
        assert code == 0 and report["ok"] is True, report
        assert (report["chains"], report["entries"]) == (3, 12)

        # Then editing any one field of a row, as a DBA would (a superuser switching
        # the trigger off), makes it exit 1 naming that row: each edit on an earlier
        # row of the first chain, so each is the chain's first bad row in turn
        first = tenants[0]
        edits = [
            ("after = '{\"n\": 99}'::jsonb", 3),
            ("actor_id = 'mallory'", 2),
            ("created_at = created_at + interval '1 microsecond'", 1),
            ("ip = '10.0.0.1'", 0),
        ]
        for assignment, index in edits:
            statement = f"UPDATE audit_events SET {assignment} WHERE id = :id"  # noqa: S608
            _as_dba(db, statement, rows[first][index])
            code, report, stderr = run_verify()
            assert code == 1, (assignment, report)
            assert report["firstBadEvent"]["id"] == rows[first][index], (assignment, report)
            assert report["firstBadEvent"]["sequence"] == index + 1
            assert rows[first][index] in stderr

        # And a row rewritten with its hash recomputed breaks the next row's link
        second = tenants[1]
        _as_dba(db, "UPDATE audit_events SET actor_id = 'mallory' WHERE id = :id", rows[second][1])
        with db.reader() as session:
            edited = session.get(AuditEvent, rows[second][1])
            assert edited is not None
            rehashed = chain.entry_hash(edited)
        _as_dba(
            db, "UPDATE audit_events SET hash = :hash WHERE id = :id", rows[second][1], rehashed
        )
        # And a deleted row breaks the chain at the row after it
        third = tenants[2]
        _as_dba(db, "DELETE FROM audit_events WHERE id = :id", rows[third][1])
        code, report, _ = run_verify()
        found = {b["tenantId"]: b for b in report["breaks"]}
        assert code == 1
        assert found[second]["id"] == rows[second][2]
        assert "prevHash" in found[second]["reason"]
        assert found[third]["id"] == rows[third][2]
        assert "sequence" in found[third]["reason"]
    finally:
        db.dispose()
        drop_database(name)


def _chain_ids(db: Database, tenant_id: str) -> list[str]:
    with db.reader() as session:
        return list(
            session.scalars(
                sa.select(AuditEvent.id)
                .where(AuditEvent.tenant_id == tenant_id)
                .order_by(AuditEvent.sequence)
            )
        )


def _as_dba(db: Database, statement: str, row_id: str, new_hash: str = "") -> None:
    """Change the table as a superuser can: with the append-only trigger switched off."""
    with db.transaction() as session:
        session.execute(sa.text("SET LOCAL session_replication_role = replica"))
        session.execute(sa.text(statement), {"id": row_id, "hash": new_hash})


def test_an_anchor_catches_a_rewritten_tail(pg_db: Database, tenant: TenantKeys) -> None:
    # Given a chain of three and its head anchored elsewhere
    actor = Actor("ops", "alice", "alice@host")
    for i in range(3):
        record_alone(pg_db, tenant.tenant_id, Change("test.change", "thing", str(i)), actor)
    report = verify(pg_db)
    assert report.ok
    head = next(h for h in report.heads if h.tenant_id == tenant.tenant_id)
    # When the tail is later cut (two entries gone: the chain alone still checks) ...
    with pg_db.transaction() as session:
        session.execute(sa.text("SET LOCAL session_replication_role = replica"))
        session.execute(
            sa.text("DELETE FROM audit_events WHERE tenant_id = :t AND sequence > 1"),
            {"t": tenant.tenant_id},
        )
    alone = verify(pg_db)
    assert not any(b.tenant_id == tenant.tenant_id for b in alone.breaks)
    # Then checking against the anchor names the chain
    anchored = verify(pg_db, anchors=[head])
    assert [b.tenant_id for b in anchored.breaks] == [tenant.tenant_id]
    assert "anchored" in anchored.breaks[0].reason


def test_a_notifier_with_its_own_database_writes_the_log_in_identity(
    pg_url: str, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a notifier whose database is not the identity database
    from services.notifier.app import create_app
    from tests.integration.notifier_fixtures import own_database_notifier

    with own_database_notifier(pg_url, pg_db) as context:
        app = create_app(context=context)
        # When it registers an endpoint
        made = app.test_client().post(
            "/v1/webhook-endpoints",
            json={"name": "hook", "url": HOOK, "eventTypes": ["webhook.test"]},
            headers=tenant.headers,
        )
        assert made.status_code == 200, made.get_json()
        # Then the entry is in identity's log (the notifier's own database has no log)
        with pg_db.reader() as session:
            actions = session.scalars(
                sa.select(AuditEvent.action).where(AuditEvent.tenant_id == tenant.tenant_id)
            ).all()
        assert actions == ["webhook_endpoint.created"]
        with context.db.reader() as session:
            assert session.scalar(sa.text("SELECT to_regclass('audit_events')")) is None


def test_sign_in_failures_of_unknown_emails_are_not_recorded(
    client: FlaskClient, pg_db: Database
) -> None:
    # An unknown email belongs to no tenant: nothing to write, nowhere to write it
    with pg_db.reader() as session:
        before = session.scalar(sa.select(sa.func.count()).select_from(AuditEvent))
    response = client.post(
        "/v1/sessions",
        json={"email": f"nobody-{uuid.uuid4().hex}@example.com", "password": "x" * 12},
    )
    assert response.status_code == 401
    with pg_db.reader() as session:
        assert session.scalar(sa.select(sa.func.count()).select_from(AuditEvent)) == before
