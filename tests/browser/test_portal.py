"""The portal's pages, driven in Chromium as people would use them.

Each test signs in through the form (or opens a portal link) and clicks through the
pages; what it checks of Settle's state it checks through the API, so the pages are
proven against the same back-end tenants use.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
import requests
from playwright.sync_api import expect

from shared import signing
from tests.browser.conftest import ROLES, Portal, loaded, screenshot, sign_in
from tests.support.receiver import Answer, Receiver

#: The portal's pages reached from its navigation.
PAGES = (
    "/",
    "/deposits",
    "/statements",
    "/accounts",
    "/policy",
    "/endpoints",
    "/deliveries",
    "/events",
    "/keys",
    "/members",
    "/audit",
    "/security",
)

pytestmark = pytest.mark.browser

#: Navigation each role sees (a portal link's session sees the webhook pages only).
BASE_NAV = [
    "Overview",
    "Deposits",
    "Statements",
    "Accounts",
    "Policy",
    "Endpoints",
    "Deliveries",
    "Event catalog",
]
MEMBER_NAV = [*BASE_NAV, "Security"]
ADMIN_NAV = [*BASE_NAV, "API keys", "Members", "Audit log", "Security"]
LINK_NAV = ["Endpoints", "Deliveries", "Event catalog"]
#: USDC on Base to a plain wallet.
DESTINATION = {
    "chainId": 8453,
    "address": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
    "tokenAddress": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
}
NEW_WALLET = "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359"


def nav_items(page: Any) -> list[str]:
    return [t.strip() for t in page.locator("#nav a").all_inner_texts()]


def first_hit(receiver: Receiver, path: str) -> Any:
    """The first request `path` received (waiting up to 20 s for it)."""
    assert receiver.wait_for(lambda r: bool(r.hits(path)), timeout=20), path
    return receiver.hits(path)[0]


def make_endpoint(portal: Portal, url: str, types: list[str] | None = None) -> dict[str, Any]:
    body = {
        "name": f"hook-{uuid.uuid4().hex[:6]}",
        "url": url,
        "eventTypes": types or ["webhook.test"],
    }
    made: dict[str, Any] = portal.call("POST", "/v1/webhook-endpoints", body)
    return made


# -- roles --------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_each_role_sees_only_what_it_may(
    page: Any, portal: Portal, receiver: Receiver, role: str
) -> None:
    # Given a delivery, and a member of `role` signed in through the form
    endpoint_id = make_endpoint(portal, receiver.url("/roles"))["webhookEndpoint"]["id"]
    test = portal.call("POST", f"/v1/webhook-endpoints/{endpoint_id}/test")
    delivery_id = test["webhookDelivery"]["id"]
    sign_in(page, portal, role)
    writes = role != "viewer"
    admin = role in ("admin", "owner")
    # Then the navigation shows API keys and members to admins and owners only
    assert nav_items(page) == (ADMIN_NAV if admin else MEMBER_NAV)
    assert page.locator("#who").inner_text().strip().startswith(portal.emails[role])
    # And the write controls exist exactly for developers and up
    page.locator("#nav").get_by_role("link", name="Endpoints").click()
    page.get_by_role("heading", name="Webhook endpoints").wait_for()
    loaded(page)
    assert page.get_by_role("button", name="Create endpoint").count() == int(writes)
    page.locator("#nav").get_by_role("link", name="Policy").click()
    page.get_by_role("heading", name="Destination policy").wait_for()
    loaded(page)
    assert page.get_by_role("button", name="Save policy").count() == int(writes)
    page.locator("#nav").get_by_role("link", name="Deliveries").click()
    page.get_by_role("heading", name="Deliveries").wait_for()
    loaded(page)
    assert page.get_by_role("button", name=f"Replay {delivery_id}").count() == int(writes)
    # And the access pages open for admins; others are told their role cannot see them
    page.goto("/portal/#/keys")
    page.get_by_role("heading", name="API keys").wait_for()
    loaded(page)
    assert page.get_by_text("Your role cannot see this page.").count() == int(not admin)
    assert page.get_by_text("Create an API key").count() == int(admin)


def test_a_wrong_password_is_refused_in_place(page: Any, portal: Portal) -> None:
    page.goto("/")
    page.get_by_label("Email").fill(portal.emails["owner"])
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("alert").filter(has_text="Email or password is wrong").wait_for()
    assert page.get_by_role("heading", name="Sign in to Settle").is_visible()
    screenshot(page, "sign-in")


def test_signing_in_loads_the_overview_once_and_busy_ends_with_it(
    page: Any, portal: Portal
) -> None:
    # Given the requests the page makes for its recent deposits (the overview's alone)
    asked: list[str] = []
    page.on(
        "request",
        lambda request: (
            asked.append(request.url) if "/v1/deposits?limit=10" in request.url else None
        ),
    )
    # When a member signs in
    sign_in(page, portal, "viewer")
    # Then the overview was loaded once (not once per hashchange and once by hand: two
    # loads race, and the first to finish said "loaded" while the second was not), and
    # what "loaded" promises is there
    assert len(asked) == 1, asked
    assert page.get_by_role("region", name="Recent deposits").count() == 1
    assert page.get_by_role("region", name="Delivery health").count() == 1


def test_the_keyboard_alone_signs_in_and_moves_around(page: Any, portal: Portal) -> None:
    # Given the sign-in page, focus in the first field
    page.goto("/")
    page.get_by_label("Email").wait_for()
    assert page.evaluate("document.activeElement.type") == "email"
    # When a person types, tabs and presses Enter, with no mouse
    page.keyboard.type(portal.emails["viewer"])
    page.keyboard.press("Tab")
    page.keyboard.type("correct horse battery staple")
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Overview").wait_for()
    # (The app focuses the heading once the page's data has loaded, not when the heading
    # first shows: wait for that, or the first Shift+Tab starts from elsewhere.)
    # (expect, not wait_for_function: the portal's CSP forbids the eval that one uses)
    expect(page.get_by_role("heading", name="Overview")).to_be_focused()
    # Then (focus is on the page's heading) Shift+Tab walks back through the header to the
    # navigation, and Enter follows a link
    focused = []
    for _ in range(12):
        page.keyboard.press("Shift+Tab")
        focused.append(page.evaluate("document.activeElement.textContent.trim()"))
        if focused[-1] == "Deliveries":
            break
    assert focused[0] == "Sign out" and focused[-1] == "Deliveries", focused
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Deliveries").wait_for()
    # And the filter form works from the keyboard: a select, then Enter submits
    loaded(page)
    page.get_by_label("Status").focus()
    for _ in range(4):  # Any status -> pending -> retrying -> succeeded -> failed
        page.keyboard.press("ArrowDown")
    assert page.get_by_label("Status").input_value() == "failed"
    page.keyboard.press("Tab")  # into "Created after"; Enter there submits the form
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"status=failed"))


# -- endpoints ----------------------------------------------------------------------


def test_create_an_endpoint_and_copy_its_secret(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    sign_in(page, portal, "developer")
    page.goto("/portal/#/endpoints")
    # When the developer creates an endpoint for webhook.test
    name = f"ledger-{uuid.uuid4().hex[:6]}"
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("URL").fill(receiver.url("/created"))
    page.get_by_label("webhook.test").check()
    page.get_by_role("button", name="Create endpoint").click()
    # Then the secret is shown once, and Copy puts it on the clipboard
    secret_box = page.get_by_label("Signing secret")
    secret = secret_box.input_value()
    assert secret.startswith("whsec_")
    screenshot(page, "endpoint-created")
    page.get_by_role("button", name="Copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == secret
    # And the copied secret verifies a test delivery the endpoint's page sends
    page.get_by_role("link", name="Open the endpoint").click()
    page.get_by_role("heading", name=re.compile(f"Endpoint {name}")).wait_for()
    screenshot(page, "endpoint")
    page.get_by_role("button", name="Send test").click()
    page.get_by_role("heading", name=re.compile("Delivery")).wait_for()
    hit = first_hit(receiver, "/created")
    signing.verify(secret, hit.headers, hit.body)
    # A test, marked so: livemode false and x-service-test: 1 (issue 23)
    assert json.loads(hit.body)["livemode"] is False
    assert hit.headers.get("x-service-test") == "1"


def test_rotate_a_secret_with_an_overlap(page: Any, portal: Portal, receiver: Receiver) -> None:
    endpoint = make_endpoint(portal, receiver.url("/rotate"))
    old = endpoint["secret"]
    endpoint_id = endpoint["webhookEndpoint"]["id"]
    sign_in(page, portal, "developer")
    page.goto(f"/portal/#/endpoints/{endpoint_id}")
    # When the developer rotates, keeping the old secret for an hour
    page.get_by_label("Keep the old secret valid for").select_option("3600")
    page.get_by_role("button", name="Rotate secret").click()
    # (a dialog shows the change first: signed in just now, no password is asked)
    dialog = page.get_by_role("dialog", name="Rotate the signing secret")
    assert dialog.get_by_label("Your password").is_hidden()
    dialog.get_by_role("button", name="Rotate secret").click()
    new = page.get_by_label("New signing secret").input_value()
    # Then a new secret is shown, the old one still signs for an hour, and both sign
    assert new.startswith("whsec_") and new != old
    state = portal.call("GET", f"/v1/webhook-endpoints/{endpoint_id}")["webhookEndpoint"]
    assert state["previousSecretExpiresAt"] is not None
    portal.call("POST", f"/v1/webhook-endpoints/{endpoint_id}/test")
    hit = first_hit(receiver, "/rotate")
    signing.verify(new, hit.headers, hit.body)
    signing.verify(old, hit.headers, hit.body)


def test_disable_enable_and_delete_an_endpoint(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    endpoint_id = make_endpoint(portal, receiver.url("/toggle"))["webhookEndpoint"]["id"]
    sign_in(page, portal, "developer")
    page.goto(f"/portal/#/endpoints/{endpoint_id}")
    page.get_by_role("button", name="Disable").click()
    page.get_by_role("button", name="Enable").wait_for()
    assert (
        portal.call("GET", f"/v1/webhook-endpoints/{endpoint_id}")["webhookEndpoint"]["status"]
        == "disabled"
    )
    page.get_by_role("button", name="Enable").click()
    page.get_by_role("button", name="Disable").wait_for()
    # Delete asks first; Cancel keeps it
    page.get_by_role("button", name="Delete").click()
    page.get_by_role("button", name="Cancel").click()
    page.get_by_role("button", name="Delete").click()
    page.get_by_role("button", name="Yes, delete").click()
    page.get_by_role("heading", name="Webhook endpoints").wait_for()
    gone = requests.get(
        f"{portal.base}/v1/webhook-endpoints/{endpoint_id}", headers=portal.headers, timeout=10
    )
    assert gone.status_code == 404


def test_edit_an_endpoints_event_types(page: Any, portal: Portal, receiver: Receiver) -> None:
    endpoint_id = make_endpoint(portal, receiver.url("/edit"))["webhookEndpoint"]["id"]
    sign_in(page, portal, "developer")
    page.goto("/portal/#/endpoints")
    page.get_by_role("table", name="Webhook endpoints, newest first").wait_for()
    loaded(page)
    screenshot(page, "endpoints")
    page.goto(f"/portal/#/endpoints/{endpoint_id}")
    # When the developer subscribes it to deposit.credited instead of webhook.test
    edit = page.get_by_role("form", name="Edit endpoint")
    edit.get_by_label("deposit.credited", exact=True).check()
    edit.get_by_label("webhook.test", exact=True).uncheck()
    edit.get_by_role("button", name="Save changes").click()
    page.get_by_role("status").filter(has_text="Endpoint saved").wait_for()
    # Then the API has the new types, and the page shows them
    path = f"/v1/webhook-endpoints/{endpoint_id}"
    assert portal.call("GET", path)["webhookEndpoint"]["eventTypes"] == ["deposit.credited"]
    page.get_by_role("definition").filter(has_text=re.compile(r"^deposit\.credited$")).wait_for()


# -- deposits -----------------------------------------------------------------------


def test_a_sandbox_deposit_appears_with_its_timeline(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    # Given an endpoint for every deposit event, an account, and a sandbox deposit to it
    # (made through the API) that goes to manual review and is credited by hand (ops)
    types = [
        "deposit.source_seen",
        "deposit.source_confirmed",
        "deposit.credit_submitted",
        "deposit.credited",
        "deposit.failed",
        "deposit.manual_review_required",
    ]
    make_endpoint(portal, receiver.url("/deposits"), types)
    user = f"user-{uuid.uuid4().hex[:8]}"
    destination = {
        "chainId": 8453,
        "address": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
        "tokenAddress": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
    }
    account = portal.call(
        "POST", "/v1/deposit-accounts", {"externalUserId": user, "destination": destination}
    )["depositAccount"]
    address = next(a for a in account["depositAddresses"] if a["chainId"] == 137)
    deposit = portal.call(
        "POST",
        "/v1/sandbox/deposits",
        {
            "depositAddress": address["address"],
            "chainId": 137,
            "asset": "USDC",
            "amount": "125.50",
            "outcome": "manual_review",
        },
    )["deposit"]
    path = f"/v1/deposits/{deposit['id']}"
    portal.wait_for("GET", path, lambda b: b["deposit"]["status"] == "manual_review_required")
    portal.settle("deposits", "credit", deposit["id"], "--tx", "0x" + "cd" * 32, "--by", "ops")
    recorded = portal.wait_for("GET", f"{path}/timeline", lambda b: len(b["timeline"]) == 4)
    steps_made = recorded["timeline"]
    portal.wait_for(
        "GET",
        f"/v1/webhook-deliveries?eventId={steps_made[2]['eventId']}",
        lambda b: [d["status"] for d in b["webhookDeliveries"]] == ["succeeded"],
    )
    # When a viewer searches the deposits by the external user id
    sign_in(page, portal, "viewer")
    page.goto("/portal/#/deposits")
    page.get_by_label("External user id").fill(user)
    page.get_by_role("button", name="Search").click()
    row = page.get_by_role("row").filter(has_text=deposit["id"])
    row.wait_for()
    assert "credited" in row.inner_text()
    screenshot(page, "deposits")
    # Then the deposit's page shows its timeline as recorded: each status (the review
    # it passed through too) with its event's time, UTC on hover
    page.get_by_role("link", name=deposit["id"]).click()
    timeline = page.get_by_role("list", name="Timeline")
    timeline.wait_for()
    steps = timeline.get_by_role("listitem")
    texts = steps.all_inner_texts()
    assert [t.split()[0] for t in texts] == [
        "source_seen",
        "source_confirmed",
        "manual_review_required",
        "credited",
    ], texts
    for i, step in enumerate(steps_made):
        shown = steps.nth(i)
        utc = step["at"].replace("T", " ").replace("Z", " UTC")
        assert shown.locator("time").get_attribute("title") == utc
        assert step["eventId"] in shown.inner_text()
    # And the deliveries its events caused, the review's (a fresh event id) included
    caused = page.get_by_role("table", name="Deliveries of this deposit's events")
    caused.get_by_role("row").filter(has_text="deposit.manual_review_required").wait_for()
    for step in steps_made:
        assert step["eventType"] in caused.inner_text()
    screenshot(page, "deposit")
    # And the account page lists its addresses
    page.get_by_role("link", name=user).first.click()
    page.get_by_role("table", name="Deposit addresses").wait_for()
    assert address["address"] in page.get_by_role("table", name="Deposit addresses").inner_text()
    screenshot(page, "account")


def test_change_an_accounts_destination(page: Any, portal: Portal) -> None:
    user = f"dest-{uuid.uuid4().hex[:8]}"
    portal.call(
        "POST", "/v1/deposit-accounts", {"externalUserId": user, "destination": DESTINATION}
    )
    sign_in(page, portal, "developer")
    page.goto(f"/portal/#/accounts/{user}")
    # When the developer moves its destination to a wallet on Polygon
    change = page.get_by_role("form", name="Change destination")
    change.get_by_label("Chain").select_option("137")
    change.get_by_label("Wallet address").fill(NEW_WALLET)
    change.get_by_role("button", name="Change destination").click()
    page.get_by_role("dialog").get_by_role("button", name="Change destination").click()
    page.get_by_role("status").filter(has_text="Destination changed").wait_for()
    # Then the account's destination is the new one (the chain's token, as offered)
    account = portal.call("GET", f"/v1/deposit-accounts/{user}")["depositAccount"]
    assert account["destination"]["chainId"] == 137
    assert account["destination"]["address"] == NEW_WALLET
    polygon = next(c for c in portal.call("GET", "/v1/chains")["chains"] if c["chainId"] == 137)
    tokens = [a["tokenAddress"] for a in polygon["assets"]]
    assert account["destination"]["tokenAddress"] == tokens[0]


def test_find_an_account_by_a_deposit_address_in_any_case(page: Any, portal: Portal) -> None:
    user = f"find-{uuid.uuid4().hex[:8]}"
    account = portal.call(
        "POST", "/v1/deposit-accounts", {"externalUserId": user, "destination": DESTINATION}
    )["depositAccount"]
    address = account["depositAddresses"][-1]["address"]
    sign_in(page, portal, "viewer")
    page.goto("/portal/#/accounts")
    # When support pastes the address as a block explorer shows it (lower case)
    search = page.get_by_role("form", name="Find an account")
    search.get_by_label("External user id or deposit address").fill(address.lower())
    search.get_by_role("button", name="Open account").click()
    # Then the account that owns it opens
    page.get_by_role("heading", name=f"Account {user}").wait_for()
    # And an address nobody of this tenant owns says so, in place
    page.goto("/portal/#/accounts")
    search.get_by_label("External user id or deposit address").fill("0x" + "1" * 40)
    search.get_by_role("button", name="Open account").click()
    page.get_by_role("alert").filter(has_text="No account has the deposit address").wait_for()


# -- deliveries ---------------------------------------------------------------------


def test_a_failing_delivery_shows_its_attempts_and_replay_makes_it_succeed(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    # Given an endpoint whose receiver fails every attempt, and a delivery that failed
    receiver.script("/fails", Answer.fail(500, b"receiver is down"))
    endpoint_id = make_endpoint(portal, receiver.url("/fails"))["webhookEndpoint"]["id"]
    delivery = portal.call("POST", f"/v1/webhook-endpoints/{endpoint_id}/test")["webhookDelivery"]
    failed = portal.wait_for(
        "GET",
        f"/v1/webhook-deliveries/{delivery['id']}",
        lambda b: b["webhookDelivery"]["status"] == "failed",
    )["webhookDelivery"]
    assert len(failed["attempts"]) == 3
    # When support filters the deliveries by status and opens the failed one
    sign_in(page, portal, "developer")
    page.goto("/portal/#/deliveries")
    page.get_by_label("Endpoint").select_option(endpoint_id)
    page.get_by_label("Status").select_option("failed")
    page.get_by_role("button", name="Filter").click()
    page.get_by_role("row").filter(has_text=delivery["id"]).wait_for()
    screenshot(page, "deliveries")
    page.get_by_role("link", name=delivery["id"]).click()
    # Then every attempt shows its status, latency and the receiver's answer
    attempts = page.locator("li.attempt")
    attempts.first.wait_for()
    assert attempts.count() == 3
    first = attempts.first
    assert "500" in first.inner_text()
    first.get_by_text("Response (first 4 KiB)").wait_for()
    assert "receiver is down" in first.inner_text()
    first.get_by_text("Request headers and body as sent").click()
    assert delivery["eventId"] in first.inner_text()
    assert re.search(r"Latency\s*\d+ ms", first.inner_text()), first.inner_text()
    # And what the page says attempt 1 sent is what the receiver got: the exact body
    # bytes, and each signed header with its value
    got = receiver.hits("/fails")[0]
    headers_shown, body_shown = first.locator("details pre").all_inner_texts()[:2]
    assert body_shown == got.body.decode("utf-8")
    shown = {
        name.lower(): value
        for name, _, value in (line.partition(": ") for line in headers_shown.splitlines())
    }
    signed = {n.lower(): v for n, v in got.headers.items() if n.lower().startswith("x-service-")}
    # signature, timestamp, event id, delivery id, and x-service-test: 1 (a test event)
    assert len(signed) == 5 and signed["x-service-test"] == "1", got.headers
    for name, value in signed.items():
        assert shown.get(name) == value, (name, value, shown)
    screenshot(page, "delivery")
    # When the receiver is fixed and support presses Replay
    receiver.script("/fails", Answer.ok())
    page.get_by_role("button", name=f"Replay {delivery['id']}").click()
    page.wait_for_url(lambda url: "/deliveries/" in url and delivery["id"] not in url)
    replay_id = page.url.rsplit("/", 1)[1]
    assert replay_id != delivery["id"]
    # Then the replay succeeds, naming the delivery it replays
    done = portal.wait_for(
        "GET",
        f"/v1/webhook-deliveries/{replay_id}",
        lambda b: b["webhookDelivery"]["status"] == "succeeded",
    )["webhookDelivery"]
    assert done["replayOf"] == delivery["id"] and done["eventId"] == delivery["eventId"]
    page.reload()
    page.get_by_text("succeeded").first.wait_for()


def test_an_ordered_endpoints_held_delivery_shows_what_holds_it(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    # Given an endpoint ordering per account whose receiver hangs past the deadline
    receiver.script("/ordered", Answer.hang(30))
    made = portal.call(
        "POST",
        "/v1/webhook-endpoints",
        {
            "name": "ordered",
            "url": receiver.url("/ordered"),
            "eventTypes": ["deposit.account.*"],
            "ordering": "per_account",
        },
    )
    endpoint_id = made["webhookEndpoint"]["id"]
    assert made["webhookEndpoint"]["ordering"] == "per_account"
    # When an account's first event is being tried and its second comes
    user = f"ordered-{uuid.uuid4().hex[:8]}"
    portal.call(
        "POST", "/v1/deposit-accounts", {"externalUserId": user, "destination": DESTINATION}
    )
    assert receiver.wait_for(lambda r: len(r.hits("/ordered")) >= 1, 15)
    portal.call(
        "PATCH",
        f"/v1/deposit-accounts/{user}/destination",
        {"destination": {**DESTINATION, "address": NEW_WALLET}},
    )
    listed = portal.wait_for(
        "GET",
        f"/v1/webhook-deliveries?endpointId={endpoint_id}",
        lambda b: len(b["webhookDeliveries"]) == 2,
    )["webhookDeliveries"]
    second, first = listed  # newest first
    assert second["heldBy"] == first["id"] and first["heldBy"] is None
    # Then the deliveries page says which one holds the second, and links to it
    sign_in(page, portal, "developer")
    page.goto(f"/portal/#/deliveries?endpointId={endpoint_id}")
    row = page.get_by_role("row").filter(has_text=second["id"])
    row.get_by_text("held by").wait_for()
    row.get_by_role("link", name=first["id"]).click()
    page.get_by_role("heading", name=f"Delivery {first['id']}").wait_for()
    page.goto(f"/portal/#/deliveries/{second['id']}")
    page.locator("span.held").get_by_role("link", name=first["id"]).wait_for()
    page.goto(f"/portal/#/endpoints/{endpoint_id}")
    page.get_by_text("per account: an account's events one at a time").wait_for()


def test_lists_page_with_cursors_and_sort_by_time(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    # Given 3 deliveries to one endpoint
    endpoint_id = make_endpoint(portal, receiver.url("/paged"))["webhookEndpoint"]["id"]
    made = [
        portal.call("POST", f"/v1/webhook-endpoints/{endpoint_id}/test")["webhookDelivery"]["id"]
        for _ in range(3)
    ]
    sign_in(page, portal, "viewer")
    # When the list shows 2 per page
    page.goto(f"/portal/#/deliveries?endpointId={endpoint_id}&limit=2")
    table = page.get_by_role("table", name="Deliveries, newest first")
    table.wait_for()

    def ids() -> list[str]:
        return [i for i in re.findall(r"whd_\w+", table.inner_text())]

    # Then page 1 has the newest two, Next shows the first one, Previous goes back
    assert ids() == [made[2], made[1]]
    page.get_by_role("button", name="Next page").click()
    page.get_by_text("Page 2").wait_for()
    assert ids() == [made[0]]
    page.get_by_role("button", name="Previous page").click()
    page.get_by_text("Page 1").wait_for()
    assert ids() == [made[2], made[1]]
    # And the time column sorts oldest first, and back
    header = table.get_by_role("columnheader", name=re.compile("Created"))
    header.get_by_role("button").click()
    assert header.get_attribute("aria-sort") == "ascending"
    assert ids() == [made[1], made[2]]


def test_recover_a_window_sends_the_failed_deliveries_again(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    # Given an endpoint whose receiver failed every attempt of a delivery
    receiver.script("/recover", Answer.fail(503, b"down for maintenance"))
    endpoint_id = make_endpoint(portal, receiver.url("/recover"))["webhookEndpoint"]["id"]
    failed = portal.call("POST", f"/v1/webhook-endpoints/{endpoint_id}/test")["webhookDelivery"]
    portal.wait_for(
        "GET",
        f"/v1/webhook-deliveries/{failed['id']}",
        lambda b: b["webhookDelivery"]["status"] == "failed",
    )
    # When the receiver is back and a developer recovers the last hour from the endpoint page
    receiver.script("/recover", Answer.ok())
    sign_in(page, portal, "developer")
    page.goto(f"/portal/#/endpoints/{endpoint_id}")
    an_hour_ago = page.evaluate(
        """(() => { const d = new Date(Date.now() - 3600e3);
                    d.setMinutes(d.getMinutes() - d.getTimezoneOffset());
                    return d.toISOString().slice(0, 16); })()"""
    )
    recover = page.get_by_role("form", name="Recover")
    recover.get_by_label("From").fill(an_hour_ago)
    recover.get_by_role("button", name="Recover").click()
    page.get_by_role("status").filter(has_text="1 delivery sent again.").wait_for()
    # Then the same event is delivered again, and succeeds
    listed = portal.wait_for(
        "GET",
        f"/v1/webhook-deliveries?eventId={failed['eventId']}",
        lambda b: any(d["status"] == "succeeded" for d in b["webhookDeliveries"]),
    )["webhookDeliveries"]
    assert len(listed) == 2
    assert receiver.wait_for(lambda r: len(r.hits("/recover")) == 4, timeout=20)


def test_the_overview_shows_health_attention_and_recent_deposits(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    # Given an endpoint that fails, one that works, one disabled, and a deposit in review
    receiver.script("/down", Answer.fail(500, b"overview down"))
    down = make_endpoint(portal, receiver.url("/down"))["webhookEndpoint"]
    up = make_endpoint(portal, receiver.url("/up"))["webhookEndpoint"]
    off = make_endpoint(portal, receiver.url("/off"))["webhookEndpoint"]
    portal.call("PATCH", f"/v1/webhook-endpoints/{off['id']}", {"status": "disabled"})
    for endpoint, status in ((down, "failed"), (up, "succeeded")):
        made = portal.call("POST", f"/v1/webhook-endpoints/{endpoint['id']}/test")
        portal.wait_for(
            "GET",
            f"/v1/webhook-deliveries/{made['webhookDelivery']['id']}",
            lambda b, status=status: b["webhookDelivery"]["status"] == status,
        )
    account = portal.call(
        "POST",
        "/v1/deposit-accounts",
        {"externalUserId": f"review-{uuid.uuid4().hex[:8]}", "destination": DESTINATION},
    )["depositAccount"]
    address = next(a for a in account["depositAddresses"] if a["chainId"] == 137)
    deposit = portal.call(
        "POST",
        "/v1/sandbox/deposits",
        {
            "depositAddress": address["address"],
            "chainId": 137,
            "asset": "USDC",
            "amount": "42.00",
            "outcome": "manual_review",
        },
    )["deposit"]
    portal.wait_for(
        "GET",
        f"/v1/deposits/{deposit['id']}",
        lambda b: b["deposit"]["status"] == "manual_review_required",
    )
    # When a viewer opens the overview
    sign_in(page, portal, "viewer")
    # Then each endpoint's health shows its success rate and last failure, the figures
    # of the stats API (the same numbers as `settle sla`)
    health = page.get_by_role("table", name="Delivery health per endpoint")
    down_row = health.get_by_role("row").filter(has_text=down["name"])
    assert "0%" in down_row.inner_text()
    assert down_row.locator("time").count() == 1  # the last failure, with its time
    stats = portal.call("GET", f"/v1/webhook-endpoints/{down['id']}/stats?since=7d")["stats"]
    headers = health.get_by_role("columnheader").all_inner_texts()
    cells = dict(zip(headers, down_row.get_by_role("cell").all_inner_texts(), strict=True))
    assert cells["Deliveries"] == str(stats["deliveries"]) == "1"
    assert cells["Gave up"] == str(stats["exhausted"]) == "1"
    assert cells["Pending"] == "0" and cells["Oldest pending"] == "—"
    assert "100%" in health.get_by_role("row").filter(has_text=up["name"]).inner_text()
    assert "disabled" in health.get_by_role("row").filter(has_text=off["name"]).inner_text()
    # And what needs attention: the disabled endpoint and the deposits in review
    attention = page.get_by_role("region", name="Needs attention")
    assert f"Endpoint {off['name']} is disabled" in attention.inner_text()
    in_review = attention.get_by_role(
        "link", name=re.compile(r"^\d+\+? deposits? in manual review$")
    )
    in_review.wait_for()
    # And the recent deposits, the new one first
    recent = page.get_by_role("table", name="Recent deposits")
    assert deposit["id"] in recent.get_by_role("row").nth(1).inner_text()
    screenshot(page, "overview")
    # And the attention link opens the deposits in review
    in_review.click()
    page.get_by_role("row").filter(has_text=deposit["id"]).wait_for()


def test_times_are_in_the_viewers_zone_with_utc_on_hover(browser: Any, portal: Portal) -> None:
    context = browser.new_context(base_url=portal.base, timezone_id="Asia/Tokyo", locale="en-GB")
    try:
        page = context.new_page()
        sign_in(page, portal, "viewer")
        page.goto("/portal/#/members")  # refused to a viewer: use the deliveries list
        page.goto("/portal/#/deliveries")
        first = page.locator("table time").first
        first.wait_for()
        title, shown = first.get_attribute("title"), first.inner_text()
        assert title.endswith(" UTC") and re.match(
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC", title
        )
        # Tokyo is UTC+9: the shown hour is 9 hours on from the UTC one
        utc_hour = int(title[11:13])
        assert f"{(utc_hour + 9) % 24:02d}:" in shown and "GMT+9" in shown, (title, shown)
    finally:
        context.close()


# -- event catalog ------------------------------------------------------------------


def test_the_catalog_lists_every_type(page: Any, portal: Portal) -> None:
    sign_in(page, portal, "viewer")
    page.goto("/portal/#/events")
    page.get_by_role("heading", name="Event catalog").wait_for()
    loaded(page)
    types = portal.call("GET", "/v1/notifier/openapi.json", None)["components"]["schemas"]
    names = types["Endpoint"]["properties"]["receives"]["items"]["enum"]
    for name in names:
        assert page.get_by_role("heading", name=name, exact=True).count() == 1, name
    screenshot(page, "events")


def test_send_an_example_of_a_type_from_the_catalog(
    page: Any, portal: Portal, receiver: Receiver
) -> None:
    # Given an endpoint (subscribed to webhook.test only) and its secret
    made = make_endpoint(portal, receiver.url("/example"))
    endpoint, secret = made["webhookEndpoint"], made["secret"]
    sign_in(page, portal, "developer")
    page.goto("/portal/#/events")
    # When the developer opens the example of deposit.credited: no endpoint is chosen
    send = page.get_by_role("form", name="Send an example of deposit.credited")
    assert send.get_by_label("Endpoint").input_value() == ""
    send.get_by_role("button", name="Send example").click()
    expect(send.get_by_text("Choose the endpoint")).to_be_visible()
    # And once one is chosen, the portal asks before sending, naming it
    send.get_by_label("Endpoint").select_option(endpoint["id"])
    send.get_by_role("button", name="Send example").click()
    expect(send.get_by_role("status")).to_contain_text(endpoint["url"])
    assert receiver.hits("/example") == []  # nothing sent before the answer
    send.get_by_role("button", name="Yes, send the example").click()
    page.wait_for_url(re.compile(r"#/deliveries/whd_"))
    # Then the receiver gets a signed deposit.credited with the catalog's example data,
    # under a fresh event id, marked a test: livemode false, x-service-test: 1, and ids
    # no real object has
    hit = first_hit(receiver, "/example")
    signing.verify(secret, hit.headers, hit.body)
    assert hit.headers.get("x-service-test") == "1"
    body = json.loads(hit.body)
    example = next(
        t
        for t in portal.call("GET", "/v1/event-types")["eventTypes"]
        if t["type"] == "deposit.credited"
    )["example"]
    assert body["type"] == "deposit.credited" and body["livemode"] is False
    assert body["id"].startswith("evt_test_") and body["tenantId"] == portal.tenant_id
    sent, shown = body["data"]["deposit"], example["data"]["deposit"]
    assert sent["id"].startswith("dep_example_") and sent["accountId"].startswith("acc_example_")
    assert sent["amount"] == shown["amount"] and sent["status"] == shown["status"]


# -- access -------------------------------------------------------------------------


def test_create_and_revoke_an_api_key(page: Any, portal: Portal) -> None:
    sign_in(page, portal, "admin")
    page.goto("/portal/#/keys")
    page.get_by_text("Create an API key").click()
    name = f"support-{uuid.uuid4().hex[:6]}"
    page.get_by_label("Name").fill(name)
    page.get_by_label("webhooks:read").check()
    page.get_by_role("button", name="Create key").click()
    dialog = page.get_by_role("dialog", name="Create an API key")
    assert "webhooks:read" in dialog.inner_text()
    dialog.get_by_role("button", name="Create key").click()
    key = page.get_by_label("API key", exact=True).input_value()
    assert key.startswith("sk_")
    endpoints = f"{portal.base}/v1/webhook-endpoints"
    auth = {"Authorization": f"Bearer {key}"}
    assert requests.get(endpoints, headers=auth, timeout=10).status_code == 200
    screenshot(page, "api-key-created")
    # When the admin revokes it from the list
    page.get_by_role("button", name="Back to the list").click()
    row = page.get_by_role("row").filter(has_text=name)
    row.get_by_role("button", name="Revoke").click()
    row.get_by_role("button", name="Yes, revoke").click()
    page.get_by_role("row").filter(has_text=name).filter(has_text="revoked").wait_for()
    screenshot(page, "api-keys")
    # Then the key fails at once
    assert requests.get(endpoints, headers=auth, timeout=10).status_code == 401


def test_an_admin_adds_a_member_and_changes_the_role(page: Any, portal: Portal) -> None:
    sign_in(page, portal, "admin")
    page.goto("/portal/#/members")
    page.get_by_text("Add a member").click()
    email = f"new-{uuid.uuid4().hex[:8]}@example.com"
    page.get_by_label("Email").fill(email)
    page.get_by_label("Role", exact=True).select_option("developer")
    page.get_by_label("First password").fill("a long enough password")
    # An admin cannot give owner: it is not offered
    assert "owner" not in page.get_by_label("Role", exact=True).inner_text()
    page.get_by_role("button", name="Add member").click()
    row = page.get_by_role("row").filter(has_text=email)
    row.wait_for()
    row.get_by_label(f"Role of {email}").select_option("viewer")
    row.get_by_role("button", name="Change role").click()
    dialog = page.get_by_role("dialog", name="Change a role")
    assert "developer" in dialog.inner_text() and "viewer" in dialog.inner_text()
    dialog.get_by_role("button", name="Change role").click()
    page.get_by_role("status").filter(has_text=f"{email} is now viewer").wait_for()
    members = portal.call("GET", "/v1/members?limit=200")["members"]
    assert next(m for m in members if m["email"] == email)["role"] == "viewer"
    screenshot(page, "members")


def test_an_embedded_link_opens_the_webhook_pages_once(browser: Any, portal: Portal) -> None:
    # Given a portal link the tenant's server made for its support staff
    link = portal.call("POST", "/v1/portal-links", {"role": "viewer"})["portalLink"]
    first = browser.new_context()
    try:
        page = first.new_page()
        # When support opens it
        page.goto(link["url"])
        # Then they are on the webhook pages, signed in by the link, and see only those
        page.get_by_role("heading", name="Webhook endpoints").wait_for()
        assert nav_items(page) == LINK_NAV
        assert "Portal link" in page.locator("#who").inner_text()
        assert page.url.endswith("/portal/#/endpoints")  # the token left the address bar
        assert page.get_by_role("button", name="Create endpoint").count() == 0
        page.goto(f"{portal.base}/portal/#/deposits")
        page.get_by_text("Your role cannot see this page.").wait_for()
    finally:
        first.close()
    # And the link is spent: opening it again, anywhere, finds it expired
    second = browser.new_context()
    try:
        page = second.new_page()
        page.goto(link["url"])
        page.get_by_text("This portal link has expired or was already used").wait_for()
        screenshot(page, "link-expired")
    finally:
        second.close()


def test_every_field_is_labelled(page: Any, portal: Portal) -> None:
    sign_in(page, portal, "owner")
    unlabelled_js = """
        [...document.querySelectorAll('main input, main select, main textarea')]
          .filter(el => el.type !== 'hidden' && !(el.labels && el.labels.length)
                        && !el.getAttribute('aria-label'))
          .map(el => el.outerHTML)
    """
    for route in PAGES:
        page.goto(f"/portal/#{route}")
        page.locator("main h1").wait_for()
        page.wait_for_load_state("networkidle")
        assert page.evaluate(unlabelled_js) == [], route
        if route in ("/accounts", "/policy"):
            screenshot(page, route.strip("/") or "overview")


#: Every text on the page whose colour against its background is under WCAG AA: 4.5:1,
#: or 3:1 for large text (24 px, or 18.66 px bold). Disabled controls are exempt (WCAG
#: 1.4.3). Backgrounds are composited up the ancestors, as the browser paints them.
LOW_CONTRAST_JS = """
(() => {
  const rgba = (text) => {
    const m = text.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return [0, 0, 0, 0];
    const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, under) => {
    const a = top[3] + under[3] * (1 - top[3]);
    if (a === 0) return [0, 0, 0, 0];
    const mix = (i) => (top[i] * top[3] + under[i] * under[3] * (1 - top[3])) / a;
    return [mix(0), mix(1), mix(2), a];
  };
  const background = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) layers.push(rgba(getComputedStyle(e).backgroundColor));
    let colour = [255, 255, 255, 1];  // the canvas
    for (const layer of layers.reverse()) colour = over(layer, colour);
    return colour;
  };
  const luminance = ([r, g, b]) => {
    const lin = (c) => {
      c /= 255;
      return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    };
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
  };
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const seen = new Set();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!node.textContent.trim() || seen.has(el)) continue;
    seen.add(el);
    if (el.closest("[disabled], noscript, .skip, .toast:not(.shown)")) continue;
    const style = getComputedStyle(el);
    const box = el.getBoundingClientRect();
    const hidden = style.visibility === "hidden" || style.display === "none";
    if (hidden || !box.width || !box.height) continue;
    const bg = background(el);
    const fg = over(rgba(style.color), bg);
    const [hi, lo] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) {
      const text = node.textContent.trim().slice(0, 30);
      out.push(`${el.tagName.toLowerCase()}.${el.className} "${text}" ${ratio.toFixed(2)}`);
    }
  }
  return out;
})()
"""


def test_every_text_has_aa_contrast(page: Any, portal: Portal, receiver: Receiver) -> None:
    # Given something on each page (an endpoint, a failed delivery, a toast shown)
    receiver.script("/contrast", Answer.fail(500, b"contrast"))
    endpoint_id = make_endpoint(portal, receiver.url("/contrast"))["webhookEndpoint"]["id"]
    delivery = portal.call("POST", f"/v1/webhook-endpoints/{endpoint_id}/test")
    delivery_id = delivery["webhookDelivery"]["id"]
    portal.wait_for(
        "GET",
        f"/v1/webhook-deliveries/{delivery_id}",
        lambda b: b["webhookDelivery"]["status"] == "failed",
    )
    # (the check itself finds grey on white, 2.85:1, and passes the page's own ink)
    page.goto("/")
    page.get_by_label("Email").wait_for()
    probe = """(() => { const p = document.createElement("p"); p.id = "probe";
                        p.style.color = "#999999"; p.textContent = "probe";
                        document.querySelector("main").append(p); })()"""
    page.evaluate(probe)
    assert [p for p in page.evaluate(LOW_CONTRAST_JS) if "probe" in p] == ['p. "probe" 2.85']
    page.evaluate("document.getElementById('probe').remove()")
    # When an owner opens every page, and the sign-in page is seen signed out
    problems = {"/signin": page.evaluate(LOW_CONTRAST_JS)}
    sign_in(page, portal, "owner")
    for route in (*PAGES, f"/endpoints/{endpoint_id}", f"/deliveries/{delivery_id}"):
        page.goto(f"/portal/#{route}")
        page.locator("main h1").wait_for()
        loaded(page)
        page.locator("main details").evaluate_all("(all) => all.forEach((d) => (d.open = true))")
        problems[route] = page.evaluate(LOW_CONTRAST_JS)
    # Then no text anywhere is under AA
    assert {route: found for route, found in problems.items() if found} == {}


def test_hostile_names_are_shown_as_text(page: Any, portal: Portal, receiver: Receiver) -> None:
    # Given objects whose names and ids are markup (anyone with a key can set them)
    markup = '<img src=x onerror="window.__owned=1"><script>window.__owned=2</script>'
    portal.call(
        "POST",
        "/v1/webhook-endpoints",
        {"name": markup[:200], "url": receiver.url("/x"), "eventTypes": ["webhook.test"]},
    )
    portal.call(
        "POST",
        "/v1/deposit-accounts",
        {
            "externalUserId": f"<b>{uuid.uuid4().hex[:6]}</b><script>window.__owned=3</script>",
            "destination": {
                "chainId": 8453,
                "address": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
                "tokenAddress": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
            },
            "metadata": {"note": markup},
        },
    )
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    sign_in(page, portal, "owner")
    # When the pages that show them render
    for route in ("/", "/endpoints", "/accounts"):
        page.goto(f"/portal/#{route}")
        page.locator("main h1").wait_for()
        loaded(page)
        # Then the markup is text on the page, and none of it ran
        assert page.evaluate("window.__owned") is None, route
        assert page.locator("main img, main script, main b").count() == 0, route
        shown = page.locator("main").inner_text()
        assert "<script>window.__owned=" in shown, route
    assert dialogs == []


# -- money shown exactly (issue 23) ----------------------------------------------------


def test_a_deposit_shows_its_fee_and_net_exactly_and_links_its_transactions(
    page: Any, portal: Portal
) -> None:
    # Given a credited sandbox deposit whose fee is 0.00065 USD and net 9.99935 USD, as
    # the API sends them (the figures are set on the API's answer: a chain's flat fee is
    # not ours to choose here)
    user = f"user-{uuid.uuid4().hex[:8]}"
    destination = {
        "chainId": 8453,
        "address": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
        "tokenAddress": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
    }
    account = portal.call(
        "POST", "/v1/deposit-accounts", {"externalUserId": user, "destination": destination}
    )["depositAccount"]
    address = next(a for a in account["depositAddresses"] if a["chainId"] == 137)
    deposit = portal.call(
        "POST",
        "/v1/sandbox/deposits",
        {"depositAddress": address["address"], "chainId": 137, "asset": "USDC", "amount": "10"},
    )["deposit"]
    path = f"/v1/deposits/{deposit['id']}"
    credited = portal.wait_for("GET", path, lambda b: b["deposit"]["status"] == "credited")

    def exact_figures(route: Any) -> None:
        body = route.fetch().json()
        body["deposit"].update(amountUsd=10, settlementGasFeeUsd=0.00065, netAmountUsd=9.99935)
        route.fulfill(json=body)

    page.route(re.compile(rf".*/v1/deposits/{deposit['id']}$"), exact_figures)
    # When a viewer opens it
    sign_in(page, portal, "viewer")
    page.goto(f"/portal/#/deposits/{deposit['id']}")
    loaded(page)
    # Then the figures are the API's own digits, not rounded to cents
    details = page.locator("dl").first
    expect(details).to_contain_text("0.00065")
    expect(details).to_contain_text("9.99935")
    expect(details).to_contain_text("10.00")
    assert "10.00" not in details.inner_text().split("Net (USD)")[1].split("\n")[1]
    # And each transaction links to its chain's block explorer
    source = page.get_by_role("link", name=credited["deposit"]["sourceTxHash"])
    assert source.get_attribute("href") == (
        f"https://polygonscan.com/tx/{credited['deposit']['sourceTxHash']}"
    )
    credit = page.get_by_role("link", name=credited["deposit"]["creditTxHash"])
    assert credit.get_attribute("href") == (
        f"https://basescan.org/tx/{credited['deposit']['creditTxHash']}"
    )
