"""`settle dev` on a busy port stops before touching anything; it reuses its demo key."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from services import cli
from services.dev import ensure_demo_tenant
from services.devdata import read_demo
from shared.db import Database
from shared.identity import service as identity

pytestmark = pytest.mark.integration


def test_a_busy_port_is_reported_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given something already listening on the port
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        monkeypatch.setenv("SETTLE_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.delenv("SETTLE_DATABASE_URL", raising=False)
        # When settle dev is asked for it
        code = cli.main(["dev", "--port", str(port)])
    # Then it says so and stops: no banner, no key, no database, no data dir
    captured = capsys.readouterr()
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in captured.err and "--port" in captured.err
    assert "Settle is running" not in captured.out and "sk_" not in captured.out
    assert not (tmp_path / "data").exists()


def test_the_demo_key_is_reused_until_it_is_revoked(pg_db: Database, tmp_path: Path) -> None:
    # Given a first start: a demo tenant and key, recorded privately
    first = ensure_demo_tenant(pg_db, tmp_path)
    record = tmp_path / "demo.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert read_demo(tmp_path)["apiKey"] == first.api_key
    # When it starts again, the same key serves (no new full-scope key)
    again = ensure_demo_tenant(pg_db, tmp_path)
    assert again == first
    # When the key was revoked meanwhile, a new one is made for the same tenant
    with pg_db.transaction() as session:
        identity.revoke_api_key(session, first.api_key_id)
    third = ensure_demo_tenant(pg_db, tmp_path)
    assert third.tenant_id == first.tenant_id and third.api_key != first.api_key
    assert identity.authenticate_key(pg_db, third.api_key) is not None
    # And a damaged record starts over rather than failing
    record.write_text("{not json")
    fourth = ensure_demo_tenant(pg_db, tmp_path)
    assert identity.authenticate_key(pg_db, fourth.api_key) is not None
