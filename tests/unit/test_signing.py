"""shared/signing.py: what a receiver relies on to trust a delivery."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from services.notifier.secrets import new_secret
from shared import signing
from shared.signing import (
    MalformedHeader,
    MissingHeader,
    SignatureMismatch,
    TimestampOutOfTolerance,
    compute,
    sign_headers,
    verify,
)

SECRET = "whsec_test-secret-one"
OTHER = "whsec_test-secret-two"
BODY = (
    b'{"id":"evt_1","type":"webhook.test","createdAt":"2026-01-01T00:00:00.000Z",'
    b'"tenantId":"t","data":{}}'
)
NOW = 1_800_000_000


def test_compute_is_hmac_sha256_of_timestamp_dot_body_keyed_with_the_whole_secret() -> None:
    # Given the rule of the interface: HMAC-SHA256(secret utf-8, "<ts>.<raw body>")
    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    # Then compute() is exactly that, as lower-case hex
    assert compute(SECRET, NOW, BODY) == expected
    assert compute(SECRET, str(NOW), BODY) == expected


def test_sign_then_verify_round_trip() -> None:
    # Given the headers of a delivery signed with one secret
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    # Then they carry the five headers and verify with that secret
    assert headers == {
        "Content-Type": "application/json",
        "x-service-signature": f"v1={compute(SECRET, NOW, BODY)}",
        "x-service-timestamp": str(NOW),
        "x-service-event-id": "evt_1",
        "x-service-delivery-id": "whd_1",
    }
    assert verify(SECRET, headers, BODY, now=NOW) == NOW


def test_two_secrets_sign_newest_first_and_either_verifies() -> None:
    # Given a delivery signed during a rotation overlap (new, then old)
    headers = sign_headers([OTHER, SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    # Then the header names both, newest first, and each secret verifies alone
    assert headers["x-service-signature"] == (
        f"v1={compute(OTHER, NOW, BODY)},v1={compute(SECRET, NOW, BODY)}"
    )
    assert verify(SECRET, headers, BODY, now=NOW) == NOW
    assert verify(OTHER, headers, BODY, now=NOW) == NOW
    # But a third secret does not
    with pytest.raises(SignatureMismatch):
        verify("whsec_unrelated", headers, BODY, now=NOW)


def test_header_names_are_case_insensitive_and_spaces_tolerated() -> None:
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    shouted = {k.upper(): v for k, v in headers.items()}
    shouted["X-SERVICE-SIGNATURE"] = "  " + shouted["X-SERVICE-SIGNATURE"] + " "
    assert verify(SECRET, shouted, BODY, now=NOW) == NOW


@pytest.mark.parametrize("skew", [-301, 301, -10_000, 10_000])
def test_timestamps_outside_the_tolerance_are_refused_both_ways(skew: int) -> None:
    # Given a delivery signed `skew` seconds away from the receiver's clock
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW + skew)
    # Then it is refused, even though the signature itself is right
    with pytest.raises(TimestampOutOfTolerance):
        verify(SECRET, headers, BODY, now=NOW)


@pytest.mark.parametrize("skew", [-300, -1, 0, 1, 300])
def test_timestamps_within_the_tolerance_are_accepted(skew: int) -> None:
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW + skew)
    assert verify(SECRET, headers, BODY, now=NOW) == NOW + skew


def test_a_custom_tolerance_applies() -> None:
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW - 20)
    with pytest.raises(TimestampOutOfTolerance):
        verify(SECRET, headers, BODY, tolerance=10, now=NOW)
    assert verify(SECRET, headers, BODY, tolerance=30, now=NOW) == NOW - 20


@pytest.mark.parametrize(
    "tamper",
    [
        lambda b: b + b" ",
        lambda b: b.replace(b"webhook.test", b"deposit.credited"),
        lambda b: b[:-1],
        lambda b: b"",
    ],
)
def test_a_tampered_body_is_refused(tamper: object) -> None:
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    with pytest.raises(SignatureMismatch):
        verify(SECRET, headers, tamper(BODY), now=NOW)  # type: ignore[operator]


def test_a_changed_timestamp_is_refused() -> None:
    # Given a valid signature moved onto another (fresh) timestamp: a replay attempt
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    headers["x-service-timestamp"] = str(NOW + 1)
    with pytest.raises(SignatureMismatch):
        verify(SECRET, headers, BODY, now=NOW)


@pytest.mark.parametrize("missing", ["x-service-signature", "x-service-timestamp"])
def test_missing_headers_are_refused(missing: str) -> None:
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    del headers[missing]
    with pytest.raises(MissingHeader):
        verify(SECRET, headers, BODY, now=NOW)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-service-timestamp", "not-a-number"),
        ("x-service-timestamp", "-5"),
        ("x-service-timestamp", "1.5"),
        ("x-service-timestamp", ""),
        ("x-service-signature", ""),
        ("x-service-signature", "sha256=abcdef"),
        ("x-service-signature", "v1="),
        ("x-service-signature", "v0=abc,v2=def"),
    ],
)
def test_malformed_headers_are_refused(name: str, value: str) -> None:
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    headers[name] = value
    with pytest.raises(MalformedHeader):
        verify(SECRET, headers, BODY, now=NOW)


def test_unknown_schemes_beside_v1_are_ignored() -> None:
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    headers["x-service-signature"] = "v2=whatever," + headers["x-service-signature"]
    assert verify(SECRET, headers, BODY, now=NOW) == NOW


def test_every_error_is_a_signature_error() -> None:
    for cls in (MissingHeader, MalformedHeader, TimestampOutOfTolerance, SignatureMismatch):
        assert issubclass(cls, signing.SignatureError)


# -- hostile input: verify() answers every bad delivery with a SignatureError ------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-service-signature", "v1=é" + "0" * 63),  # non-ASCII: compare_digest raised TypeError
        ("x-service-signature", "v1=\u0660" * 3),
        ("x-service-signature", "v1=" + "\udcff" * 64),  # a lone surrogate (from a bad decode)
        ("x-service-timestamp", "\u00b2"),  # "²".isdigit() is True, int("²") raised ValueError
        # NOW in Arabic-Indic digits: int() read it as NOW, so a correct signature passed
        ("x-service-timestamp", str(NOW).translate({0x30 + d: 0x0660 + d for d in range(10)})),
        ("x-service-timestamp", "9" * 5000),  # int() of a 5000-digit string raised ValueError
        ("x-service-timestamp", "1" * 30),
    ],
)
def test_garbage_headers_raise_only_signature_errors(name: str, value: str) -> None:
    # Given a delivery whose header is garbage a forger (or a broken proxy) could send
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    headers[name] = value
    # When it is verified, Then the answer is a SignatureError (a 400), never a crash (a 500)
    with pytest.raises(signing.SignatureError):
        verify(SECRET, headers, BODY, now=NOW)


@pytest.mark.parametrize("value", [b"v1=abc", None, 12345])
def test_header_values_that_are_not_text_are_malformed(value: object) -> None:
    # Given a header mapping from a framework that hands over bytes or other objects
    headers: dict[str, object] = dict(sign_headers([SECRET], BODY, "e", "w", timestamp=NOW))
    headers["x-service-signature"] = value
    with pytest.raises(MalformedHeader):
        verify(SECRET, headers, BODY, now=NOW)  # type: ignore[arg-type]


@pytest.mark.parametrize("secret", ["", None, b"whsec_bytes"])
def test_an_empty_or_missing_secret_refuses_everything(secret: object) -> None:
    # Given a delivery signed with the empty string, as a receiver whose secret variable is
    # unset (`os.environ.get(..., "")`) would check it
    forged = hmac.new(b"", f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    headers = {"x-service-signature": f"v1={forged}", "x-service-timestamp": str(NOW)}
    # When it is verified with an empty or missing secret, Then it is refused, not accepted
    with pytest.raises(signing.InvalidSecret):
        verify(secret, headers, BODY, now=NOW)  # type: ignore[arg-type]


def test_an_empty_secret_cannot_sign_either() -> None:
    # The sender side refuses it too, so no delivery is ever signed with ""
    with pytest.raises(signing.InvalidSecret):
        sign_headers([""], BODY, "evt_1", "whd_1", timestamp=NOW)


@pytest.mark.parametrize("body", ["text, not bytes", None, {"id": "evt_1"}])
def test_a_body_that_is_not_raw_bytes_is_refused(body: object) -> None:
    # Given a receiver that passes parsed or decoded data instead of the raw bytes
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    # Then verification fails closed with a SignatureError that says what to pass
    with pytest.raises(signing.SignatureError, match="raw"):
        verify(SECRET, headers, body, now=NOW)  # type: ignore[arg-type]


def test_bytearray_and_memoryview_bodies_verify() -> None:
    headers = sign_headers([SECRET], BODY, "evt_1", "whd_1", timestamp=NOW)
    assert verify(SECRET, headers, bytearray(BODY), now=NOW) == NOW
    assert verify(SECRET, headers, memoryview(BODY), now=NOW) == NOW


def test_the_new_errors_are_signature_errors() -> None:
    assert issubclass(signing.InvalidSecret, signing.SignatureError)


def test_the_standard_scheme_matches_the_specifications_example() -> None:
    # The example of the Standard Webhooks specification (its libraries' test vector)
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    header = signing.standard_signature_header(
        [secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body
    )
    assert header == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_new_secrets_are_in_the_form_standard_libraries_read() -> None:
    for _ in range(50):
        secret = new_secret()
        assert signing.is_standard_readable(secret) and len(signing.standard_key(secret)) == 32
    assert not signing.is_standard_readable("whsec_" + "a" * 43)  # the old URL-safe form
    for bad in ("", "whsec_", "whsec_!!!!"):
        with pytest.raises(signing.InvalidSecret):
            signing.standard_key(bad)
