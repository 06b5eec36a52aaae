"""Webhook endpoints: create, read, change, delete, rotate secrets; the signing secrets.

Every read and write is scoped to a tenant: another tenant's endpoint is as absent
as one that never existed. Deleting is soft (the row stays for the delivery log).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.notifier import urls
from services.notifier.models import (
    DISABLED,
    ENABLED,
    FAILED,
    PENDING,
    PER_ACCOUNT,
    RETRYING,
    Delivery,
    Endpoint,
)
from services.notifier.secrets import SecretBox, new_secret
from shared import signing, subscriptions
from shared.api import Page, field_error, keyset_page
from shared.errors import Conflict, NotFound
from shared.ids import new_id
from shared.timefmt import utcnow

#: Longest endpoint name.
MAX_NAME_LENGTH = 100
#: Longest overlap of an old secret after rotation (DESIGN.md: up to 24 h).
MAX_SECRET_OVERLAP_S = 86400
#: How long a rotated-out secret keeps signing when the caller does not say: a day, so
#: receivers can switch without refusing deliveries (0 asks for an immediate cut-over).
DEFAULT_SECRET_OVERLAP_S = MAX_SECRET_OVERLAP_S
#: Why an endpoint is disabled: by PATCH, or by the engine after days of failures.
DISABLED_MANUAL = "manual"
#: `last_error` of deliveries cancelled because their endpoint was deleted.
ENDPOINT_DELETED = "endpoint_deleted"
#: An ephemeral endpoint (`settle listen`'s) lives this long after its creation or last
#: renewal unless the request says otherwise; then it is gone (`live`, `expire_endpoints`).
DEFAULT_EPHEMERAL_TTL_S = 300
MIN_EPHEMERAL_TTL_S, MAX_EPHEMERAL_TTL_S = 5, 3600
#: Ephemeral endpoints a tenant may have at once (they do not count against the limit of
#: permanent ones, so they have their own).
MAX_EPHEMERAL_ENDPOINTS = 10
#: Bounds of an endpoint's `rateLimitPerSecond` (deliveries a second, per worker process).
MIN_RATE_LIMIT = 0.01
MAX_RATE_LIMIT = 1000.0
#: The values of an endpoint's `ordering` besides null.
ORDERINGS = (PER_ACCOUNT,)


class _Unchanged:
    """PATCH left a field out (where None has a meaning of its own)."""


UNCHANGED = _Unchanged()
#: What our ids (`we_...`, `whd_...`, `evt_...`) can look like; nothing else is looked up.
ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,120}$")


def live() -> sa.ColumnElement[bool]:
    """The endpoint exists: not deleted, and (ephemeral) not expired. An expired ephemeral
    endpoint is as gone as a deleted one even before the sweeper deletes it."""
    return sa.and_(
        Endpoint.deleted_at.is_(None),
        sa.or_(Endpoint.expires_at.is_(None), Endpoint.expires_at > sa.func.now()),
    )


def is_plausible_id(value: str) -> bool:
    """False for text no id of ours has (e.g. a NUL byte, which PostgreSQL refuses)."""
    return bool(ID_PATTERN.fullmatch(value))


def checked_url(url: str, *, allow_private: bool, field: str = "url") -> str:
    """`url` if the URL policy admits it, else a 400 naming the field."""
    try:
        return urls.check_url(url, allow_private=allow_private)
    except urls.UrlRejected as err:
        raise field_error(field, str(err)) from None


def checked_name(name: str, field: str = "name") -> str:
    if not name.strip():
        raise field_error(field, "must not be blank")
    if len(name) > MAX_NAME_LENGTH:
        raise field_error(field, f"must be at most {MAX_NAME_LENGTH} characters")
    if any(not ch.isprintable() for ch in name):
        raise field_error(field, "must not contain control characters")
    return name


def checked_event_types(event_types: Iterable[str], field: str = "eventTypes") -> list[str]:
    """Known types or patterns (`*`, `deposit.*`: shared/subscriptions.py), duplicates
    dropped, first-seen order kept; at least one."""
    kept: list[str] = []
    for event_type in event_types:
        problem = subscriptions.problem(event_type)
        if problem is not None:
            raise field_error(field, problem)
        if event_type not in kept:
            kept.append(event_type)
    if not kept:
        raise field_error(field, "subscribe to at least one event type")
    return kept


def checked_rate_limit(value: float | None, field: str = "rateLimitPerSecond") -> float | None:
    """None (no limit), or a number of deliveries a second within the bounds."""
    if value is None:
        return None
    if isinstance(value, bool) or not MIN_RATE_LIMIT <= value <= MAX_RATE_LIMIT:
        raise field_error(field, f"must be a number from {MIN_RATE_LIMIT} to {MAX_RATE_LIMIT:.0f}")
    return float(value)


def checked_scheme(value: str, field: str = "signatureScheme") -> str:
    if value not in signing.SIGNATURE_SCHEMES:
        raise field_error(field, "must be " + " or ".join(signing.SIGNATURE_SCHEMES))
    return value


def set_scheme(endpoint: Endpoint, scheme: str, box: Decrypter) -> None:
    """Switch the signature scheme; `standard` needs a secret its libraries can read."""
    scheme = checked_scheme(scheme)
    if scheme == signing.STANDARD and not signing.is_standard_readable(
        box.decrypt(endpoint.secret_encrypted)
    ):
        raise Conflict(
            "this endpoint's secret predates Standard Webhooks and its libraries cannot "
            "read it: rotate the secret (POST .../rotate-secret), then set signatureScheme"
        )
    endpoint.signature_scheme = scheme


def checked_ordering(value: str | None, field: str = "ordering") -> str | None:
    """None (each delivery on its own) or `per_account`."""
    if value is not None and value not in ORDERINGS:
        raise field_error(field, f"must be one of {', '.join(ORDERINGS)}, or null")
    return value


def _lock_tenant(session: Session, tenant_id: str) -> None:
    """Serialize endpoint creation per tenant so the cap holds under concurrency."""
    session.execute(
        sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
        {"key": f"webhook_endpoints:{tenant_id}"},
    )


def count_endpoints(session: Session, tenant_id: str, *, ephemeral: bool = False) -> int:
    """The tenant's live permanent endpoints (or ephemeral ones): each kind has its cap."""
    kind = Endpoint.expires_at.is_not(None) if ephemeral else Endpoint.expires_at.is_(None)
    return (
        session.scalar(
            sa.select(sa.func.count())
            .select_from(Endpoint)
            .where(Endpoint.tenant_id == tenant_id, live(), kind)
        )
        or 0
    )


def checked_ttl(value: int, field: str = "ephemeralTtlSeconds") -> int:
    if isinstance(value, bool) or not MIN_EPHEMERAL_TTL_S <= value <= MAX_EPHEMERAL_TTL_S:
        raise field_error(
            field, f"must be a whole number from {MIN_EPHEMERAL_TTL_S} to {MAX_EPHEMERAL_TTL_S}"
        )
    return value


def create_endpoint(
    session: Session,
    box: SecretBox,
    tenant_id: str,
    *,
    name: str,
    url: str,
    event_types: Sequence[str],
    allow_private: bool,
    max_endpoints: int,
    rate_limit_per_second: float | None = None,
    signature_scheme: str = signing.SETTLE,
    ordering: str | None = None,
    ephemeral_ttl_s: int | None = None,
    now: datetime | None = None,
) -> tuple[Endpoint, str]:
    """A new enabled endpoint and its secret (the only time it is seen in clear).

    With `ephemeral_ttl_s` it is ephemeral: it expires that long after its creation or
    last renewal (`renew`), and counts against its own cap, not the endpoint limit.
    """
    name = checked_name(name)
    url = checked_url(url, allow_private=allow_private)
    kept_types = checked_event_types(event_types)
    scheme = checked_scheme(signature_scheme)
    ttl = None if ephemeral_ttl_s is None else checked_ttl(ephemeral_ttl_s)
    _lock_tenant(session, tenant_id)
    if ttl is not None:
        if count_endpoints(session, tenant_id, ephemeral=True) >= MAX_EPHEMERAL_ENDPOINTS:
            raise Conflict(
                f"a tenant may have at most {MAX_EPHEMERAL_ENDPOINTS} ephemeral webhook "
                "endpoints at once; stop a `settle listen` or let one expire"
            )
    elif count_endpoints(session, tenant_id) >= max_endpoints:
        raise Conflict(
            f"a tenant may have at most {max_endpoints} webhook endpoints; delete one first"
        )
    now = now or utcnow()
    secret = new_secret()
    endpoint = Endpoint(
        id=new_id("we"),
        tenant_id=tenant_id,
        name=name,
        url=url,
        event_types=kept_types,
        status=ENABLED,
        disabled_reason=None,
        secret_encrypted=box.encrypt(secret),
        previous_secret_encrypted=None,
        previous_secret_expires_at=None,
        failing_since=None,
        failed_attempts=0,
        failing_notified_at=None,
        rate_limit_per_second=checked_rate_limit(rate_limit_per_second),
        signature_scheme=scheme,
        expires_at=None if ttl is None else now + timedelta(seconds=ttl),
        ordering=checked_ordering(ordering),
        created_at=now,
        updated_at=now,
        deleted_at=None,
    )
    session.add(endpoint)
    session.flush()
    return endpoint, secret


def get_endpoint(
    session: Session, tenant_id: str | None, endpoint_id: str, *, for_update: bool = False
) -> Endpoint:
    """The tenant's live endpoint (`tenant_id` None: any tenant's, for ops) or 404."""
    if not is_plausible_id(endpoint_id):
        raise NotFound(f"no webhook endpoint {endpoint_id!r}")
    query = sa.select(Endpoint).where(Endpoint.id == endpoint_id, live())
    if tenant_id is not None:
        query = query.where(Endpoint.tenant_id == tenant_id)
    if for_update:
        query = query.with_for_update()
    endpoint = session.scalar(query)
    if endpoint is None:
        raise NotFound(f"no webhook endpoint {endpoint_id}")
    return endpoint


def list_endpoints(
    session: Session, tenant_id: str | None, *, limit: int, cursor: str | None = None
) -> Page[Endpoint]:
    """Live endpoints, newest first (ids sort by creation time)."""
    query = sa.select(Endpoint).where(live())
    if tenant_id is not None:
        query = query.where(Endpoint.tenant_id == tenant_id)
    return keyset_page(session, query, Endpoint.id, limit=limit, cursor=cursor)


def update_endpoint(
    endpoint: Endpoint,
    *,
    name: str | None = None,
    url: str | None = None,
    event_types: Sequence[str] | None = None,
    status: str | None = None,
    rate_limit_per_second: float | _Unchanged | None = UNCHANGED,
    signature_scheme: str | None = None,
    box: Decrypter | None = None,
    ordering: str | _Unchanged | None = UNCHANGED,
    allow_private: bool,
    now: datetime | None = None,
) -> Endpoint:
    """Apply a PATCH: any subset of name, url, eventTypes, status, rateLimitPerSecond
    (None removes the limit; UNCHANGED, the default, leaves it), signatureScheme (`box`
    reads the secret to check that the scheme can use it), ordering (None: none).

    A change of ordering applies to deliveries made from then on: those made before
    keep the order they were made with."""
    if name is not None:
        endpoint.name = checked_name(name)
    if url is not None:
        endpoint.url = checked_url(url, allow_private=allow_private)
    if event_types is not None:
        endpoint.event_types = checked_event_types(event_types)
    if status is not None:
        set_status(endpoint, status)
    if not isinstance(rate_limit_per_second, _Unchanged):
        endpoint.rate_limit_per_second = checked_rate_limit(rate_limit_per_second)
    if signature_scheme is not None:
        assert box is not None, "the secret box checks the secret suits the scheme"
        set_scheme(endpoint, signature_scheme, box)
    if not isinstance(ordering, _Unchanged):
        endpoint.ordering = checked_ordering(ordering)
    endpoint.updated_at = now or utcnow()
    return endpoint


def audited(endpoint: Endpoint) -> dict[str, object]:
    """What the audit log keeps of an endpoint (never a secret)."""
    rate = endpoint.rate_limit_per_second
    return {
        "name": endpoint.name,
        "url": endpoint.url,
        "eventTypes": list(endpoint.event_types),
        "status": endpoint.status,
        # As text: the log's canonical form has no floats (shared/audit/chain.py).
        "rateLimitPerSecond": None if rate is None else repr(rate),
        "signatureScheme": endpoint.signature_scheme,
        "ordering": endpoint.ordering,
    }


def set_status(endpoint: Endpoint, status: str, *, reason: str = DISABLED_MANUAL) -> None:
    """Enable or disable. Enabling a disabled endpoint forgets the failure streak that may
    have disabled it (and that the tenant was told of: a new run is told anew)."""
    if status == ENABLED:
        if endpoint.status != ENABLED:
            endpoint.failing_since = None
            endpoint.failed_attempts = 0
            endpoint.failing_notified_at = None
        endpoint.status = ENABLED
        endpoint.disabled_reason = None
    elif status == DISABLED:
        if endpoint.status != DISABLED:
            endpoint.disabled_reason = reason
        endpoint.status = DISABLED
    else:
        raise field_error("status", "must be enabled or disabled")


def delete_endpoint(session: Session, endpoint: Endpoint, now: datetime | None = None) -> int:
    """Soft-delete; unfinished deliveries stop (failed, `endpoint_deleted`). Returns how many."""
    now = now or utcnow()
    endpoint.deleted_at = now
    endpoint.updated_at = now
    result = session.execute(
        sa.update(Delivery)
        .where(Delivery.endpoint_id == endpoint.id, Delivery.status.in_((PENDING, RETRYING)))
        .values(
            status=FAILED,
            next_attempt_at=None,
            lease_until=None,
            last_error=ENDPOINT_DELETED,
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def renew(endpoint: Endpoint, ttl_s: int, now: datetime | None = None) -> Endpoint:
    """An ephemeral endpoint lives `ttl_s` more from now (409 for a permanent one)."""
    if endpoint.expires_at is None:
        raise Conflict(f"webhook endpoint {endpoint.id} is not ephemeral: it never expires")
    now = now or utcnow()
    endpoint.expires_at = now + timedelta(seconds=checked_ttl(ttl_s, "ttlSeconds"))
    endpoint.updated_at = now
    return endpoint


def expire_endpoints(session: Session, now: datetime | None = None, limit: int = 100) -> list[str]:
    """Delete ephemeral endpoints whose time ran out (their unfinished deliveries stop, as
    for any deleted endpoint); the ids deleted. The sweeper calls it every round."""
    now = now or utcnow()
    expired = session.scalars(
        sa.select(Endpoint)
        .where(Endpoint.deleted_at.is_(None), Endpoint.expires_at <= now)
        .order_by(Endpoint.expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    for endpoint in expired:
        delete_endpoint(session, endpoint, now)
    return [endpoint.id for endpoint in expired]


def rotate_secret(
    endpoint: Endpoint,
    box: SecretBox,
    *,
    previous_expires_in_s: int = DEFAULT_SECRET_OVERLAP_S,
    now: datetime | None = None,
) -> str:
    """A new secret; the current one stays valid `previous_expires_in_s` more (0: none).

    Only one previous secret is kept: rotating again drops the one before.
    """
    if not 0 <= previous_expires_in_s <= MAX_SECRET_OVERLAP_S:
        raise field_error(
            "previousSecretExpiresInSeconds", f"must be between 0 and {MAX_SECRET_OVERLAP_S}"
        )
    now = now or utcnow()
    secret = new_secret()
    if previous_expires_in_s > 0:
        endpoint.previous_secret_encrypted = endpoint.secret_encrypted
        endpoint.previous_secret_expires_at = now + timedelta(seconds=previous_expires_in_s)
    else:
        endpoint.previous_secret_encrypted = None
        endpoint.previous_secret_expires_at = None
    endpoint.secret_encrypted = box.encrypt(secret)
    endpoint.updated_at = now
    return secret


class SecretFields(Protocol):
    """The secret columns of an endpoint (the ORM row or a plain view of it)."""

    @property
    def secret_encrypted(self) -> str: ...
    @property
    def previous_secret_encrypted(self) -> str | None: ...
    @property
    def previous_secret_expires_at(self) -> datetime | None: ...


class Decrypter(Protocol):
    def decrypt(self, token: str) -> str: ...


def previous_secret_expires_at(
    endpoint: SecretFields, now: datetime | None = None
) -> datetime | None:
    """When the previous secret stops signing, or None when there is none (or it lapsed)."""
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret_encrypted is None or expires is None:
        return None
    return expires if expires > (now or utcnow()) else None


def signing_secrets(
    endpoint: SecretFields, box: Decrypter, now: datetime | None = None
) -> list[str]:
    """Secrets that sign a delivery now: the current one, then the previous while valid."""
    secrets = [box.decrypt(endpoint.secret_encrypted)]
    if previous_secret_expires_at(endpoint, now) is not None:
        assert endpoint.previous_secret_encrypted is not None
        secrets.append(box.decrypt(endpoint.previous_secret_encrypted))
    return secrets
