"""settle_webhooks.verify: fixed vectors (computed with openssl), hostile inputs, real deliveries.

Real deliveries: `SETTLE_WEBHOOK_VECTORS` names a JSON file of deliveries Settle made
(Settle's test suite writes it and runs this suite; see clients/README.md). Without
it those tests skip, except in CI (`CI` set), where a missing file fails.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from settle_webhooks import (
    InvalidSignature,
    MalformedHeader,
    MissingHeader,
    TimestampOutOfTolerance,
    WebhookVerificationError,
    sign,
    verify,
)

TS = 1700000000
#: 1700000000 in Arabic-Indic digits: str.isdigit() says yes, int() parses it.
ARABIC_TS = "\u0661\u0667" + "\u0660" * 8
BODY = b'{"id":"evt_1","type":"webhook.test"}'
SECRET = "whsec_test_secret"
#: printf '1700000000.{"id":"evt_1","type":"webhook.test"}' \
#:   | openssl dgst -sha256 -hmac whsec_test_secret
EXPECTED = "300fe9a62e4c5c166d1ecf49f67cd28c64436b147d91784ac110bd597486ec23"


def headers(signature: str, timestamp: object = TS) -> dict[str, str]:
    return {"x-service-signature": signature, "x-service-timestamp": str(timestamp)}


def test_sign_matches_an_independent_hmac() -> None:
    assert sign(SECRET, TS, BODY) == EXPECTED
    # Non-ASCII secret and body: both are UTF-8 bytes (openssl, see the module notes)
    body = '{"id":"evt_1","note":"grüße"}'.encode()
    expected = "a525968241b2798bece81b582f96da67c2925ae683dbbd4efb8bb7e12f5a889f"
    assert sign("whsec_tëst", TS, body) == expected


def test_a_genuine_delivery_returns_its_event() -> None:
    event = verify(SECRET, headers(f"v1={EXPECTED}"), BODY, now=TS + 5)
    assert event == {"id": "evt_1", "type": "webhook.test"}


def test_headers_in_any_case_and_as_pairs() -> None:
    pairs = [("X-Service-Signature", f"v1={EXPECTED}"), ("X-SERVICE-TIMESTAMP", str(TS))]
    assert verify(SECRET, pairs, BODY, now=TS)["id"] == "evt_1"
    assert verify(SECRET, dict(pairs), BODY.decode(), now=TS)["id"] == "evt_1"


@pytest.mark.parametrize(
    "value",
    [
        f"v1={EXPECTED},v1={'0' * 64}",  # rotation: the new secret first
        f"v1={'0' * 64},v1={EXPECTED}",  # ... or second
        f" v1={'0' * 64} , v1={EXPECTED} ",  # spaces
        f"v0=abc,v1={EXPECTED}",  # an unknown scheme beside ours
    ],
)
def test_any_matching_v1_value_is_enough(value: str) -> None:
    assert verify(SECRET, headers(value), BODY, now=TS)["id"] == "evt_1"


@pytest.mark.parametrize(
    ("name", "secret", "hdrs", "body", "error"),
    [
        ("tampered body", SECRET, headers(f"v1={EXPECTED}"), BODY + b" ", InvalidSignature),
        ("other secret", "whsec_other", headers(f"v1={EXPECTED}"), BODY, InvalidSignature),
        ("upper-case hex", SECRET, headers(f"v1={EXPECTED.upper()}"), BODY, InvalidSignature),
        ("truncated", SECRET, headers(f"v1={EXPECTED[:32]}"), BODY, InvalidSignature),
        ("no v1", SECRET, headers(f"v2={EXPECTED}"), BODY, MalformedHeader),
        ("empty v1", SECRET, headers("v1="), BODY, MalformedHeader),
        ("non-ASCII value", SECRET, headers("v1=é" * 3), BODY, MalformedHeader),
        ("bare hex", SECRET, headers(EXPECTED), BODY, MalformedHeader),
        ("no signature", SECRET, {"x-service-timestamp": str(TS)}, BODY, MissingHeader),
        ("no timestamp", SECRET, {"x-service-signature": f"v1={EXPECTED}"}, BODY, MissingHeader),
        ("timestamp text", SECRET, headers(f"v1={EXPECTED}", "soon"), BODY, MalformedHeader),
        (
            "timestamp float",
            SECRET,
            headers(f"v1={EXPECTED}", "1700000000.0"),
            BODY,
            MalformedHeader,
        ),
        ("negative", SECRET, headers(f"v1={EXPECTED}", "-1700000000"), BODY, MalformedHeader),
        ("huge header", SECRET, headers("v1=" + "a" * 10_000), BODY, MalformedHeader),
        (
            "unicode digits",
            SECRET,
            headers(f"v1={EXPECTED}", ARABIC_TS),
            BODY,
            MalformedHeader,
        ),
    ],
)
def test_forged_and_broken_deliveries_are_refused(
    name: str, secret: str, hdrs: dict[str, str], body: bytes, error: type[Exception]
) -> None:
    with pytest.raises(error):
        verify(secret, hdrs, body, now=TS)


def test_the_timestamp_must_be_within_tolerance_both_ways() -> None:
    good = headers(f"v1={EXPECTED}")
    assert verify(SECRET, good, BODY, now=TS + 300)["id"] == "evt_1"
    assert verify(SECRET, good, BODY, now=TS - 300)["id"] == "evt_1"
    for now in (TS + 301, TS - 301, TS + 10**9):
        with pytest.raises(TimestampOutOfTolerance):
            verify(SECRET, good, BODY, now=now)
    # The caller may narrow it
    with pytest.raises(TimestampOutOfTolerance):
        verify(SECRET, good, BODY, now=TS + 61, tolerance=60)


def test_a_stale_delivery_is_refused_before_its_signature_is_even_checked() -> None:
    # A replay of a captured delivery fails the same way whatever the secret
    with pytest.raises(TimestampOutOfTolerance):
        verify("whsec_wrong", headers(f"v1={EXPECTED}"), BODY, now=TS + 3600)


@pytest.mark.parametrize("secret", ["", None, b"whsec_bytes"])
def test_an_empty_or_missing_secret_is_a_configuration_error(secret: Any) -> None:
    # Never "verified" with an empty key (anyone can sign with an empty key)
    empty_signed = sign("x", TS, BODY)  # any signature at all
    with pytest.raises(ValueError, match="secret"):
        verify(secret, headers(f"v1={empty_signed}"), BODY, now=TS)


def test_a_genuine_signature_over_a_non_json_body_is_still_refused() -> None:
    body = b"not json"
    with pytest.raises(WebhookVerificationError):
        verify(SECRET, headers(f"v1={sign(SECRET, TS, body)}"), body, now=TS)


# -- deliveries Settle made ---------------------------------------------------------


def _vectors() -> list[dict[str, Any]]:
    path = os.environ.get("SETTLE_WEBHOOK_VECTORS")
    if not path:
        if os.environ.get("CI"):
            pytest.fail("SETTLE_WEBHOOK_VECTORS is not set (CI must test real deliveries)")
        pytest.skip("SETTLE_WEBHOOK_VECTORS not set: no real deliveries to check")
    vectors: list[dict[str, Any]] = json.loads(Path(path).read_text(encoding="utf-8"))
    assert vectors, "the vectors file is empty"
    return vectors


def test_every_real_delivery_verifies_and_every_forgery_fails() -> None:
    vectors = _vectors()
    assert any(v["valid"] for v in vectors) and any(not v["valid"] for v in vectors)
    for vector in vectors:
        body = base64.b64decode(vector["body"])
        if vector["valid"]:
            event = verify(vector["secret"], vector["headers"], body, now=vector["now"])
            assert event["id"] == vector["headers"]["x-service-event-id"], vector["name"]
        else:
            with pytest.raises(WebhookVerificationError):
                verify(vector["secret"], vector["headers"], body, now=vector["now"])


def test_the_standard_scheme_matches_the_specifications_example() -> None:
    # The Standard Webhooks specification's example (its libraries' test vector)
    from settle_webhooks import sign_standard, verify_standard

    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    value = sign_standard(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert value == "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": f"v1,bm90IGl0 v1,{value}",
    }
    assert verify_standard(secret, headers, body, now=1614265330) == {"test": 2432232314}
    with pytest.raises(InvalidSignature):
        verify_standard(secret, {**headers, "webhook-id": "msg_other"}, body, now=1614265330)
