"""The worker's per-process cache of decrypted endpoint secrets (notifier/secret_cache.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from services.notifier.delivery_store import Claim
from services.notifier.models import Endpoint
from services.notifier.secret_cache import SecretCache
from services.notifier.secrets import SecretBox, SecretDecryptError
from shared.db import DriverStatement

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class CountingBox(SecretBox):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.calls = 0

    def decrypt(self, token: str) -> str:
        self.calls += 1
        return super().decrypt(token)


def _view(current: str, previous: str | None = None, expires: datetime | None = None) -> Claim:
    return Claim(
        delivery_id="whd_1",
        lease_until=NOW,
        attempt_number=1,
        event_id="evt_1",
        event_body="{}",
        event_created_at=NOW,
        endpoint_id="we_1",
        tenant_id="t_1",
        url="https://example.com/hook",
        endpoint_status="enabled",
        deleted_at=None,
        failing_since=None,
        secret_encrypted=current,
        previous_secret_encrypted=previous,
        previous_secret_expires_at=expires,
    )


def test_a_secret_is_decrypted_once_then_served_from_the_cache() -> None:
    box = CountingBox("k")
    cache = SecretCache(box)
    token = box.encrypt("whsec_a")
    assert cache.signing_secrets(_view(token), NOW) == ["whsec_a"]
    assert cache.signing_secrets(_view(token), NOW) == ["whsec_a"]
    assert box.calls == 1


def test_a_rotation_applies_on_the_next_attempt_and_the_previous_secret_lapses() -> None:
    box = CountingBox("k")
    cache = SecretCache(box)
    old, new = box.encrypt("whsec_old"), box.encrypt("whsec_new")
    assert cache.signing_secrets(_view(old), NOW) == ["whsec_old"]
    expires = NOW + timedelta(hours=1)
    rotated = _view(new, old, expires)
    assert cache.signing_secrets(rotated, NOW) == ["whsec_new", "whsec_old"]
    assert cache.signing_secrets(rotated, expires + timedelta(seconds=1)) == ["whsec_new"]


def test_entries_expire_and_the_cache_is_bounded() -> None:
    box = CountingBox("k")
    clock = [0.0]
    cache = SecretCache(box, ttl_s=10.0, max_entries=2, clock=lambda: clock[0])
    tokens = [box.encrypt(f"whsec_{i}") for i in range(3)]
    cache.decrypt(tokens[0])
    clock[0] = 11.0
    assert cache.decrypt(tokens[0]) == "whsec_0"
    assert box.calls == 2
    for token in tokens:
        cache.decrypt(token)
    assert len(cache._entries) <= 2


def test_a_token_that_does_not_decrypt_raises_and_is_not_cached() -> None:
    token = SecretBox("other key").encrypt("whsec_x")
    cache = SecretCache(SecretBox("k"))
    for _ in range(2):
        with pytest.raises(SecretDecryptError):
            cache.decrypt(token)
    assert cache._entries == {}


def test_compiled_statements_keep_constants_and_demand_every_other_bind() -> None:
    statement = (
        sa.update(Endpoint)
        .where(Endpoint.id == sa.bindparam("endpoint_id"), Endpoint.status == "enabled")
        .values(failing_since=None)
    )
    compiled = DriverStatement(statement, postgresql.psycopg.dialect())
    params = compiled.bind({"endpoint_id": "whe_1", "unused": 1})
    assert params["endpoint_id"] == "whe_1"
    assert "enabled" in params.values()
    assert "unused" not in params
    with pytest.raises(KeyError):
        compiled.bind({})


def test_statements_with_python_side_defaults_are_refused() -> None:
    table = sa.Table(
        "t", sa.MetaData(), sa.Column("id", sa.Integer), sa.Column("n", sa.Integer, default=1)
    )
    with pytest.raises(ValueError, match="needs SQLAlchemy"):
        DriverStatement(
            sa.insert(table).values(id=sa.bindparam("id")), postgresql.psycopg.dialect()
        )
