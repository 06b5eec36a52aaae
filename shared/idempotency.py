"""`Idempotency-Key` on POST: the same key and body within 24 h answer the first response.

A record is claimed (inserted, committed) before the view runs, so two concurrent
requests with one key cannot both act: the second gets 409. Responses below 500
are kept; after a 500 the claim is dropped so the client may retry. A database
failover before the work's COMMIT rolled it back whole: the claim is dropped too (503
service_unavailable, retry with the same key). One that cut the COMMIT itself may have
left it written: its 503 outcome_unknown is kept like any answer, so the same key never
runs the work twice (shared/failover.py).

Records hold no secret in plaintext: a response (a webhook secret, an API key) is
stored encrypted with a key derived from SETTLE_SECRET_KEY, and the request is
remembered by a keyed HMAC, not a plain hash of a body that may carry a password.
A record belongs to the principal that made it, never to its whole tenant: an API
key's id, a member and the role they acted with, or a portal link and its role. So
another tenant, a lesser key of the same tenant or a link's session sending the same
key and body runs its own request (meeting every check of its route) and never
receives a response made for someone else (a full-scope key, a signing secret); a
member whose role changed since is judged anew too. The decorator sits inside the
route's auth decorator, so authentication and the route's role or scope are checked
before any replay.

Records expire after 24 h: a claim ignores an older record, and every API process
deletes expired rows, a bounded batch at a time, at most once a minute (after
answering an idempotent request, so no request waits for it).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import wraps
from typing import Any, TypeVar

import sqlalchemy as sa
from flask import Flask, Response, current_app, g, request
from sqlalchemy.orm import Mapped, mapped_column

from shared import failover
from shared.db import Database, UTCDateTime, is_unique_violation
from shared.errors import (
    OUTCOME_UNKNOWN,
    ApiError,
    Conflict,
    IdempotencyKeyReused,
    InvalidRequest,
    error_response,
)
from shared.identity.principal import Principal
from shared.secretbox import SecretBox, SecretDecryptError
from shared.timefmt import utcnow

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

HEADER = "Idempotency-Key"
#: How long a key is remembered.
TTL = timedelta(hours=24)
MAX_KEY_LENGTH = 255
#: Extension key of the app's IdempotencyStore (see `install`).
APP_STORE = "settle.idempotency"
#: HKDF salt of the key that encrypts stored responses (never the webhook secrets' key).
BOX_SALT = b"settle-idempotency-records"
#: Each API process deletes expired records at most this often...
PURGE_INTERVAL_S = 60.0
#: ...and at most this many per round, so a backlog never makes one long transaction.
PURGE_BATCH = 1000
#: How long storing or releasing a claim is tried across a failover (the request waits).
SETTLE_RETRY_S = 5.0
#: A claim without an outcome: running, or cut by a database switch that left no
#: primary to record what happened (then it may be written: never run it again).
IN_PROGRESS = (
    "a request with {header} {key!r} is still in progress, or was cut by a database "
    "switch before its outcome could be recorded; check the resource (GET) before "
    "sending it again with a new {header}"
)
#: OpenAPI description of the header, for `blp.doc(parameters=[OPENAPI_PARAMETER])` on
#: every idempotent POST (which also documents 400 for a bad key and 409).
OPENAPI_PARAMETER = {
    "in": "header",
    "name": HEADER,
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH},
    "description": "The same key with the same body within 24 h returns the first "
    "response (`Idempotent-Replayed: true`); with another body, 409 idempotency_key_reused.",
}


class IdempotencyRecordMixin:
    """Columns of an idempotency table; each service declares its own table.

    `request_hash` is a keyed HMAC of the request, `response_body` a Fernet token of
    the response (see the module doc).
    """

    scope: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    key: Mapped[str] = mapped_column(sa.String(MAX_KEY_LENGTH), primary_key=True)
    request_hash: Mapped[str] = mapped_column(sa.String(64))
    status_code: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    response_body: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


@dataclass
class IdempotencyStore:
    """What the decorator needs from the app: its database, the box, the purge clock."""

    db: Database
    box: SecretBox
    clock: Callable[[], float] = time.monotonic
    _next_purge: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def purge_due(self) -> bool:
        """True at most once per PURGE_INTERVAL_S (for one caller of this process)."""
        with self._lock:
            now = self.clock()
            if now < self._next_purge:
                return False
            self._next_purge = now + PURGE_INTERVAL_S
            return True

    def purge(self, model: Any) -> None:
        """Delete one batch of expired records; a full batch makes the next one due now.

        Runs after a response was sent: a failure is logged and tried next round.
        """
        try:
            deleted = purge_expired(self.db, model)
        except sa.exc.SQLAlchemyError as err:
            log.warning("could not delete expired idempotency records: %s", err)
            return
        if deleted:
            log.info("deleted %d expired idempotency records", deleted)
        if deleted >= PURGE_BATCH:
            with self._lock:
                self._next_purge = 0.0  # a backlog: keep going with the next request


def install(app: Flask, db: Database, secret_key: str) -> None:
    """Give `app` its idempotency records: in `db`, sealed with `secret_key`."""
    app.extensions[APP_STORE] = IdempotencyStore(db, SecretBox(secret_key, salt=BOX_SALT))


def purge_expired(
    db: Database,
    model: type[IdempotencyRecordMixin],
    *,
    now: datetime | None = None,
    limit: int = PURGE_BATCH,
) -> int:
    """Delete up to `limit` records older than TTL, oldest first; return how many."""
    cutoff = (now or utcnow()) - TTL
    oldest = (
        sa.select(model.scope, model.key)
        .where(model.created_at < cutoff)
        .order_by(model.created_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    with db.transaction() as session:
        result = session.execute(
            sa.delete(model)
            .where(sa.tuple_(model.scope, model.key).in_(oldest))
            .execution_options(synchronize_session=False)
        )
    return int(result.rowcount or 0)


def principal_scope(principal: Principal) -> str:
    """Whose records these are: the key, or the member or link with the role it acts with.

    Ids are unique across tenants (a ULID with a kind prefix), so the tenant needs no
    place of its own; at most 30 + 1 + 9 characters, within the column's 64.
    """
    if principal.api_key_id is not None:
        return principal.api_key_id
    who = principal.link_id or principal.member_id
    if not who:
        raise ValueError("an idempotent route needs an authenticated principal")
    return f"{who}/{principal.role}"


def _fingerprint(box: SecretBox) -> str:
    message = request.method.encode() + b" " + request.path.encode() + b"\n"
    return box.digest(message + request.get_data(cache=True))


def idempotent(model: type[IdempotencyRecordMixin]) -> Callable[[F], F]:
    """Decorate a POST view (inside its auth decorator, so `g.principal` is set)."""

    def decorator(fn: F) -> F:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = request.headers.get(HEADER)
            if key is None:
                return fn(*args, **kwargs)
            if not 1 <= len(key) <= MAX_KEY_LENGTH or not key.isprintable():
                raise InvalidRequest(f"{HEADER} must be 1..{MAX_KEY_LENGTH} printable characters")
            store: IdempotencyStore = current_app.extensions[APP_STORE]
            db, box = store.db, store.box
            scope = principal_scope(g.principal)
            replay = _claim(db, box, model, scope, key, _fingerprint(box))
            if replay is not None:
                return replay
            try:
                response = current_app.make_response(fn(*args, **kwargs))
            except ApiError as err:
                response = error_response(err)
            except failover.CommitOutcomeUnknown as err:
                # It may be written: kept, so the key never runs it a second time.
                log.warning("%s %r cut while it committed: %s", HEADER, key, err.__cause__)
                response = error_response(OUTCOME_UNKNOWN)
            except BaseException:
                _settle(lambda: _release(db, model, scope, key), key)
                raise
            if response.status_code >= 500 and response.status_code != OUTCOME_UNKNOWN.status:
                _settle(lambda: _release(db, model, scope, key), key)
            else:
                _settle(lambda: _store(db, box, model, scope, key, response), key)
            if store.purge_due():
                response.call_on_close(lambda: store.purge(model))
            return response

        return wrapper  # type: ignore[return-value]

    return decorator


def _claim(
    db: Database, box: SecretBox, model: Any, scope: str, key: str, fingerprint: str
) -> Response | None:
    """Insert the claim; on a clash answer from the earlier request or refuse."""
    now = utcnow()
    for _ in range(2):
        try:
            with db.transaction() as session:
                session.execute(
                    sa.delete(model).where(
                        model.scope == scope, model.key == key, model.created_at < now - TTL
                    )
                )
                session.add(model(scope=scope, key=key, request_hash=fingerprint, created_at=now))
            return None
        except sa.exc.IntegrityError as exc:
            if not is_unique_violation(exc):
                raise
        with db.reader() as session:
            earlier = session.get(model, (scope, key))
            if earlier is None:
                continue  # expired and removed meanwhile: claim again
            if earlier.request_hash != fingerprint:
                raise IdempotencyKeyReused(
                    f"{HEADER} {key!r} was used with another request in the last 24 h"
                )
            if earlier.status_code is None:
                raise Conflict(IN_PROGRESS.format(header=HEADER, key=key))
            return Response(
                _open(box, key, earlier.response_body),
                status=earlier.status_code,
                mimetype="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
    raise Conflict(IN_PROGRESS.format(header=HEADER, key=key))


def _open(box: SecretBox, key: str, sealed: str | None) -> str:
    try:
        return box.decrypt(sealed or "")
    except SecretDecryptError:
        # Written under another SETTLE_SECRET_KEY: running the request again could act
        # twice, so refuse, as for a record we cannot match.
        raise Conflict(
            f"the first response to {HEADER} {key!r} cannot be read back (the secret key "
            "changed); send the request with a new key"
        ) from None


def _store(
    db: Database, box: SecretBox, model: Any, scope: str, key: str, response: Response
) -> None:
    body = response.get_data(as_text=True)
    json.loads(body or "null")  # only JSON bodies are replayed
    with db.transaction() as session:
        session.execute(
            sa.update(model)
            .where(model.scope == scope, model.key == key)
            .values(status_code=response.status_code, response_body=box.encrypt(body))
        )


def _settle(work: Callable[[], None], key: str) -> None:
    """Store or release a claim, across a failover for up to SETTLE_RETRY_S (both are
    safe to repeat). If no primary takes it by then the claim stays in progress: retries
    get 409 (see `_claim`) until it expires, never a second run."""
    try:
        failover.retry_idempotent(work, what=f"{HEADER} {key!r}", retry_for_s=SETTLE_RETRY_S)
    except Exception as err:
        if not failover.is_failover(err):
            raise
        log.error("%s %r stays in progress: no primary to record its outcome: %s", HEADER, key, err)


def _release(db: Database, model: Any, scope: str, key: str) -> None:
    with db.transaction() as session:
        session.execute(sa.delete(model).where(model.scope == scope, model.key == key))
