"""`Idempotency-Key` on POST: the same key and body within 24 h answer the first response.

A record is claimed (inserted, committed) before the view runs, so two concurrent
requests with one key cannot both act: the second gets 409. Responses below 500
are kept; after a 500 the claim is dropped so the client may retry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import wraps
from typing import Any, TypeVar

import sqlalchemy as sa
from flask import Response, current_app, g, request
from sqlalchemy.orm import Mapped, mapped_column

from shared.db import Database, UTCDateTime, is_unique_violation
from shared.errors import ApiError, Conflict, IdempotencyKeyReused, InvalidRequest, error_response
from shared.timefmt import utcnow

F = TypeVar("F", bound=Callable[..., Any])

HEADER = "Idempotency-Key"
#: How long a key is remembered.
TTL = timedelta(hours=24)
MAX_KEY_LENGTH = 255
#: Extension key under which an app keeps its own database.
APP_DB = "settle.db"
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
    """Columns of an idempotency table; each service declares its own table."""

    scope: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    key: Mapped[str] = mapped_column(sa.String(MAX_KEY_LENGTH), primary_key=True)
    request_hash: Mapped[str] = mapped_column(sa.String(64))
    status_code: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    response_body: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


def _request_hash() -> str:
    digest = hashlib.sha256()
    digest.update(request.method.encode() + b" " + request.path.encode() + b"\n")
    digest.update(request.get_data(cache=True))
    return digest.hexdigest()


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
            db: Database = current_app.extensions[APP_DB]
            scope = g.principal.tenant_id
            fingerprint = _request_hash()
            replay = _claim(db, model, scope, key, fingerprint)
            if replay is not None:
                return replay
            try:
                response = current_app.make_response(fn(*args, **kwargs))
            except ApiError as err:
                response = error_response(err)
            except BaseException:
                _release(db, model, scope, key)
                raise
            if response.status_code >= 500:
                _release(db, model, scope, key)
            else:
                _store(db, model, scope, key, response)
            return response

        return wrapper  # type: ignore[return-value]

    return decorator


def _claim(db: Database, model: Any, scope: str, key: str, fingerprint: str) -> Response | None:
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
                raise Conflict(f"a request with {HEADER} {key!r} is still in progress")
            return Response(
                earlier.response_body,
                status=earlier.status_code,
                mimetype="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
    raise Conflict(f"a request with {HEADER} {key!r} is still in progress")


def _store(db: Database, model: Any, scope: str, key: str, response: Response) -> None:
    body = response.get_data(as_text=True)
    json.loads(body or "null")  # only JSON bodies are replayed
    with db.transaction() as session:
        session.execute(
            sa.update(model)
            .where(model.scope == scope, model.key == key)
            .values(status_code=response.status_code, response_body=body)
        )


def _release(db: Database, model: Any, scope: str, key: str) -> None:
    with db.transaction() as session:
        session.execute(sa.delete(model).where(model.scope == scope, model.key == key))
