"""The floor for POST /v1/deposit-accounts: its irreducible work and nothing else.

Not a service: a reference point for bench/core_api.py. Served like core (same
gunicorn settings, same PostgreSQL database and schema), it does only what the
endpoint cannot skip without changing what it promises:

- authenticate the Bearer key with one indexed query per request (revocation must
  apply to the very next request, so no cache);
- derive the deposit addresses with core's deriver (bip-utils' BIP32 CKDpub and address
  encoder: one per chain for a root key, one for every chain for a bip44 key);
- insert the account (destination copied from the policy), its addresses and the
  `deposit.account.created` outbox row in ONE statement, committed on its own
  (autocommit: a single statement is atomic, so no BEGIN/COMMIT round trips);
- answer 201 with a JSON body.

No flask-smorest, marshmallow, SQLAlchemy, idempotency, rate limiting or metadata
handling: raw psycopg on one autocommit connection per thread (two round trips per
request), account keys preallocated from the sequence in blocks so the addresses
can be derived before the single INSERT.
Whatever core spends above this is framework and bookkeeping; this line shows how
far the ratio could go with none of it.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from typing import Any

import psycopg
from flask import Flask, Response, request

from services.core.addresses import AddressDeriver
from shared.events import encode, envelope
from shared.identity.secrets import token_hash
from shared.ids import new_id
from shared.timefmt import iso_ms, utcnow

app = Flask("floor")
_DSN = os.environ.get("SETTLE_DATABASE_URL", "").replace("postgresql+psycopg://", "postgresql://")
_XPUB = os.environ.get("SETTLE_DEPOSIT_XPUB", "")
_CHAINS = ((1, 0), (137, 1), (8453, 2))  # (chain id, position)
_KEY = "SELECT k.id, k.tenant_id FROM api_keys k WHERE k.key_hash = %s AND k.revoked_at IS NULL"
_PKS = "SELECT nextval('deposit_accounts_pk_seq') FROM generate_series(1, 64)"
_CREATE = """
WITH account AS (
  INSERT INTO deposit_accounts (pk, id, tenant_id, external_user_id, status, dest_chain_id,
    dest_address, dest_token_address, dest_set_by_key_id, metadata, created_at, updated_at)
  SELECT %(pk)s, %(id)s, p.tenant_id, %(user)s, 'active', p.chain_id, p.address,
    p.token_address, %(key_id)s, '{}'::jsonb, %(now)s, %(now)s
  FROM destination_policies p WHERE p.tenant_id = %(tenant)s::varchar
  RETURNING pk),
addresses AS (
  INSERT INTO deposit_addresses (account_pk, chain_id, address, position)
  SELECT account.pk, a.chain_id, a.address, a.position FROM account,
    (VALUES (1, %(a1)s, 0), (137, %(a137)s, 1), (8453, %(a8453)s, 2))
      AS a(chain_id, address, position)),
event AS (
  INSERT INTO outbox (event_id, event_type, tenant_id, body, created_at)
  SELECT %(event_id)s, 'deposit.account.created', %(tenant)s::varchar, %(body)s, %(now)s
  FROM account)
SELECT pk FROM account
"""


class _Thread(threading.local):
    conn: psycopg.Connection[Any] | None = None
    pks: deque[int]

    def __init__(self) -> None:
        self.pks = deque()


_local = _Thread()
_deriver: list[AddressDeriver] = []


def _connection() -> psycopg.Connection[Any]:
    if _local.conn is None:
        _local.conn = psycopg.connect(_DSN, autocommit=True)
    return _local.conn


@app.post("/v1/deposit-accounts")
def create() -> Response:
    if not _deriver:
        _deriver.append(AddressDeriver(_XPUB))
    conn = _connection()
    token = request.headers.get("Authorization", "").partition(" ")[2]
    key = conn.execute(_KEY, (token_hash(token),)).fetchone()
    if key is None:
        return Response(b'{"error":"unauthorized"}', status=401, mimetype="application/json")
    key_id, tenant_id = key
    body = json.loads(request.get_data())
    if not _local.pks:
        _local.pks.extend(row[0] for row in conn.execute(_PKS))
    pk = _local.pks.popleft()
    addresses = dict(_deriver[0].addresses(pk, [chain_id for chain_id, _ in _CHAINS]))
    now = utcnow()
    account = {
        "id": new_id("acc"),
        "externalUserId": body["externalUserId"],
        "status": "active",
        "depositAddresses": [{"chainId": c, "address": a} for c, a in addresses.items()],
        "metadata": {},
        "createdAt": iso_ms(now),
        "updatedAt": iso_ms(now),
    }
    event = envelope("deposit.account.created", tenant_id, {"depositAccount": account})
    conn.execute(
        _CREATE,
        {
            "pk": pk,
            "id": account["id"],
            "user": account["externalUserId"],
            "key_id": key_id,
            "tenant": tenant_id,
            "now": now,
            "a1": addresses[1],
            "a137": addresses[137],
            "a8453": addresses[8453],
            "event_id": event["id"],
            "body": encode(event).decode(),
        },
    )
    return Response(
        json.dumps({"depositAccount": account}), status=201, mimetype="application/json"
    )
