"""The identity command line of DESIGN.md, against the real database.

Scripts outside the project call these, so their stdout JSON is a contract.
"""

from __future__ import annotations

import io
import json

import pytest
import sqlalchemy as sa
from flask.testing import FlaskClient

from services.cli import main
from services.core.models import OutboxEvent
from shared.db import Database

pytestmark = pytest.mark.integration

LAST_ERR = [""]


def run(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_url: str,
    *argv: str,
    stdin: str = "",
) -> tuple[int, dict[str, object]]:
    """Run `settle <argv>` in-process; stderr is kept in `run.last_err`."""
    monkeypatch.setenv("SETTLE_DATABASE_URL", pg_url)
    monkeypatch.setenv("SETTLE_ENV", "dev")
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(list(argv))
    captured = capsys.readouterr()
    LAST_ERR[0] = captured.err
    out = captured.out.strip()
    return code, (json.loads(out) if out else {})


def test_tenant_key_and_revocation_round_trip(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_url: str,
    pg_db: Database,
    client: FlaskClient,
) -> None:
    # Given a tenant made from the command line
    code, tenant = run(monkeypatch, capsys, pg_url, "tenants", "create", "--name", "Acme")
    assert code == 0 and set(tenant) == {"tenantId", "apiKey", "apiKeyId"}
    assert str(tenant["apiKey"]).startswith("sk_") and str(tenant["apiKeyId"]).startswith("key_")

    # When a second key with one scope is made, it can read the policy but not write it
    code, key = run(
        monkeypatch,
        capsys,
        pg_url,
        "api-keys",
        "create",
        "--tenant",
        str(tenant["tenantId"]),
        "--scope",
        "destination_policy:read",
    )
    assert code == 0 and key["scopes"] == ["destination_policy:read"]
    headers = {"Authorization": f"Bearer {key['apiKey']}"}
    assert client.get("/v1/destination-policy", headers=headers).status_code == 200
    denied = client.put("/v1/destination-policy", headers=headers, json={})
    assert denied.status_code == 403 and denied.json["code"] == "insufficient_scope"

    # When it is revoked, it stops working and one tenant.api_key_revoked event is written
    code, revoked = run(monkeypatch, capsys, pg_url, "api-keys", "revoke", str(key["apiKeyId"]))
    assert code == 0 and revoked["changed"] is True
    gone = client.get("/v1/destination-policy", headers=headers)
    assert gone.status_code == 401 and gone.json["code"] == "unauthorized"
    code, again = run(monkeypatch, capsys, pg_url, "api-keys", "revoke", str(key["apiKeyId"]))
    assert code == 0 and again["changed"] is False
    with pg_db.reader() as session:
        rows = (
            session.execute(
                sa.select(OutboxEvent).where(
                    OutboxEvent.tenant_id == tenant["tenantId"],
                    OutboxEvent.event_type == "tenant.api_key_revoked",
                )
            )
            .scalars()
            .all()
        )
    assert len(rows) == 1
    body = json.loads(rows[0].body)
    assert body["data"] == {"apiKeyId": key["apiKeyId"], "revokedAt": revoked["revokedAt"]}
    assert body["tenantId"] == tenant["tenantId"] and body["id"].startswith("evt_")


def test_bad_scope_and_unknown_key_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_url: str,
) -> None:
    code, tenant = run(monkeypatch, capsys, pg_url, "tenants", "create", "--name", "Beta")
    assert code == 0
    code, _ = run(monkeypatch, capsys, pg_url, "api-keys", "revoke", "key_missing")
    assert code == 2 and "not_found" in LAST_ERR[0]
    with pytest.raises(SystemExit) as exit_:  # argparse refuses a scope outside the list
        run(
            monkeypatch,
            capsys,
            pg_url,
            "api-keys",
            "create",
            "--tenant",
            str(tenant["tenantId"]),
            "--scope",
            "nonsense:write",
        )
    assert exit_.value.code == 2


def test_members_add_reads_the_password_from_stdin(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pg_url: str,
) -> None:
    code, tenant = run(monkeypatch, capsys, pg_url, "tenants", "create", "--name", "Gamma")
    email = f"dev-{tenant['tenantId']}@example.com"
    code, member = run(
        monkeypatch,
        capsys,
        pg_url,
        "members",
        "add",
        "--tenant",
        str(tenant["tenantId"]),
        "--email",
        email,
        "--role",
        "developer",
        stdin="correct horse battery staple\n",
    )
    assert code == 0 and member["role"] == "developer" and member["email"] == email
    code, _ = run(
        monkeypatch,
        capsys,
        pg_url,
        "members",
        "add",
        "--tenant",
        str(tenant["tenantId"]),
        "--email",
        "x@example.com",
        "--role",
        "viewer",
        stdin="short\n",
    )
    assert code == 2 and "at least 12 characters" in LAST_ERR[0]
