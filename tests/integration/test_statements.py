"""GET /v1/statements and GET /v1/statements/key on PostgreSQL.

The signature is verified with `cryptography` alone, as a tenant's auditor would: the
public key from GET /v1/statements/key, the signature from the response header, the
exact body bytes. No Settle code takes part in a verification.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import io
import json
import secrets
import threading
import time
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from flask.testing import FlaskClient

from services.core.api.statements import SLOTS
from services.core.app import create_app
from services.core.context import CoreContext
from services.core.deposits.models import Deposit
from services.core.statements import queries
from services.core.statements.settings import StatementSettings
from shared.db import Database
from shared.timefmt import iso_ms, parse_iso, utcnow
from tests.conftest import TenantKeys
from tests.integration import test_sandbox as sandbox
from tests.integration.test_deposit_source_block import credit_a_sandbox_deposit
from tests.support.deposits import AccountRef, make_account

pytestmark = pytest.mark.integration

USDC_ETH = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"
USDT_ETH = "0xdAC17F958D2ee523a2206206994597C13D831ec7"
USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
WALLET = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
#: Accounts of these tests settle to USDC on Base (the real chains file's chains).
TO_BASE: dict[str, Any] = {"dest_chain_id": 8453, "dest_token_address": USDC_BASE}
TOKENS = {(1, "USDC"): USDC_ETH, (1, "USDT"): USDT_ETH, (8453, "USDC"): USDC_BASE}

sandbox_tenant, account = sandbox.sandbox_tenant, sandbox.account


# -- what an auditor does, with cryptography alone -----------------------------------


def public_key(client: FlaskClient) -> tuple[str, Ed25519PublicKey]:
    """The key id and public key GET /v1/statements/key publishes (no credentials)."""
    response = client.get("/v1/statements/key")
    assert response.status_code == 200, response.get_json()
    key = response.get_json()["key"]
    raw = Ed25519PublicKey.from_public_bytes(base64.b64decode(key["publicKey"]))
    pem = load_pem_public_key(key["publicKeyPem"].encode())
    assert isinstance(pem, Ed25519PublicKey) and pem.public_bytes_raw() == raw.public_bytes_raw()
    return key["keyId"], raw


def verifies(key: Ed25519PublicKey, body: bytes, signature_b64: str) -> bool:
    try:
        key.verify(base64.b64decode(signature_b64), body)
    except InvalidSignature:
        return False
    return True


# -- deposits, as rows of the real table ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class Made:
    id: str
    chain_id: int
    asset: str
    amount_raw: int
    amount_usd: Decimal
    fee_usd: Decimal
    net_usd: Decimal
    credited_at: datetime | None


def insert_deposit(
    db: Database,
    account: AccountRef,
    *,
    chain_id: int = 1,
    asset: str = "USDC",
    amount: str = "10.00",
    fee: str = "0.25",
    credited_at: datetime | None,
    status: str = "credited",
    sandbox: bool = False,
) -> Made:
    """A deposit row as the pipeline leaves it (credited at `credited_at`, or not)."""
    raw = int(Decimal(amount).scaleb(6))
    usd, fee_usd = Decimal(amount), Decimal(fee)
    created = (credited_at or utcnow()) - timedelta(minutes=3)
    deposit = Deposit(
        id="dep_" + secrets.token_hex(13).upper(),
        tenant_id=account.tenant_id,
        account_pk=account.pk,
        account_id=account.id,
        external_user_id=account.external_user_id,
        status=status,
        chain_id=chain_id,
        deposit_address=account.address(chain_id),
        asset=asset,
        token_address=TOKENS[(chain_id, asset)],
        decimals=6,
        amount_raw=str(raw),
        amount_usd=usd,
        fee_usd=fee_usd,
        net_usd=usd - fee_usd,
        source_tx_hash="0x" + secrets.token_hex(32),
        log_index=0,
        transfer_seq=0,
        block_number=1000 + secrets.randbelow(10**6),
        block_hash="0x" + secrets.token_hex(32),
        confirmations=12,
        required_confirmations=12,
        dest_chain_id=8453,
        dest_address=WALLET,
        dest_token_address=USDC_BASE,
        route="direct" if credited_at else None,
        credit_amount=str(usd - fee_usd) if credited_at else None,
        credit_tx_hash="0x" + secrets.token_hex(32) if credited_at else None,
        sandbox=sandbox,
        created_at=created,
        updated_at=credited_at or created,
        confirmed_at=created,
        credited_at=credited_at,
    )
    with db.transaction() as session:
        session.add(deposit)
    return Made(deposit.id, chain_id, asset, raw, usd, fee_usd, usd - fee_usd, credited_at)


def q(at: datetime) -> str:
    return iso_ms(at).replace("+", "%2B")


def get_statement(
    client: FlaskClient, headers: dict[str, str], start: datetime, end: datetime, extra: str = ""
) -> Any:
    return client.get(f"/v1/statements?from={q(start)}&to={q(end)}{extra}", headers=headers)


def no_floats(text: bytes) -> Any:
    def refuse(value: str) -> Any:
        raise AssertionError(f"a float in a statement: {value}")

    return json.loads(text, parse_float=refuse)


@dataclasses.dataclass
class Books:
    """A tenant's deposits around a period: before it, in it, after it, never credited."""

    start: datetime
    end: datetime
    before: list[Made]
    inside: list[Made]
    others: list[Made]


@pytest.fixture
def books(pg_db: Database, core_context: CoreContext, tenant: TenantKeys) -> Books:
    registry = core_context.registry
    alice = make_account(pg_db, tenant.tenant_id, registry, external_user_id="alice", **TO_BASE)
    bob = make_account(pg_db, tenant.tenant_id, registry, external_user_id="bob", **TO_BASE)
    start = utcnow().replace(microsecond=0) - timedelta(days=20)
    end = start + timedelta(days=10)
    before = [
        insert_deposit(pg_db, alice, amount="100.00", credited_at=start - timedelta(days=3)),
        insert_deposit(
            pg_db, bob, amount="0.000001", fee="0", credited_at=start - timedelta(days=1)
        ),
        insert_deposit(
            pg_db,
            bob,
            chain_id=8453,
            amount="7.50",
            fee="0.01",
            credited_at=start - timedelta(milliseconds=1),
        ),
    ]
    inside = [
        insert_deposit(pg_db, alice, amount="125.50", credited_at=start),  # `from` is inclusive
        insert_deposit(
            pg_db, bob, amount="0.10", fee="0.09", credited_at=start + timedelta(hours=5)
        ),
        insert_deposit(
            pg_db,
            alice,
            chain_id=8453,
            amount="33.333333",
            fee="0.012345",
            credited_at=start + timedelta(days=2),
        ),
        insert_deposit(
            pg_db,
            bob,
            asset="USDT",
            amount="999999.99",
            fee="1.5",
            credited_at=start + timedelta(days=4),
        ),
        insert_deposit(
            pg_db, alice, amount="1.00", fee="0.5", credited_at=end - timedelta(milliseconds=1)
        ),
    ]
    others = [
        insert_deposit(pg_db, alice, amount="50.00", credited_at=end),  # `to` is exclusive
        insert_deposit(pg_db, bob, amount="60.00", credited_at=end + timedelta(days=1)),
        insert_deposit(pg_db, alice, amount="70.00", credited_at=None, status="source_confirmed"),
        insert_deposit(pg_db, bob, amount="80.00", credited_at=None, status="failed"),
        insert_deposit(
            pg_db, alice, amount="90.00", credited_at=start + timedelta(days=1), sandbox=True
        ),
    ]
    return Books(start, end, before, inside, others)


def expected_figures(made: list[Made], chain_id: int, asset: str) -> dict[str, Any]:
    mine = [m for m in made if (m.chain_id, m.asset) == (chain_id, asset)]
    return {
        "deposits": len(mine),
        "amount": sum((Decimal(m.amount_raw).scaleb(-6) for m in mine), Decimal(0)),
        "amountUsd": sum((m.amount_usd for m in mine), Decimal(0)),
        "settlementGasFeeUsd": sum((m.fee_usd for m in mine), Decimal(0)),
        "netAmountUsd": sum((m.net_usd for m in mine), Decimal(0)),
    }


def as_decimals(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: v if k == "deposits" else Decimal(v) for k, v in figures.items()}


# -- the statement -------------------------------------------------------------------


def test_a_statement_lists_the_periods_credits_signed_and_its_totals_add_up(
    client: FlaskClient, tenant: TenantKeys, books: Books
) -> None:
    # When the tenant asks for the period's statement
    response = get_statement(client, tenant.headers, books.start, books.end)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    body = response.get_data()
    # Then an auditor verifies it with the published key and cryptography alone
    key_id, key = public_key(client)
    assert verifies(key, body, response.headers["x-service-statement-signature"])
    assert response.headers["x-service-statement-key-id"] == key_id
    statement = no_floats(body)["statement"]
    assert statement["keyId"] == key_id and statement["tenantId"] == tenant.tenant_id
    assert (statement["from"], statement["to"]) == (iso_ms(books.start), iso_ms(books.end))
    assert statement["sandbox"] is False
    # And it lists exactly the deposits credited in [from, to), oldest credit first
    assert [d["id"] for d in statement["deposits"]] == [m.id for m in books.inside]
    first = statement["deposits"][0]
    assert (first["amount"], first["amountUsd"], first["netAmountUsd"]) == (
        "125.50",
        "125.50",
        "125.25",
    )
    assert first["settlementGasFeeUsd"] == "0.25" and first["creditAmount"] == "125.25"
    assert first["sourceTxHash"].startswith("0x") and first["creditTxHash"].startswith("0x")
    assert isinstance(first["sourceBlockNumber"], int) and len(first["sourceBlockHash"]) == 66
    # And per chain and token: the opening totals are what was credited before `from`,
    # the period's are the sum of the deposits listed, and closing = opening + period
    tokens = [(t["chainId"], t["asset"]) for t in statement["totals"]]
    assert tokens == [(1, "USDC"), (1, "USDT"), (8453, "USDC")]
    for totals in statement["totals"]:
        chain_id, asset = totals["chainId"], totals["asset"]
        assert totals["tokenAddress"] == TOKENS[(chain_id, asset)]
        opening, period, closing = (
            as_decimals(totals[k]) for k in ("opening", "period", "closing")
        )
        assert opening == expected_figures(books.before, chain_id, asset)
        assert period == expected_figures(books.inside, chain_id, asset)
        listed = [d for d in statement["deposits"] if d["tokenAddress"] == totals["tokenAddress"]]
        assert period["deposits"] == len(listed)
        for field in ("amount", "amountUsd", "settlementGasFeeUsd", "netAmountUsd"):
            assert period[field] == sum((Decimal(d[field]) for d in listed), Decimal(0))
            assert closing[field] == opening[field] + period[field]
        assert closing["deposits"] == opening["deposits"] + period["deposits"]
    # And the exact decimals survive: a micro-unit opening, a six-decimal fee
    base = next(t for t in statement["totals"] if t["chainId"] == 8453)
    assert base["period"]["settlementGasFeeUsd"] == "0.012345"
    assert base["period"]["amount"] == "33.333333"
    eth = next(t for t in statement["totals"] if t["asset"] == "USDC" and t["chainId"] == 1)
    assert eth["opening"]["amount"] == "100.000001"


def test_a_tampered_byte_fails_verification(
    client: FlaskClient, tenant: TenantKeys, books: Books
) -> None:
    # Given a signed statement, in both formats
    _, key = public_key(client)
    for extra in ("", "&format=csv"):
        response = get_statement(client, tenant.headers, books.start, books.end, extra)
        body, signature = response.get_data(), response.headers["x-service-statement-signature"]
        assert verifies(key, body, signature)
        # When one byte changes anywhere (a digit of an amount, the first, the last)
        amount_at = body.index(b"125.50")
        for at in (0, amount_at, amount_at + 3, len(body) - 1):
            tampered = bytearray(body)
            tampered[at] ^= 0x01
            # Then the signature no longer verifies
            assert not verifies(key, bytes(tampered), signature), at
        # Nor with a byte added or removed
        assert not verifies(key, body + b" ", signature)
        assert not verifies(key, body[:-1], signature)
        # Nor does another statement's signature vouch for these bytes
        other = get_statement(client, tenant.headers, books.start, books.end - timedelta(days=1))
        assert not verifies(key, body, other.headers["x-service-statement-signature"])


def test_the_csv_is_the_same_statement_and_safe_in_a_spreadsheet(
    pg_db: Database, core_context: CoreContext, client: FlaskClient, tenant: TenantKeys
) -> None:
    # Given credits of users whose ids a spreadsheet would run as formulas
    start = utcnow() - timedelta(days=2)
    hostile = ['=HYPERLINK("http://x","y")', "+1+1", "-2", "@SUM(A1)", "plain"]
    for n, name in enumerate(hostile):
        account = make_account(
            pg_db, tenant.tenant_id, core_context.registry, external_user_id=name, **TO_BASE
        )
        insert_deposit(pg_db, account, amount=f"{n + 1}.25", credited_at=start + timedelta(hours=n))
    end = start + timedelta(days=1)
    # When the tenant asks for CSV (by `format`, and by Accept alone)
    by_format = get_statement(client, tenant.headers, start, end, "&format=csv")
    by_accept = client.get(
        f"/v1/statements?from={q(start)}&to={q(end)}",
        headers={**tenant.headers, "Accept": "text/csv"},
    )
    as_json = get_statement(client, tenant.headers, start, end)
    for response in (by_format, by_accept):
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.headers["Content-Type"] == "text/csv; charset=utf-8; header=present"
        assert response.headers["Content-Disposition"].startswith("attachment; filename=")
    _, key = public_key(client)
    body = by_format.get_data()
    assert verifies(key, body, by_format.headers["x-service-statement-signature"])
    # Then it is one RFC 4180 table (CRLF) whose `record` column says what each row is
    assert body.endswith(b"\r\n") and b"\n" not in body.replace(b"\r\n", b"")
    rows = list(csv.DictReader(io.StringIO(body.decode("utf-8"), newline="")))
    assert [r["record"] for r in rows] == [
        "statement",
        "opening",
        *["deposit"] * 5,
        "period",
        "closing",
    ]
    head = rows[0]
    statement = as_json.get_json()["statement"]
    assert head["tenant_id"] == tenant.tenant_id and head["key_id"] == statement["keyId"]
    assert (head["period_from"], head["period_to"]) == (statement["from"], statement["to"])
    # And each deposit row holds the JSON's values, exactly as decimal text
    for row, deposit in zip(rows[2:7], statement["deposits"], strict=True):
        assert row["deposit_id"] == deposit["id"]
        assert (
            row["amount"] == deposit["amount"] and row["net_amount_usd"] == deposit["netAmountUsd"]
        )
        assert row["source_tx_hash"] == deposit["sourceTxHash"]
        assert row["source_block_number"] == str(deposit["sourceBlockNumber"])
        assert row["credit_tx_hash"] == deposit["creditTxHash"]
    # And a cell that would be a formula starts with a quote (the JSON keeps the id as is)
    users = [r["external_user_id"] for r in rows[2:7]]
    assert users == ['\'=HYPERLINK("http://x","y")', "'+1+1", "'-2", "'@SUM(A1)", "plain"]
    assert [d["externalUserId"] for d in statement["deposits"]] == hostile
    # And the totals rows carry the JSON's totals
    (totals,) = statement["totals"]
    assert rows[-2]["amount"] == totals["period"]["amount"] == "16.25"
    assert rows[-1]["net_amount_usd"] == totals["closing"]["netAmountUsd"]
    assert rows[-1]["deposits"] == "5"


def test_the_json_matches_its_documented_schema(
    client: FlaskClient, tenant: TenantKeys, books: Books
) -> None:
    from services.core.api.statements import StatementEnvelopeSchema

    body = get_statement(client, tenant.headers, books.start, books.end).get_json()
    # Every field documented, none undocumented (the schema raises on unknown fields)
    StatementEnvelopeSchema().load(body)


def test_an_empty_period_has_opening_equal_to_closing(
    client: FlaskClient, tenant: TenantKeys, books: Books
) -> None:
    start = books.end + timedelta(days=2)
    response = get_statement(client, tenant.headers, start, start + timedelta(hours=1))
    statement = response.get_json()["statement"]
    assert statement["deposits"] == []
    for totals in statement["totals"]:
        assert totals["opening"] == totals["closing"]
        assert totals["period"]["deposits"] == 0 and totals["period"]["amount"] == "0.00"


# -- bounds, limits, isolation -------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("", "from"),
        ("?to=2026-01-01T00:00:00Z", "from"),
        ("?from=yesterday", "from"),
        ("?from=2026-13-01T00:00:00Z", "from"),
        ("?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", "from"),
        ("?from=2026-01-01T00:00:00Z&to=2026-01-01T00:00:00Z", "from"),
        ("?from=2020-01-01T00:00:00Z&to=2021-01-02T00:00:00.001Z", "to"),
        ("?from=2026-01-01T00:00:00Z&to=9999-12-31T00:00:00Z", "to"),
        ("?from=2026-01-01T00:00:00Z&format=xlsx", "format"),
        ("?from=2026-01-01T00:00:00Z&sandbox=maybe", "sandbox"),
        ("?from=2026-01-01T00:00:00Z&form=csv", "form"),
    ],
)
def test_bad_bounds_are_400_naming_the_field(
    client: FlaskClient, tenant: TenantKeys, query: str, field: str
) -> None:
    response = client.get(f"/v1/statements{query}", headers=tenant.headers)
    body = response.get_json()
    assert response.status_code == 400, body
    assert body["code"] == "invalid_request" and body["error"].startswith("invalid_request: ")
    assert field in body["details"]["fields"], body


def test_a_period_that_has_not_ended_is_refused(client: FlaskClient, tenant: TenantKeys) -> None:
    # A statement of a period still running would change after it was signed
    soon = utcnow() + timedelta(minutes=5)
    response = get_statement(client, tenant.headers, soon - timedelta(days=1), soon)
    body = response.get_json()
    assert response.status_code == 400, body
    assert body["details"]["fields"] == {
        "to": ["must not be in the future: a statement covers a period that has ended"]
    }


def test_a_period_of_366_days_is_allowed_and_to_defaults_to_now(
    client: FlaskClient, tenant: TenantKeys
) -> None:
    end = utcnow() - timedelta(days=1)
    response = get_statement(client, tenant.headers, end - timedelta(days=366), end)
    assert response.status_code == 200
    before = utcnow()
    response = client.get(f"/v1/statements?from={q(end)}", headers=tenant.headers)
    statement = response.get_json()["statement"]
    assert before <= datetime.fromisoformat(statement["to"]) <= utcnow()


def test_more_deposits_than_a_statement_lists_is_refused_before_writing(
    core_context: CoreContext, tenant: TenantKeys, books: Books
) -> None:
    # Given a service whose statements list at most 4 deposits
    small = dataclasses.replace(
        core_context,
        config=dataclasses.replace(
            core_context.config, statements=StatementSettings(max_deposits=4)
        ),
    )
    client = create_app(context=small).test_client()
    # When a period holds 5, it is refused with the figures; a shorter one is served
    response = get_statement(client, tenant.headers, books.start, books.end)
    body = response.get_json()
    assert response.status_code == 422, body
    assert body["code"] == "statement_too_large"
    assert body["details"] == {"deposits": 5, "maxDeposits": 4}
    shorter = get_statement(client, tenant.headers, books.start, books.end - timedelta(days=1))
    assert shorter.status_code == 200
    assert len(shorter.get_json()["statement"]["deposits"]) == 4


def test_a_process_makes_a_bounded_number_of_statements_at_once(
    core_context: CoreContext, client: FlaskClient, tenant: TenantKeys
) -> None:
    # Given this process's every statement slot taken (by a statement being made)
    slots = core_context.db.attachment(
        SLOTS, lambda _db: threading.BoundedSemaphore(core_context.config.statements.concurrency)
    )
    start = utcnow() - timedelta(days=1)
    taken = 0
    while slots.acquire(blocking=False):
        taken += 1
    try:
        # When one more is asked for, it is refused at once, to be asked again
        response = get_statement(client, tenant.headers, start, utcnow())
        body = response.get_json()
        assert response.status_code == 503, body
        assert body["code"] == "service_unavailable" and response.headers["Retry-After"] == "5"
        # (bad bounds are still 400: checked before a slot is needed)
        assert get_statement(client, tenant.headers, utcnow(), start).status_code == 400
    finally:
        for _ in range(taken):
            slots.release()
    # Then once a slot is free it is served, and the slot is given back after
    assert taken == core_context.config.statements.concurrency
    assert get_statement(client, tenant.headers, start, utcnow()).status_code == 200
    assert get_statement(client, tenant.headers, start, utcnow()).status_code == 200


def test_a_tenant_sees_only_its_own_deposits(
    pg_db: Database,
    core_context: CoreContext,
    client: FlaskClient,
    tenant: TenantKeys,
    other_tenant: TenantKeys,
    books: Books,
) -> None:
    # Given another tenant with a credit in the same period
    theirs = make_account(pg_db, other_tenant.tenant_id, core_context.registry, **TO_BASE)
    made = insert_deposit(
        pg_db, theirs, amount="5.00", credited_at=books.start + timedelta(hours=1)
    )
    # Then each tenant's statement holds its own deposits and totals only
    mine = get_statement(client, tenant.headers, books.start, books.end).get_json()["statement"]
    assert made.id not in {d["id"] for d in mine["deposits"]}
    other = get_statement(client, other_tenant.headers, books.start, books.end)
    statement = other.get_json()["statement"]
    assert [d["id"] for d in statement["deposits"]] == [made.id]
    assert statement["tenantId"] == other_tenant.tenant_id
    assert [t["closing"]["amount"] for t in statement["totals"]] == ["5.00"]


def test_scopes_and_sessions(client: FlaskClient, core_app: Any, tenant: TenantKeys) -> None:
    start = utcnow() - timedelta(days=1)
    path = f"/v1/statements?from={q(start)}"
    assert client.get(path).status_code == 401
    assert client.get(path, headers=tenant.key_with("webhooks:read")).status_code == 403
    assert client.get(path, headers=tenant.key_with("deposits:read")).status_code == 200
    # A viewer's portal session downloads statements
    viewer = tenant.signed_in("viewer").client(core_app)
    response = viewer.get(path + "&format=csv")
    assert response.status_code == 200 and response.mimetype == "text/csv"
    # The key needs no credentials at all
    assert client.get("/v1/statements/key").status_code == 200


def test_sandbox_deposits_have_statements_of_their_own(
    client: FlaskClient,
    core_context: CoreContext,
    sandbox_tenant: TenantKeys,
    account: AccountRef,
) -> None:
    # Given a sandbox tenant's deposit credited by the real pipeline
    start = utcnow() - timedelta(seconds=1)
    made = credit_a_sandbox_deposit(
        client, core_context, sandbox_tenant, account, minutes_ahead=0.01
    )
    credited = client.get(f"/v1/deposits/{made['id']}", headers=sandbox_tenant.headers)
    deposit = credited.get_json()["deposit"]
    # (the pipeline's clock ran 0.6 s ahead: the statement's period must have ended)
    while utcnow() <= parse_iso(deposit["creditedAt"]):
        time.sleep(0.05)
    end = utcnow()
    # Then the tenant's statement is of sandbox deposits (its default) and holds it
    statement = get_statement(client, sandbox_tenant.headers, start, end).get_json()["statement"]
    assert statement["sandbox"] is True
    (listed,) = statement["deposits"]
    assert listed["id"] == made["id"] and listed["creditedAt"] == deposit["creditedAt"]
    assert listed["sourceBlockHash"] == deposit["sourceBlockHash"]
    assert Decimal(listed["netAmountUsd"]) == Decimal(str(deposit["netAmountUsd"]))
    # And a statement of live deposits never mixes it in
    live = get_statement(client, sandbox_tenant.headers, start, end, "&sandbox=false")
    assert live.get_json()["statement"]["deposits"] == []


def test_a_credit_committed_while_the_statement_is_read_does_not_tear_it(
    pg_db: Database,
    core_context: CoreContext,
    client: FlaskClient,
    tenant: TenantKeys,
    books: Books,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a credit in the period committed after the totals were read, before the rows
    late = make_account(pg_db, tenant.tenant_id, core_context.registry, **TO_BASE)
    real_totals = queries.totals
    committed: list[Made] = []

    def totals_then_a_credit(*args: Any) -> Any:
        found = real_totals(*args)
        worker = threading.Thread(
            target=lambda: committed.append(
                insert_deposit(pg_db, late, credited_at=books.start + timedelta(hours=1))
            )
        )
        worker.start()
        worker.join()
        return found

    monkeypatch.setattr(queries, "totals", totals_then_a_credit)
    # When the statement is made
    response = get_statement(client, tenant.headers, books.start, books.end)
    # Then it is whole: from one snapshot, without the late credit, and its totals add up
    assert response.status_code == 200, response.get_data(as_text=True)
    statement = response.get_json()["statement"]
    assert committed and committed[0].id not in {d["id"] for d in statement["deposits"]}
    assert [d["id"] for d in statement["deposits"]] == [m.id for m in books.inside]
    # And the next statement has it
    monkeypatch.undo()
    again = get_statement(client, tenant.headers, books.start, books.end).get_json()
    assert committed[0].id in {d["id"] for d in again["statement"]["deposits"]}


def test_the_key_is_derived_from_the_secret_key_unless_one_is_set(
    core_context: CoreContext, client: FlaskClient
) -> None:
    def served_key(settings: StatementSettings | None = None, secret: str | None = None) -> Any:
        config = core_context.config
        if settings is not None:
            config = dataclasses.replace(config, statements=settings)
        if secret is not None:
            config = dataclasses.replace(config, secret_key=secret)
        app = create_app(context=dataclasses.replace(core_context, config=config))
        return app.test_client().get("/v1/statements/key").get_json()

    base = served_key()
    # The same SETTLE_SECRET_KEY gives the same key; another gives another key id
    assert served_key() == base
    assert (
        served_key(secret="another-secret-key-" + uuid.uuid4().hex)["key"]["keyId"]
        != (base["key"]["keyId"])
    )
    # A key set explicitly signs instead; the retired one is still published
    seed = secrets.token_bytes(32)
    retired = base64.b64decode(base["key"]["publicKey"])
    chosen = served_key(StatementSettings(signing_key=seed, retired_public_keys=(retired,)))
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    assert base64.b64decode(chosen["key"]["publicKey"]) == public
    assert chosen["retiredKeys"] == [base["key"]]
    assert base["retiredKeys"] == []
