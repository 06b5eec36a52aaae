"""The portal's statement download, in Chromium: the files a member saves verify with the
published key and `cryptography` alone, and their totals add up."""

from __future__ import annotations

import base64
import csv
import io
import json
import uuid
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from tests.browser.conftest import Portal, loaded, screenshot, sign_in

pytestmark = pytest.mark.browser

#: The browser's local time of an ISO instant, as a datetime-local input takes it.
LOCAL_JS = """iso => {
  const d = new Date(iso), p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}` +
    `T${p(d.getHours())}:${p(d.getMinutes())}`;
}"""
AMOUNTS = ("125.50", "3.75")


def credited_deposits(portal: Portal) -> list[dict[str, Any]]:
    """Two sandbox deposits of a new account, credited by the pipeline."""
    account = portal.call(
        "POST",
        "/v1/deposit-accounts",
        {
            "externalUserId": f"=cmd-{uuid.uuid4().hex[:6]}",  # a formula, to a spreadsheet
            "destination": {
                "chainId": 8453,
                "address": "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
                "tokenAddress": "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
            },
        },
    )["depositAccount"]
    address = next(a for a in account["depositAddresses"] if a["chainId"] == 8453)
    made = []
    for amount in AMOUNTS:
        body = {"depositAddress": address["address"], "chainId": 8453, "asset": "USDC"}
        deposit = portal.call("POST", "/v1/sandbox/deposits", {**body, "amount": amount})
        made.append(deposit["deposit"])
    return [
        portal.wait_for(
            "GET", f"/v1/deposits/{d['id']}", lambda b: b["deposit"]["status"] == "credited"
        )["deposit"]
        for d in made
    ]


def saved(page: Any, click: Any) -> bytes:
    """The bytes of the file a click makes the browser save."""
    with page.expect_download() as info:
        click()
    return Path(info.value.path()).read_bytes()


def verifies(key: Ed25519PublicKey, body: bytes, signature: bytes) -> bool:
    try:
        key.verify(signature, body)
    except InvalidSignature:
        return False
    return True


def test_a_viewer_downloads_a_statement_that_an_auditor_can_verify(
    page: Any, portal: Portal
) -> None:
    # Given two credited deposits
    deposits = credited_deposits(portal)
    # And the public key as an auditor fetches it: no credentials
    published = requests.get(portal.base + "/v1/statements/key", timeout=30).json()["key"]
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(published["publicKey"]))
    # When a viewer opens Statements and downloads the CSV of a period holding them
    sign_in(page, portal, "viewer")
    page.locator("#nav").get_by_role("link", name="Statements").click()
    page.get_by_role("heading", name="Statements", exact=True).wait_for()
    loaded(page)
    page.get_by_label("From").fill(page.evaluate(LOCAL_JS, deposits[0]["createdAt"]))
    body = saved(page, lambda: page.get_by_role("button", name="Download statement").click())
    ready = page.get_by_role("region", name="Statement downloaded")
    ready.wait_for()
    screenshot(page, "statements")
    signature = saved(page, lambda: ready.get_by_role("link", name="Save the signature").click())
    pem = saved(page, lambda: page.get_by_role("link", name="Save the public key (PEM)").click())
    # Then the saved statement verifies with the saved signature and the published key
    assert len(signature) == 64
    assert verifies(key, body, signature)
    saved_key = load_pem_public_key(pem)
    assert isinstance(saved_key, Ed25519PublicKey)
    assert saved_key.public_bytes_raw() == key.public_bytes_raw()
    # And a tampered byte does not
    tampered = bytearray(body)
    tampered[body.index(b"125.50")] ^= 0x01
    assert not verifies(key, bytes(tampered), signature)
    # And the page names the key that signed it
    assert published["keyId"] in ready.inner_text()
    # And it is the CSV statement holding both deposits, whose totals add up
    rows = list(csv.DictReader(io.StringIO(body.decode("utf-8"), newline="")))
    assert rows[0]["record"] == "statement" and rows[0]["key_id"] == published["keyId"]
    listed = {r["deposit_id"]: r for r in rows if r["record"] == "deposit"}
    for deposit in deposits:
        row = listed[deposit["id"]]
        assert row["amount"] in AMOUNTS and row["credit_tx_hash"] == deposit["creditTxHash"]
        assert row["source_block_hash"] == deposit["sourceBlockHash"]
        assert row["external_user_id"] == "'" + deposit["externalUserId"]  # never a formula
    sums: dict[str, Decimal] = defaultdict(Decimal)
    for row in listed.values():
        sums[row["token_address"]] += Decimal(row["amount"])
    by_record = {(r["record"], r["token_address"]): r for r in rows if r["record"] != "deposit"}
    for token, total in sums.items():
        opening, period = by_record[("opening", token)], by_record[("period", token)]
        closing = by_record[("closing", token)]
        assert Decimal(period["amount"]) == total
        assert Decimal(closing["amount"]) == Decimal(opening["amount"]) + total

    # When the viewer asks for JSON instead
    page.get_by_label("Format").select_option("json")
    body = saved(page, lambda: page.get_by_role("button", name="Download statement").click())
    ready = page.get_by_role("region", name="Statement downloaded")
    signature = saved(page, lambda: ready.get_by_role("link", name="Save the signature").click())
    # Then it verifies too, and lists the same deposits
    assert verifies(key, body, signature)
    statement = json.loads(body)["statement"]
    assert {d["id"] for d in deposits} <= {d["id"] for d in statement["deposits"]}

    # When the period is backwards, the page says so in place and saves nothing
    page.get_by_label("To").fill(page.evaluate(LOCAL_JS, "2020-01-01T00:00:00Z"))
    page.get_by_role("button", name="Download statement").click()
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "invalid_request" in alert.inner_text() and "from" in alert.inner_text()
    assert page.get_by_role("region", name="Statement downloaded").count() == 0
