"""Two-factor sign-in: enrol with a code, sign in with one (once), recovery codes (once
each), an owner's requirement, secrets encrypted at rest, guessing throttled."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pyotp
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from services.core.context import CoreContext
from shared.db import Database
from shared.identity import mfa
from shared.identity.models import Member, PortalSession, RecoveryCode
from shared.identity.secrets import token_hash
from shared.timefmt import utcnow
from tests.conftest import PASSWORD, SignedIn, TenantKeys
from tests.integration.conftest import assert_error
from tests.integration.notifier_fixtures import (  # noqa: F401  (fixtures)
    notifier_app_fixture,
    notifier_context_fixture,
)
from tests.integration.test_signin_guard import production_like_app

pytestmark = pytest.mark.integration


def ok(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.get_data(as_text=True))
    return response.get_json() if response.data else None


def next_code(secret: str, steps: int = 1) -> str:
    """The code of a later time step (the one of now may be the one used already)."""
    return pyotp.TOTP(secret).at(time.time() + 30 * steps)


def enrol(app: Flask, member: SignedIn) -> tuple[str, list[str]]:
    """Turn the member's two-factor sign-in on; (its secret, its recovery codes)."""
    client = member.client(app)
    enrolment = ok(client.post("/v1/me/mfa/enrolment", headers=member.headers))["enrolment"]
    secret = enrolment["secret"]
    body = ok(
        client.post(
            "/v1/me/mfa/enrolment/confirm",
            json={"code": pyotp.TOTP(secret).now()},
            headers=member.headers,
        )
    )
    return secret, body["recoveryCodes"]


def sign_in(client: FlaskClient, email: str, **extra: str) -> Any:
    return client.post("/v1/sessions", json={"email": email, "password": PASSWORD, **extra})


def test_enrolment_shows_a_qr_code_and_an_otpauth_url_and_keeps_the_secret_sealed(
    core_app: Flask, core_context: CoreContext, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a signed-in member
    member = tenant.signed_in("developer")
    client = member.client(core_app)
    # When they start enrolling
    enrolment = ok(client.post("/v1/me/mfa/enrolment", headers=member.headers))["enrolment"]
    # Then the otpauth URL names Settle, the member and the secret; the QR code is an SVG
    url = urlparse(enrolment["otpauthUrl"])
    assert (url.scheme, url.netloc) == ("otpauth", "totp")
    assert parse_qs(url.query)["secret"] == [enrolment["secret"]]
    assert parse_qs(url.query)["issuer"] == ["Settle"]
    assert member.email in enrolment["otpauthUrl"].replace("%40", "@")
    assert enrolment["qrCode"].startswith("data:image/svg+xml")
    # And nothing is on until a code confirms it; a wrong code changes nothing
    assert ok(client.get("/v1/me/mfa"))["mfa"]["enabled"] is False
    wrong = client.post(
        "/v1/me/mfa/enrolment/confirm", json={"code": "000000"}, headers=member.headers
    )
    if pyotp.TOTP(enrolment["secret"]).verify("000000", valid_window=1):
        pytest.skip("000000 happens to be the code now")
    assert_error(wrong, 400, "invalid_request")
    body = ok(
        client.post(
            "/v1/me/mfa/enrolment/confirm",
            json={"code": pyotp.TOTP(enrolment["secret"]).now()},
            headers=member.headers,
        )
    )
    assert body["mfa"]["enabled"] is True and body["mfa"]["recoveryCodesLeft"] == 10
    codes = body["recoveryCodes"]
    assert len(codes) == 10 == len(set(codes))
    # And at rest: the secret only encrypted, the recovery codes only hashed
    with pg_db.reader() as session:
        stored = session.get(Member, member.member_id)
        assert stored is not None and stored.totp_secret is not None
        assert enrolment["secret"] not in stored.totp_secret
        box = mfa.secret_box(core_context.config.secret_key)
        assert box.decrypt(stored.totp_secret) == enrolment["secret"]
        hashes = set(
            session.scalars(
                sa.select(RecoveryCode.code_hash).where(RecoveryCode.member_id == member.member_id)
            )
        )
    assert not hashes & set(codes)
    assert {token_hash(c.replace("-", "")) for c in codes} == hashes
    # And enrolling again while it is on is refused
    again = client.post("/v1/me/mfa/enrolment", headers=member.headers)
    assert_error(again, 409, "conflict")


def test_sign_in_asks_for_the_code_and_each_code_works_once(
    core_app: Flask, tenant: TenantKeys
) -> None:
    # Given a member with two-factor sign-in
    member = tenant.signed_in("viewer")
    secret, recovery = enrol(core_app, member)
    client = core_app.test_client()
    # When they sign in with the password alone: 401 mfa_required, no cookie
    bare = sign_in(client, member.email)
    assert_error(bare, 401, "mfa_required")
    assert not bare.headers.getlist("Set-Cookie")
    # A wrong code: 401 unauthorized
    wrong = "123456" if next_code(secret) != "123456" else "654321"
    assert_error(sign_in(client, member.email, code=wrong), 401, "unauthorized")
    # The right code (the password wrong): still 401, the password comes first
    assert_error(
        client.post(
            "/v1/sessions",
            json={"email": member.email, "password": "not it at all", "code": next_code(secret)},
        ),
        401,
        "unauthorized",
    )
    # Then the password and a code sign in, once: the same code again is refused
    code = next_code(secret)
    signed = ok(sign_in(client, member.email, code=code))["session"]
    assert signed["mfaEnabled"] is True and signed["stepUpExpiresAt"]
    assert_error(sign_in(core_app.test_client(), member.email, code=code), 401, "unauthorized")
    # And a recovery code signs in once (any case, spaces or dashes); a second use fails
    first = recovery[0]
    ok(sign_in(core_app.test_client(), member.email, code=first.upper().replace("-", " ")))
    assert_error(sign_in(core_app.test_client(), member.email, code=first), 401, "unauthorized")
    left = ok(member.client(core_app).get("/v1/me/mfa"))["mfa"]["recoveryCodesLeft"]
    assert left == 9


def test_new_recovery_codes_replace_the_old_and_turning_it_off_needs_no_code(
    core_app: Flask, tenant: TenantKeys
) -> None:
    member = tenant.signed_in("viewer")
    _, old = enrol(core_app, member)
    client = member.client(core_app)
    new = ok(client.post("/v1/me/mfa/recovery-codes", headers=member.headers))["recoveryCodes"]
    assert not set(new) & set(old)
    assert_error(sign_in(core_app.test_client(), member.email, code=old[1]), 401, "unauthorized")
    ok(sign_in(core_app.test_client(), member.email, code=new[1]))
    # Turned off, the password alone signs in again
    ok(client.delete("/v1/me/mfa", headers=member.headers), 204)
    ok(sign_in(core_app.test_client(), member.email))


def test_an_owner_requires_it_and_members_without_it_enrol_first(
    core_app: Flask, tenant: TenantKeys
) -> None:
    owner = tenant.signed_in("owner")
    developer = tenant.signed_in("developer")
    path = f"/v1/tenants/{tenant.tenant_id}/security"
    owner_client = owner.client(core_app)
    # An owner without a second factor cannot require one
    refused = owner_client.put(path, json={"requireMfa": True}, headers=owner.headers)
    assert_error(refused, 409, "conflict")
    # Nor can an admin
    admin = tenant.signed_in("admin")
    assert_error(
        admin.client(core_app).put(path, json={"requireMfa": True}, headers=admin.headers),
        403,
        "forbidden",
    )
    # An owner with one can (a JSON boolean only: 0 or "yes" is a 400)
    enrol(core_app, owner)
    for wrong in (0, 1, "true", None):
        bad = owner_client.put(path, json={"requireMfa": wrong}, headers=owner.headers)
        assert_error(bad, 400, "invalid_request")
    assert ok(owner_client.put(path, json={"requireMfa": True}, headers=owner.headers)) == {
        "security": {"requireMfa": True}
    }
    # Then a member without one reaches only their session and the enrolment ...
    dev = developer.client(core_app)
    assert_error(dev.get("/v1/deposit-accounts"), 403, "mfa_enrolment_required")
    assert ok(dev.get("/v1/sessions/current"))["session"]["mfaEnrolmentRequired"] is True
    # ... and once enrolled, everything again
    enrol(core_app, developer)
    ok(dev.get("/v1/deposit-accounts"))
    assert ok(dev.get("/v1/sessions/current"))["session"]["mfaEnrolmentRequired"] is False
    # And while it is required, nobody turns their own off; API keys are not affected
    assert_error(dev.delete("/v1/me/mfa", headers=developer.headers), 409, "conflict")
    ok(core_app.test_client().get("/v1/deposit-accounts", headers=tenant.headers))


def test_the_requirement_holds_on_the_notifier_too(
    core_app: Flask, notifier_app: Flask, tenant: TenantKeys
) -> None:
    owner = tenant.signed_in("owner")
    enrol(core_app, owner)
    ok(
        owner.client(core_app).put(
            f"/v1/tenants/{tenant.tenant_id}/security",
            json={"requireMfa": True},
            headers=owner.headers,
        )
    )
    member = tenant.signed_in("developer")
    response = member.client(notifier_app).get("/v1/webhook-endpoints")
    assert_error(response, 403, "mfa_enrolment_required")


def test_guessing_codes_is_throttled_per_account_from_any_address(
    pg_url: str, pg_db: Database, tmp_path: Path, core_app: Flask, tenant: TenantKeys
) -> None:
    # Given a member with two-factor sign-in, and core configured as in production
    member = tenant.signed_in("viewer")
    secret, _ = enrol(core_app, member)
    app = production_like_app(pg_url, pg_db, tmp_path)
    client = app.test_client()

    def attempt(code: str, n: int) -> Any:
        return client.post(
            "/v1/sessions",
            json={"email": member.email, "password": PASSWORD, "code": code},
            environ_base={"REMOTE_ADDR": f"198.51.100.{n}"},  # a new address every time
        )

    right = next_code(secret)
    wrong = "000000" if right != "000000" else "111111"
    # When someone with the password guesses codes, each from a new address
    for n in range(5):
        assert_error(attempt(wrong, n), 401, "unauthorized")
    # Then the account's codes wait: even the right one now (no code is checked)
    throttled = attempt(right, 99)
    assert_error(throttled, 429, "rate_limited")
    assert int(throttled.headers["Retry-After"]) >= 1


def test_a_code_cannot_be_used_twice_at_once(
    core_app: Flask, core_context: CoreContext, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a member's code checked by four transactions at once (what racing sign-ins do)
    member = tenant.signed_in("viewer")
    secret, recovery = enrol(core_app, member)
    box = mfa.secret_box(core_context.config.secret_key)
    start = threading.Barrier(4)

    def race(code: str, results: list[bool]) -> None:
        with pg_db.transaction() as session:
            row = session.get(Member, member.member_id)
            assert row is not None
            start.wait()
            results.append(mfa.use_second_factor(session, row, box, code).ok)

    for code in (next_code(secret), recovery[0]):
        results: list[bool] = []
        threads = [threading.Thread(target=race, args=(code, results)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # Then exactly one of them takes it
        assert sorted(results) == [False, False, False, True], code


def test_an_admin_resets_a_lost_second_factor(core_app: Flask, tenant: TenantKeys) -> None:
    member = tenant.signed_in("developer")
    enrol(core_app, member)
    admin = tenant.signed_in("admin")
    path = f"/v1/members/{member.member_id}/mfa"
    ok(admin.client(core_app).delete(path, headers=admin.headers), 204)
    ok(sign_in(core_app.test_client(), member.email))
    # another tenant's member is 404, as one that does not exist
    assert_error(
        admin.client(core_app).delete(
            f"/v1/members/mem_{uuid.uuid4().hex}/mfa", headers=admin.headers
        ),
        404,
        "not_found",
    )


def test_a_member_who_must_enrol_steps_up_first_when_their_sign_in_is_old(
    core_app: Flask, pg_db: Database, tenant: TenantKeys
) -> None:
    # Given a tenant that requires a second factor, and a member signed in long ago
    owner = tenant.signed_in("owner")
    enrol(core_app, owner)
    path = f"/v1/tenants/{tenant.tenant_id}/security"
    ok(owner.client(core_app).put(path, json={"requireMfa": True}, headers=owner.headers))
    member = tenant.signed_in("viewer")
    with pg_db.transaction() as session:
        session.execute(
            sa.update(PortalSession)
            .where(PortalSession.member_id == member.member_id)
            .values(factor_at=utcnow() - timedelta(minutes=6))
        )
    client = member.client(core_app)
    # When they start enrolling: a fresh password first
    assert_error(
        client.post("/v1/me/mfa/enrolment", headers=member.headers), 403, "step_up_required"
    )
    stepped = client.post(
        "/v1/sessions/current/step-up", json={"password": PASSWORD}, headers=member.headers
    )
    assert stepped.status_code == 200, stepped.get_json()
    # Then they can enrol, and everything opens
    enrol(core_app, member)
    ok(client.get("/v1/deposit-accounts"))
