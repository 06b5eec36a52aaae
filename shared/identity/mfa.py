"""Members' second factor: TOTP codes (RFC 6238, `pyotp`) and one-time recovery codes.

Enrolment is two steps: `start_enrolment` makes a secret (kept pending, encrypted) and
shows it as an otpauth URL and its QR code; `confirm_enrolment` turns it on once the
member types a code their app computed from it, and hands out ten recovery codes,
shown once and stored only hashed.

A TOTP secret is encrypted at rest (`shared.secretbox`, its own key derived from
SETTLE_SECRET_KEY). A code is good for its 30 s step and one step either side (clock
drift), and once: the step of the last code accepted is kept, and a code is taken only
by a conditional UPDATE past it, so a code seen over a shoulder (or sent twice at once)
is refused. A recovery code is taken by a conditional UPDATE too: once each.
Guessing is throttled where codes are checked (sign-in, step-up: `signin_guard`).
"""

from __future__ import annotations

import base64
import functools
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

import pyotp
import segno
import sqlalchemy as sa
from sqlalchemy.orm import Session

from shared.api import field_error
from shared.errors import Conflict
from shared.identity.models import Member, RecoveryCode
from shared.identity.secrets import token_hash
from shared.ids import new_id
from shared.secretbox import SecretBox
from shared.timefmt import utcnow

#: The issuer authenticator apps show beside the member's email.
ISSUER = "Settle"
#: An enrolment not confirmed within this is started again.
ENROLMENT_TTL = timedelta(minutes=15)
#: Recovery codes handed out at once.
RECOVERY_CODES = 10
#: Time steps either side of now a code may come from (clock drift).
DRIFT_STEPS = 1
#: What a TOTP code looks like; anything else given as `code` is a recovery code.
TOTP_CODE = re.compile(r"^\d{6}$")
#: The two kinds of second factor (audit entries name which one was used).
TOTP, RECOVERY_CODE = "totp", "recovery_code"


@functools.lru_cache(maxsize=4)
def secret_box(secret_key: str) -> SecretBox:
    """The TOTP secrets' box: a key of its own, derived from SETTLE_SECRET_KEY."""
    return SecretBox(secret_key, salt=b"settle.totp.v1")


@dataclass(frozen=True)
class Enrolment:
    """A pending enrolment as shown once: the secret, its otpauth URL and QR code."""

    secret: str
    otpauth_url: str
    #: The QR code of the URL as an SVG `data:` URI (an <img> can show it).
    qr_svg: str
    expires_at: datetime


def start_enrolment(
    session: Session, member: Member, box: SecretBox, *, now: datetime | None = None
) -> Enrolment:
    """A new secret for `member`, pending until confirmed with a code (409 if on already)."""
    if member.mfa_enabled:
        raise Conflict("two-factor sign-in is on already; turn it off first to enrol again")
    now = now or utcnow()
    secret = pyotp.random_base32()  # 160 bits, as RFC 4226 recommends
    member.totp_pending_secret = box.encrypt(secret)
    member.totp_pending_at = now
    session.flush()
    url = pyotp.TOTP(secret).provisioning_uri(name=member.email, issuer_name=ISSUER)
    qr = segno.make(url, error="m").svg_data_uri(scale=5, border=2, dark="#111", light="#fff")
    return Enrolment(secret, url, qr, now + ENROLMENT_TTL)


def confirm_enrolment(
    session: Session, member: Member, box: SecretBox, code: str, *, now: datetime | None = None
) -> list[str]:
    """Turn two-factor sign-in on with a code from the pending secret; the recovery codes."""
    now = now or utcnow()
    if member.mfa_enabled:
        raise Conflict("two-factor sign-in is on already")
    pending, started = member.totp_pending_secret, member.totp_pending_at
    if pending is None or started is None or now - started > ENROLMENT_TTL:
        raise Conflict("no enrolment in progress (or it expired): start one first")
    step = matching_step(box.decrypt(pending), code, now)
    if step is None:
        raise field_error(
            "code", "is not the code your app shows for this secret; try the next one"
        )
    member.totp_secret = pending
    member.totp_enabled_at = now
    member.totp_last_step = step  # the confirming code signs nothing in later
    member.totp_pending_secret = None
    member.totp_pending_at = None
    session.flush()
    return replace_recovery_codes(session, member, now=now)


def disable(session: Session, member: Member) -> None:
    """Two-factor sign-in off: the secret and every recovery code go."""
    member.totp_secret = None
    member.totp_enabled_at = None
    member.totp_last_step = None
    member.totp_pending_secret = None
    member.totp_pending_at = None
    session.execute(sa.delete(RecoveryCode).where(RecoveryCode.member_id == member.id))
    session.flush()


def new_recovery_code() -> str:
    """80 random bits as 16 base32 characters in groups of four: `k3m9-...`."""
    raw = secrets.token_bytes(10)
    text = _b32(raw)
    return "-".join(text[i : i + 4] for i in range(0, 16, 4))


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).decode("ascii").lower()


def _normal(code: str) -> str:
    """A recovery code as hashed: lower case, without separators or spaces."""
    return re.sub(r"[\s-]", "", code).lower()


def replace_recovery_codes(
    session: Session, member: Member, *, now: datetime | None = None
) -> list[str]:
    """Ten new recovery codes (shown once); the member's earlier ones stop working."""
    now = now or utcnow()
    session.execute(sa.delete(RecoveryCode).where(RecoveryCode.member_id == member.id))
    codes = [new_recovery_code() for _ in range(RECOVERY_CODES)]
    session.add_all(
        RecoveryCode(
            id=new_id("rc"),
            member_id=member.id,
            code_hash=token_hash(_normal(code)),
            created_at=now,
        )
        for code in codes
    )
    session.flush()
    return codes


def recovery_codes_left(session: Session, member_id: str) -> int:
    return (
        session.scalar(
            sa.select(sa.func.count())
            .select_from(RecoveryCode)
            .where(RecoveryCode.member_id == member_id, RecoveryCode.used_at.is_(None))
        )
        or 0
    )


def matching_step(secret: str, code: str, now: datetime) -> int | None:
    """The time step (within the drift) whose code is `code`, or None."""
    if not TOTP_CODE.fullmatch(code):
        return None
    totp = pyotp.TOTP(secret)
    current = totp.timecode(now)
    for step in range(current - DRIFT_STEPS, current + DRIFT_STEPS + 1):
        if hmac.compare_digest(totp.generate_otp(step), code):
            return step
    return None


@dataclass(frozen=True)
class FactorCheck:
    """How a second factor went: the kind used (TOTP, RECOVERY_CODE) or why it failed."""

    used: str | None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.used is not None


def use_second_factor(
    session: Session, member: Member, box: SecretBox, code: str, *, now: datetime | None = None
) -> FactorCheck:
    """Check `code` (a TOTP code or a recovery code) for `member` and use it up."""
    now = now or utcnow()
    code = code.strip()
    if member.totp_secret is None:
        return FactorCheck(None, "no_second_factor")
    if TOTP_CODE.fullmatch(code):
        step = matching_step(box.decrypt(member.totp_secret), code, now)
        if step is None:
            return FactorCheck(None, "wrong_code")
        taken = session.execute(
            sa.update(Member)
            .where(
                Member.id == member.id,
                sa.or_(Member.totp_last_step.is_(None), Member.totp_last_step < step),
            )
            .values(totp_last_step=step)
            .execution_options(synchronize_session=False)
        )
        if not getattr(taken, "rowcount", 0):
            return FactorCheck(None, "code_reused")
        return FactorCheck(TOTP)
    used = session.execute(
        sa.update(RecoveryCode)
        .where(
            RecoveryCode.member_id == member.id,
            RecoveryCode.code_hash == token_hash(_normal(code)),
            RecoveryCode.used_at.is_(None),
        )
        .values(used_at=now)
        .returning(RecoveryCode.id)
        .execution_options(synchronize_session=False)
    ).first()
    if used is None:
        return FactorCheck(None, "wrong_code")
    return FactorCheck(RECOVERY_CODE)
