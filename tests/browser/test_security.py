"""Two-factor sign-in, the step-up dialog and the audit log, in Chromium as people use them.

A member enrols an authenticator app with a code computed by `pyotp` (as the phone's
app would), signs in with and without one, spends a recovery code once; a sensitive
change after the 5-minute window shows the change and asks for the password; the Audit
page lists who did what.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import timedelta
from typing import Any

import pyotp
import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

from shared.identity import service as identity
from shared.identity.models import PortalSession
from shared.timefmt import utcnow
from tests.browser.conftest import Portal, loaded, screenshot, sign_in
from tests.conftest import PASSWORD

pytestmark = pytest.mark.browser

DESTINATION = {
    "chainId": 8453,
    "address": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
    "tokenAddress": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
}
NEW_WALLET = "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB"


def new_member(portal: Portal, role: str) -> str:
    """A member of the portal's tenant made for one test (so its settings stay its own)."""
    email = f"{role}-{uuid.uuid4().hex[:8]}@example.com"
    portal.call("POST", "/v1/members", {"email": email, "role": role, "password": PASSWORD})
    return email


def fill_sign_in(page: Any, email: str, password: str = PASSWORD) -> None:
    page.goto("/")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def sign_in_with_code(page: Any, email: str, code: str) -> None:
    """The password, then (asked for it) the code."""
    fill_sign_in(page, email)
    page.get_by_label("Authentication code").wait_for()
    page.get_by_label("Authentication code").fill(code)
    page.get_by_role("button", name="Sign in").click()


def sign_out(page: Any) -> None:
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("heading", name="Sign in to Settle").wait_for()


def age_sessions(portal: Portal, email: str) -> None:
    """The member's sessions last gave a password six minutes ago (past the window)."""
    members = portal.call("GET", "/v1/members?limit=200")["members"]
    member_id = next(m["id"] for m in members if m["email"] == email)
    with portal.db.transaction() as session:
        session.execute(
            sa.update(PortalSession)
            .where(PortalSession.member_id == member_id)
            .values(factor_at=utcnow() - timedelta(minutes=6))
        )


def test_enrol_then_sign_in_with_a_code_and_a_recovery_code_once(page: Any, portal: Portal) -> None:
    # Given a member signed in with their password
    email = new_member(portal, "developer")
    fill_sign_in(page, email)
    page.get_by_role("heading", name="Overview").wait_for()
    # When they set up two-factor sign-in on the Security page
    page.locator("#nav").get_by_role("link", name="Security").click()
    page.get_by_role("heading", name="Security").wait_for()
    loaded(page)
    page.get_by_role("button", name="Set up two-factor sign-in").click()
    page.get_by_role("dialog").get_by_role("button", name="Continue").click()
    qr = page.get_by_role("img", name="QR code of your two-factor secret for an authenticator app")
    qr.wait_for()
    assert qr.get_attribute("src").startswith("data:image/svg+xml")
    secret = page.locator("code.totp-secret").inner_text().strip()
    totp = pyotp.TOTP(secret)
    screenshot(page, "mfa-enrol")
    # (the phone's app computes the code from the scanned secret)
    page.get_by_label("Code from your app").fill(totp.now())
    page.get_by_role("button", name="Turn on").click()
    codes = page.get_by_role("list", name="Recovery codes").locator("li")
    codes.first.wait_for()
    recovery = [c.strip() for c in codes.all_inner_texts()]
    assert len(recovery) == 10
    screenshot(page, "mfa-recovery-codes")
    page.get_by_role("button", name="Done").click()
    page.get_by_text("Recovery codes left: 10").wait_for()
    sign_out(page)

    # Then the password alone no longer signs in: the form asks for a code
    fill_sign_in(page, email)
    assert page.get_by_label("Authentication code").count() == 1
    page.get_by_role("alert").filter(
        has_text="Enter the code from your authenticator app"
    ).wait_for()
    assert page.get_by_role("heading", name="Sign in to Settle").is_visible()
    # And with a code (the next one: the one used to turn it on is spent) it signs in
    page.get_by_label("Authentication code").fill(totp.at(time.time() + 30))
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Overview").wait_for()
    sign_out(page)

    # And a recovery code signs in once ...
    sign_in_with_code(page, email, recovery[0])
    page.get_by_role("heading", name="Overview").wait_for()
    sign_out(page)
    # ... and a second time it fails
    sign_in_with_code(page, email, recovery[0])
    page.get_by_role("alert").filter(has_text="The code is wrong or was used already").wait_for()
    assert page.get_by_role("heading", name="Sign in to Settle").is_visible()


def test_a_destination_change_after_five_minutes_asks_for_the_password(
    page: Any, portal: Portal
) -> None:
    # Given an account on Base, and a developer whose password was given 6 minutes ago
    user = f"stepup-{uuid.uuid4().hex[:8]}"
    portal.call(
        "POST", "/v1/deposit-accounts", {"externalUserId": user, "destination": DESTINATION}
    )
    email = new_member(portal, "developer")
    fill_sign_in(page, email)
    page.get_by_role("heading", name="Overview").wait_for()
    age_sessions(portal, email)
    page.reload()
    page.get_by_role("heading", name="Overview").wait_for()
    page.goto(f"/portal/#/accounts/{user}")
    # When they move the destination to a wallet on Polygon
    change = page.get_by_role("form", name="Change destination")
    change.get_by_label("Chain").select_option("137")
    change.get_by_label("Wallet address").fill(NEW_WALLET)
    change.get_by_role("button", name="Change destination").click()
    # Then a dialog shows the change, chain and address before and after, and asks for
    # the password
    dialog = page.get_by_role("dialog", name="Change the settlement destination")
    dialog.wait_for()
    rows = dialog.get_by_role("table", name="The change")
    chain = rows.get_by_role("row").filter(has_text="Chain").inner_text()
    assert "Base" in chain and "Polygon" in chain
    wallet = rows.get_by_role("row").filter(has_text="Wallet address").inner_text()
    assert DESTINATION["address"] in wallet and NEW_WALLET in wallet
    password = dialog.get_by_label("Your password")
    assert password.is_visible()
    screenshot(page, "step-up")
    # And a wrong password changes nothing
    password.fill("not my password at all")
    dialog.get_by_role("button", name="Change destination").click()
    dialog.get_by_role("alert").filter(has_text="That password is wrong").wait_for()
    account = portal.call("GET", f"/v1/deposit-accounts/{user}")["depositAccount"]
    assert account["destination"]["address"] == DESTINATION["address"]
    # And Cancel changes nothing either
    dialog.get_by_role("button", name="Cancel").click()
    assert page.get_by_role("dialog").count() == 0
    # And the right password makes the change
    change.get_by_role("button", name="Change destination").click()
    dialog.get_by_label("Your password").fill(PASSWORD)
    dialog.get_by_role("button", name="Change destination").click()
    page.get_by_role("status").filter(has_text="Destination changed").wait_for()
    account = portal.call("GET", f"/v1/deposit-accounts/{user}")["depositAccount"]
    assert (account["destination"]["chainId"], account["destination"]["address"]) == (
        137,
        NEW_WALLET,
    )
    # And for the next 5 minutes the dialog still shows the change, without asking again
    page.goto(f"/portal/#/accounts/{user}")
    change = page.get_by_role("form", name="Change destination")
    change.get_by_label("Chain").select_option("8453")
    change.get_by_label("Wallet address").fill(DESTINATION["address"])
    change.get_by_role("button", name="Change destination").click()
    dialog = page.get_by_role("dialog", name="Change the settlement destination")
    dialog.wait_for()
    assert dialog.get_by_label("Your password").is_hidden()
    dialog.get_by_role("button", name="Change destination").click()
    page.get_by_role("status").filter(has_text="Destination changed").wait_for()


def test_the_audit_page_lists_who_changed_what(page: Any, portal: Portal) -> None:
    # Given a policy change by the tenant's key, and a role change by an admin in the portal
    portal.call("PUT", "/v1/destination-policy", {"destination": DESTINATION, "venue": "audit"})
    target = new_member(portal, "viewer")
    sign_in(page, portal, "admin")
    page.goto("/portal/#/members")
    loaded(page)
    row = page.get_by_role("row").filter(has_text=target)
    row.get_by_label(f"Role of {target}").select_option("developer")
    row.get_by_role("button", name="Change role").click()
    page.get_by_role("dialog").get_by_role("button", name="Change role").click()
    page.get_by_role("status").filter(has_text=f"{target} is now developer").wait_for()
    # When the admin opens the Audit log
    page.locator("#nav").get_by_role("link", name="Audit log").click()
    page.get_by_role("heading", name="Audit log").wait_for()
    loaded(page)
    table = page.get_by_role("table", name="Audit events, newest first")
    # Then the role change is there with the admin as actor, before and after
    change = table.get_by_role("row").filter(has_text="member.role_changed").filter(has_text=target)
    text = change.first.inner_text()
    assert portal.emails["admin"] in text and "viewer" in text and "developer" in text
    assert "127.0.0.1" in text
    # And the key's policy change, by an API key
    policy = table.get_by_role("row").filter(has_text="destination_policy.updated")
    assert "API key" in policy.first.inner_text()
    screenshot(page, "audit")
    # And filtering by a family of actions keeps only those
    page.get_by_label("Action").fill("member.*")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"action=member\.\*"))
    loaded(page)
    events = page.get_by_role("table", name="Audit events, newest first")
    actions = events.locator("tbody tr td:nth-child(2)")
    assert actions.count() > 0
    assert all(a.strip().startswith("member.") for a in actions.all_inner_texts())
    # And members below admin do not see the page
    sign_out(page)
    sign_in(page, portal, "developer")
    page.goto("/portal/#/audit")
    page.get_by_text("Your role cannot see this page.").wait_for()


def test_the_api_reference_renders_under_its_content_security_policy(page: Any) -> None:
    # Given the reference page, served with a CSP that forbids framing and any script
    # but Swagger UI's files and the page's own (by its hash)
    violations: list[str] = []
    page.on(
        "console",
        lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    response = page.goto("/v1/docs")
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    # Then Swagger UI still renders both services' documents, and nothing was blocked
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Settle")
    expect(page.locator(".opblock").first).to_be_visible()
    assert violations == []


def test_one_email_in_two_tenants_signs_in_with_the_tenants_id(page: Any, portal: Portal) -> None:
    # Given one person, with one email and password, a member of two tenants
    email = new_member(portal, "developer")
    with portal.db.transaction() as session:
        other, _ = identity.create_tenant(session, f"Other {uuid.uuid4().hex[:8]}")
        identity.add_member(session, other.id, email, "developer", PASSWORD)
    # When they sign in, the portal asks which tenant
    fill_sign_in(page, email)
    page.get_by_label("Tenant ID").wait_for()
    expect(page.get_by_role("alert")).to_contain_text("member of several tenants")
    # Then with this tenant's id they are signed in to it
    page.get_by_label("Tenant ID").fill(portal.tenant_id)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("button", name="Sign out").wait_for()
    loaded(page)
    sign_out(page)
