"""Idempotency records on real PostgreSQL: no secret at rest in plaintext, gone after 24 h."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from services.core.models import IdempotencyRecord
from services.notifier.models import NotifierIdempotencyRecord
from shared import idempotency
from shared.db import Database
from shared.secretbox import SecretBox
from shared.timefmt import utcnow
from tests.conftest import TenantKeys, make_tenant
from tests.integration.notifier_fixtures import (  # noqa: F401 (fixtures, used by name)
    PUBLIC_URL,
    notifier_app_fixture,
    notifier_client_fixture,
    notifier_context_fixture,
)

pytestmark = pytest.mark.integration

ENDPOINTS = "/v1/webhook-endpoints"


def _records(db: Database, model: Any, scope: str) -> list[Any]:
    with db.reader() as session:
        rows = session.scalars(sa.select(model).where(model.scope == scope)).all()
        session.expunge_all()
        return list(rows)


def _as_text(record: Any) -> str:
    return " ".join(
        str(getattr(record, c)) for c in ("scope", "key", "request_hash", "response_body")
    )


def _backdate(db: Database, model: Any, scope: str, hours: float) -> None:
    with db.transaction() as session:
        session.execute(
            sa.update(model)
            .where(model.scope == scope)
            .values(created_at=utcnow() - timedelta(hours=hours))
        )


def test_creation_and_rotation_with_a_key_store_no_secret_in_plaintext(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given a creation and a rotation, each sent with an Idempotency-Key
    tenant = make_tenant(pg_db)
    created_headers = {**tenant.headers, "Idempotency-Key": "create-1"}
    body = {"name": "Ledger", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}
    created = notifier_client.post(ENDPOINTS, json=body, headers=created_headers)
    endpoint_id, first_secret = (
        created.get_json()["webhookEndpoint"]["id"],
        created.get_json()["secret"],
    )
    rotate = f"{ENDPOINTS}/{endpoint_id}/rotate-secret"
    rotated_headers = {**tenant.headers, "Idempotency-Key": "rotate-1"}
    rotated = notifier_client.post(rotate, json={}, headers=rotated_headers)
    new_secret = rotated.get_json()["secret"]

    # When the idempotency table is read as an attacker with a database dump would
    records = _records(pg_db, NotifierIdempotencyRecord, tenant.api_key_id)

    # Then neither secret (nor any part of a response) is there in plaintext
    assert len(records) == 2
    for record in records:
        dumped = _as_text(record)
        assert first_secret not in dumped and new_secret not in dumped
        assert "whsec_" not in dumped and endpoint_id not in dumped
    # And a retry still answers the first response, secret included
    again = notifier_client.post(ENDPOINTS, json=body, headers=created_headers)
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.get_json() == created.get_json()
    again = notifier_client.post(rotate, json={}, headers=rotated_headers)
    assert again.get_json()["secret"] == new_secret


def test_core_records_are_sealed_too(
    client: FlaskClient, policy_tenant: TenantKeys, pg_db: Database
) -> None:
    # Given an account created with an Idempotency-Key
    uid = f"user-{uuid.uuid4().hex[:12]}"
    headers = {**policy_tenant.headers, "Idempotency-Key": "create-account-1"}
    first = client.post("/v1/deposit-accounts", json={"externalUserId": uid}, headers=headers)
    assert first.status_code == 200
    # Then its record holds neither the response nor a plain hash of the request
    (record,) = _records(pg_db, IdempotencyRecord, policy_tenant.api_key_id)
    assert uid not in _as_text(record)
    assert first.get_json()["depositAccount"]["id"] not in _as_text(record)
    # And the replay is the first response
    again = client.post("/v1/deposit-accounts", json={"externalUserId": uid}, headers=headers)
    assert again.get_data() == first.get_data()


def test_api_keys_members_and_portal_links_with_a_key_store_no_secret(
    client: FlaskClient, tenant: TenantKeys, pg_db: Database
) -> None:
    # Given a new API key, a new member (with a password) and a portal link, each made
    # with an Idempotency-Key (the key and the link are shown once; the password never)
    def post(path: str, body: dict[str, Any], key: str) -> dict[str, Any]:
        headers = {**tenant.headers, "Idempotency-Key": key}
        answer = client.post(path, json=body, headers=headers)
        assert answer.status_code == 200, answer.get_json()
        again = client.post(path, json=body, headers=headers)
        assert again.get_data() == answer.get_data()  # the retry answers the same
        made: dict[str, Any] = answer.get_json()
        return made

    password = f"first password {uuid.uuid4().hex}"
    made_key = post("/v1/api-keys", {"scopes": ["deposits:read"]}, "key-1")
    post(
        "/v1/members",
        {"email": f"m-{uuid.uuid4().hex[:8]}@example.com", "role": "viewer", "password": password},
        "member-1",
    )
    link = post("/v1/portal-links", {"role": "viewer"}, "link-1")
    token = link["portalLink"]["url"].partition("#")[2]
    # Then none of them is in the idempotency table in plaintext
    records = _records(pg_db, IdempotencyRecord, tenant.api_key_id)
    assert len(records) == 3
    dumped = " ".join(_as_text(r) for r in records)
    for secret in (made_key["secret"], password, token):
        assert secret and secret not in dumped


def test_purge_deletes_expired_records_in_bounded_batches(pg_db: Database) -> None:
    # Given five records older than 24 h and one fresh record, in a scope of their own
    scope = f"purge-{uuid.uuid4().hex[:12]}"
    now = utcnow()
    with pg_db.transaction() as session:
        for n in range(5):
            session.add(
                NotifierIdempotencyRecord(
                    scope=scope,
                    key=f"old-{n}",
                    request_hash="x",
                    created_at=now - timedelta(hours=24, minutes=n + 1),
                )
            )
        session.add(
            NotifierIdempotencyRecord(
                scope=scope, key="fresh", request_hash="x", created_at=now - timedelta(hours=23)
            )
        )

    # When the purge runs with a batch of 2 (other tests' old records may go too)
    removed = [idempotency.purge_expired(pg_db, NotifierIdempotencyRecord, limit=2)]
    while removed[-1] == 2:
        removed.append(idempotency.purge_expired(pg_db, NotifierIdempotencyRecord, limit=2))

    # Then no round deleted more than its batch, every expired record went, the fresh stayed
    assert removed[0] == 2 and all(n <= 2 for n in removed)
    left = _records(pg_db, NotifierIdempotencyRecord, scope)
    assert [r.key for r in left] == ["fresh"]


def test_an_api_process_purges_expired_records_after_answering(
    notifier_app: Flask, notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given a tenant's record from yesterday (25 h old)
    tenant = make_tenant(pg_db)
    old_headers = {**tenant.headers, "Idempotency-Key": "yesterday"}
    body = {"name": "Ledger", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}
    assert notifier_client.post(ENDPOINTS, json=body, headers=old_headers).status_code == 200
    _backdate(pg_db, NotifierIdempotencyRecord, tenant.api_key_id, hours=25)
    store: idempotency.IdempotencyStore = notifier_app.extensions[idempotency.APP_STORE]
    store._next_purge = 0.0  # the minute since this process last purged has passed

    # When any idempotent request is answered
    other = make_tenant(pg_db)
    answer = notifier_client.post(
        ENDPOINTS, json=body, headers={**other.headers, "Idempotency-Key": "today"}
    )
    answer.close()

    # Then the expired record is gone, and the fresh one is kept
    assert answer.status_code == 200
    assert _records(pg_db, NotifierIdempotencyRecord, tenant.api_key_id) == []
    assert len(_records(pg_db, NotifierIdempotencyRecord, other.api_key_id)) == 1
    # And the next answer within the minute does not purge again
    assert not store.purge_due()


def test_a_key_older_than_24_hours_is_new_again(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given an endpoint created with a key yesterday
    tenant = make_tenant(pg_db)
    headers = {**tenant.headers, "Idempotency-Key": "reused-daily"}
    body = {"name": "Ledger", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}
    first = notifier_client.post(ENDPOINTS, json=body, headers=headers).get_json()
    _backdate(pg_db, NotifierIdempotencyRecord, tenant.api_key_id, hours=24.01)
    # When the key comes again, Then it acts anew (no replay of yesterday's secret)
    second = notifier_client.post(ENDPOINTS, json=body, headers=headers)
    assert second.headers.get("Idempotent-Replayed") is None
    assert second.get_json()["secret"] != first["secret"]


def test_a_record_sealed_under_another_key_is_refused_not_run_again(
    notifier_client: FlaskClient, pg_db: Database
) -> None:
    # Given a completed record that does not open with the current SETTLE_SECRET_KEY
    tenant = make_tenant(pg_db)
    headers = {**tenant.headers, "Idempotency-Key": "before-key-change"}
    body = {"name": "Ledger", "url": PUBLIC_URL, "eventTypes": ["deposit.credited"]}
    assert notifier_client.post(ENDPOINTS, json=body, headers=headers).status_code == 200
    foreign = SecretBox("another-secret-key", salt=idempotency.BOX_SALT).encrypt("{}")
    with pg_db.transaction() as session:
        session.execute(
            sa.update(NotifierIdempotencyRecord)
            .where(NotifierIdempotencyRecord.scope == tenant.api_key_id)
            .values(response_body=foreign)
        )
    # When the request is retried, Then it is a 409 (acting twice would make a 2nd endpoint)
    retry = notifier_client.post(ENDPOINTS, json=body, headers=headers)
    assert retry.status_code == 409 and retry.get_json()["code"] == "conflict"
    listed = notifier_client.get(ENDPOINTS, headers=tenant.headers).get_json()
    assert len(listed["webhookEndpoints"]) == 1
