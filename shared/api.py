"""HTTP building blocks both services share: blueprint, schemas, fields, errors, pagination.

Thin subclasses of flask-smorest and marshmallow so our error format, camelCase
names and timestamp format live in one place.
"""

from __future__ import annotations

import base64
import binascii
import functools
import inspect
import json
import logging
import re
import types
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, NoReturn, TypeVar

import flask_smorest
import marshmallow as ma
import psycopg
import sqlalchemy as sa
from eth_utils import is_checksum_address, is_hex_address, to_checksum_address
from flask import Flask, Request, Response, request
from flask.json.provider import DefaultJSONProvider
from sqlalchemy.orm import Session
from webargs.flaskparser import FlaskParser, is_json_request

from shared import failover, safejson
from shared.errors import (
    OUTCOME_UNKNOWN,
    InternalError,
    InvalidJson,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    UnsupportedMediaType,
    error_response,
    register_error_handlers,
)
from shared.logs import install_request_id
from shared.timefmt import iso_ms, parse_iso

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Body size limit of DESIGN.md (413 above it).
MAX_BODY_BYTES = 256 * 1024


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _flatten(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """marshmallow's nested messages -> {"destination.chainId": ["..."]}."""
    out: dict[str, list[str]] = {}
    if isinstance(messages, Mapping):
        for key, value in messages.items():
            name = "body" if key == "_schema" else str(key)
            path = f"{prefix}.{name}" if prefix and name != "body" else (prefix or name)
            out.update(_flatten(value, path))
    elif isinstance(messages, list | tuple) and all(isinstance(m, str) for m in messages):
        out[prefix or "body"] = list(messages)
    elif isinstance(messages, list | tuple):
        for item in messages:
            out.update(_flatten(item, prefix))
    else:
        out[prefix or "body"] = [str(messages)]
    return out


def field_error(field: str, message: str) -> InvalidRequest:
    """400 `invalid_request` naming one field (its path, e.g. `destination.address`)."""
    return InvalidRequest(f"{field}: {message}", details={"fields": {field: [message]}})


def invalid_request_from(messages: Any) -> InvalidRequest:
    """One readable sentence naming each bad field, with the fields in details."""
    fields = _flatten(messages)
    sentence = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in sorted(fields.items()))
    return InvalidRequest(sentence or "the request is not valid", details={"fields": fields})


class ArgumentsParser(FlaskParser):
    """webargs parser that fails with our error format and reads JSON bodies safely."""

    DEFAULT_VALIDATION_STATUS = 400

    def handle_error(
        self,
        error: ma.ValidationError,
        req: Any,
        schema: ma.Schema,
        *,
        error_status_code: int | None,
        error_headers: Any,
    ) -> NoReturn:
        messages = error.messages
        if isinstance(messages, Mapping) and len(messages) == 1:
            # webargs nests messages under the location ("json", "query").
            ((location, inner),) = messages.items()
            if location in {"json", "query", "headers", "path", "view_args"}:
                messages = inner
        raise invalid_request_from(messages)

    def load_json(self, req: Request, schema: ma.Schema) -> Any:
        """The JSON body, or `missing` when there is none.

        A body sent without a JSON content type is refused (415) rather than ignored:
        ignoring it made the request fail as missing fields, which misleads.
        """
        data = req.get_data(cache=True)
        if not is_json_request(req):
            if data:
                raise UnsupportedMediaType(NOT_JSON)
            return ma.missing
        if not data:
            return ma.missing
        return read_json_body(data)


#: The message of a body sent without a JSON content type.
NOT_JSON = "send the body as JSON, with Content-Type: application/json"


def read_json_body(data: bytes) -> Any:
    """A request body's JSON; 400 `invalid_json` for malformed or too deeply nested text."""
    try:
        return safejson.loads(data)
    except safejson.TooComplex as err:
        raise InvalidJson(f"the body {err}") from None
    except json.JSONDecodeError:
        raise InvalidJson("the body is not valid JSON") from None
    except UnicodeDecodeError:
        raise InvalidJson("the body is not valid JSON (not UTF-8)") from None
    except ValueError:
        # E.g. an integer beyond Python's 4300-digit conversion limit.
        raise InvalidJson("the body is not valid JSON (a number is too long)") from None


class _RequestJSON:
    """What `request.get_json()` parses with: `shared.safejson` (shape bounded).

    Only requests: responses (our own OpenAPI document holds thousands of objects) are
    read with Flask's JSON.
    """

    loads = staticmethod(safejson.loads)


class SafeRequest(Request):
    json_module = _RequestJSON


#: Arguments of flask-smorest's `arguments` that only document (none reaches webargs).
_DOCUMENTING_ONLY = frozenset(
    {"location", "required", "description", "example", "examples", "content_type"}
)


class Blueprint(flask_smorest.Blueprint):
    ARGUMENTS_PARSER = ArgumentsParser()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prepare_doc_cbks.append(_document_control_characters)

    def arguments(self, schema: Any, *args: Any, **kwargs: Any) -> Any:
        """flask-smorest's `arguments`, given a schema instance made once.

        webargs builds a new schema from a class on every request (a tenth of a
        simple POST's CPU); loading through one instance is safe, as our schemas
        keep no per-load state. A JSON body's route also documents its 415, and is
        parsed by `_json_arguments` rather than through webargs at each request.
        """
        if isinstance(schema, type):
            schema = schema()
        decorator = super().arguments(schema, *args, **kwargs)
        if kwargs.get("location", "json") != "json":
            return decorator
        if set(kwargs) - _DOCUMENTING_ONLY or args:
            raise TypeError("a JSON body's arguments take the schema and documentation only")
        not_json = self.alt_response(
            415, schema=ErrorSchema, description=f"unsupported_media_type: {NOT_JSON}"
        )
        return lambda func: not_json(self._json_arguments(schema, decorator, func))

    def _json_arguments(
        self, schema: ma.Schema, decorator: Callable[[Any], Any], func: Callable[..., Any]
    ) -> Callable[..., Any]:
        """`func` given its JSON body loaded by `schema`, as webargs' `use_args` does it.

        The same steps (the body as `ArgumentsParser.load_json` reads it, `{}` when
        there is none, the schema's own `unknown`, errors as `handle_error` words them)
        in one wrapper: webargs' and flask-smorest's layers (argument preparation, two
        wrappers, `ensure_sync`) cost more per request than loading the schema. The
        documentation is what flask-smorest's decorator records.
        """
        parser = self.ARGUMENTS_PARSER

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            data = parser.load_json(request, schema)
            try:
                parsed = schema.load({} if data is ma.missing else data)
            except ma.ValidationError as error:
                raise invalid_request_from(error.messages) from None
            return func(*args, parsed, **kwargs)

        wrapper._apidoc = decorator(func)._apidoc  # type: ignore[attr-defined]
        return wrapper

    def alt_response(self, *args: Any, **kwargs: Any) -> Any:
        """flask-smorest's `alt_response`: documents only (see `_documenting`)."""
        return _documenting(super().alt_response(*args, **kwargs))

    @staticmethod
    def doc(**kwargs: Any) -> Any:
        """flask-smorest's `doc`: documents only (see `_documenting`)."""
        return _documenting(flask_smorest.Blueprint.doc(**kwargs))


def _documenting(decorate: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """flask-smorest's documenting decorator without the wrapper it leaves in each request.

    Its `alt_response` and `doc` return a wrapper that only carries the docs
    (`_apidoc`), yet on every request looks the app up and calls `ensure_sync`: nine
    layers on a POST, a few percent of a request's CPU. The docs go instead on a copy of
    the function (same code, closure and attributes), which runs as the original does.
    """

    def decorator(func: Any) -> Any:
        documented = decorate(func)
        if not isinstance(func, types.FunctionType):
            return documented
        copy = types.FunctionType(
            func.__code__, func.__globals__, func.__name__, func.__defaults__, func.__closure__
        )
        functools.update_wrapper(copy, func)
        copy.__kwdefaults__ = func.__kwdefaults__
        copy._apidoc = documented._apidoc  # type: ignore[attr-defined]
        return copy

    return decorator


class Schema(ma.Schema):
    """Base schema: attribute names snake_case, wire names camelCase, unknown = error."""

    class Meta:
        unknown = ma.RAISE
        ordered = True

    def on_bind_field(self, field_name: str, field_obj: ma.fields.Field) -> None:
        field_obj.data_key = camel(field_obj.data_key or field_name)


class Timestamp(ma.fields.Field):
    """ISO 8601 UTC with milliseconds on output; ISO 8601 on input."""

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> str | None:
        return None if value is None else iso_ms(value)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> datetime:
        if not isinstance(value, str):
            raise ma.ValidationError("must be an ISO 8601 timestamp string")
        try:
            return parse_iso(value)
        except ValueError:
            raise ma.ValidationError("must be an ISO 8601 timestamp") from None

    def _jsonschema_type_mapping(self) -> dict[str, str]:
        return {"type": "string", "format": "date-time"}


def checksum_address(value: Any) -> str:
    """Validate `0x` + 40 hex; reject a mixed-case address whose EIP-55 checksum is wrong."""
    if not isinstance(value, str) or len(value) != 42 or not value.startswith("0x"):
        raise ma.ValidationError("must be 0x followed by 40 hex characters")
    if not is_hex_address(value):
        raise ma.ValidationError("must be 0x followed by 40 hex characters")
    body = value[2:]
    if body != body.lower() and body != body.upper() and not is_checksum_address(value):
        raise ma.ValidationError("mixed-case address with a wrong EIP-55 checksum (a typo?)")
    return str(to_checksum_address(value))


class Address(ma.fields.String):
    """An EVM address; any case in, EIP-55 checksummed out."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("metadata", {})
        kwargs["metadata"].setdefault("pattern", "^0x[0-9a-fA-F]{40}$")
        kwargs["metadata"].setdefault("example", "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48")
        super().__init__(**kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        return checksum_address(value)


class StrictInteger(ma.fields.Integer):
    """An integer that refuses booleans, floats with fractions and numeric strings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool | str):
            raise ma.ValidationError("must be a number")
        return super()._deserialize(value, attr, data, **kwargs)


class StrictBoolean(ma.fields.Boolean):
    """JSON `true` or `false` only (marshmallow's Boolean also takes 0, 1, "yes", "on")."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise ma.ValidationError("must be true or false")
        return value


class StrictNumber(ma.fields.Float):
    """A finite JSON number: refuses booleans, numeric strings, NaN and infinities."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_nan=False, **kwargs)

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> float:
        if isinstance(value, bool | str):
            raise ma.ValidationError("must be a number")
        return super()._deserialize(value, attr, data, **kwargs)


class ListArgs(Schema):
    """Query arguments of every list: `limit` 1..200 (default 50) and an opaque `cursor`."""

    class Meta:
        unknown = ma.EXCLUDE

    limit = ma.fields.Integer(load_default=50, validate=ma.validate.Range(min=1, max=200))
    cursor = ma.fields.String(load_default=None, validate=ma.validate.Length(max=512))


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list, newest first: its items and the cursor of the next page.

    What every list use case returns; a list schema renders it as
    `{"<things>": [...], "nextCursor": "..." | null}`.
    """

    items: list[T]
    #: Opaque; None on the last page.
    next_cursor: str | None


#: Text a string cursor key may hold: our ids (`we_01J...`, `dep_...`) and nothing else.
_CURSOR_TEXT = re.compile(r"[A-Za-z0-9_-]{1,120}")
_BAD_CURSOR = "not a cursor this API gave out"


def keyset_page(
    session: Session,
    query: sa.Select[tuple[T]],
    key: sa.orm.InstrumentedAttribute[Any],
    *,
    limit: int,
    cursor: str | None,
) -> Page[T]:
    """The page of `query`'s rows that `cursor` points at, newest first by `key`.

    `key` is a unique column that grows with creation (an id or a sequence), so a
    page starts strictly below the last row of the page before: pages neither skip
    nor repeat rows while new ones are written. The cursor carries that last key; a
    cursor we did not give out (or one whose key has the wrong type) is a 400.
    """
    after = _cursor_key(cursor, key)
    if after is not None:
        query = query.where(key < after)
    rows = list(session.scalars(query.order_by(key.desc()).limit(limit + 1)))
    if len(rows) <= limit:
        return Page(rows, None)
    rows = rows[:limit]
    return Page(rows, _encode_cursor(getattr(rows[-1], key.key)))


def _encode_cursor(value: int | str) -> str:
    raw = json.dumps({"k": value}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor_key(cursor: str | None, key: sa.orm.InstrumentedAttribute[Any]) -> int | str | None:
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        values = safejson.loads(raw)
    except (binascii.Error, ValueError):
        raise field_error("cursor", _BAD_CURSOR) from None
    value = values.get("k") if isinstance(values, dict) else None
    if key.type.python_type is int:
        # Bounded to BIGINT: a larger number made PostgreSQL fail (500) instead of a 400.
        if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
            return value
    elif isinstance(value, str) and _CURSOR_TEXT.fullmatch(value):
        return value
    raise field_error("cursor", _BAD_CURSOR)


class ErrorSchema(Schema):
    """The error body of every 4xx and 5xx."""

    error = ma.fields.String(required=True, metadata={"example": "not_found: no such account"})
    code = ma.fields.String(required=True, metadata={"example": "not_found"})
    details = ma.fields.Dict()


class Api(flask_smorest.Api):
    """flask-smorest's Api documenting our error schema."""

    ERROR_SCHEMA = ErrorSchema


def make_api(app: Flask, *, title: str, version: str, openapi_path: str) -> flask_smorest.Api:
    """flask-smorest Api with our error format, JSON settings and OpenAPI location."""
    prefix, _, json_name = openapi_path.rpartition("/")
    # Werkzeug answers `/v1//chains` with a 308 to `/v1/chains` whose Location is built
    # from the Host header; we answer 404 instead (set before any rule is added).
    app.url_map.merge_slashes = False
    app.request_class = SafeRequest
    app.config.setdefault("API_TITLE", title)
    app.config.setdefault("API_VERSION", version)
    app.config.setdefault("OPENAPI_VERSION", "3.0.3")
    app.config.setdefault("OPENAPI_URL_PREFIX", prefix or "/")
    app.config.setdefault("OPENAPI_JSON_PATH", json_name)
    # Paths carry /v1; "/" is the origin that served the document (the ingress, or
    # settle dev), so "Try it out" on /v1/docs calls the same deployment.
    app.config.setdefault(
        "API_SPEC_OPTIONS",
        {"servers": [{"url": "/", "description": "The deployment that serves this document"}]},
    )
    if app.config.get("MAX_CONTENT_LENGTH") is None:
        # Not setdefault: Flask's default config already holds the key (as None).
        app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.json = JSONProvider(app)
    app.ensure_sync = functools.partial(_ensure_sync, app)  # type: ignore[method-assign]
    api = Api(app)
    # apispec maps fields by class; Timestamp derives from Field, so name its type.
    api.register_field(Timestamp, "string", "date-time")
    api.spec.components.security_scheme(
        "apiKey", {"type": "http", "scheme": "bearer", "description": "An `sk_...` API key."}
    )
    api.spec.components.security_scheme(
        "session", {"type": "apiKey", "in": "cookie", "name": "settle_session"}
    )
    # Registered after flask-smorest's own handlers so ours win.
    register_error_handlers(app)
    _answer_failovers(app)
    install_request_id(app)
    app.before_request(_refuse_leading_double_slash)
    app.before_request(_refuse_control_characters)
    app.after_request(_secure_headers)
    return api


class JSONProvider(DefaultJSONProvider):
    """Flask's JSON as we configure it (compact, keys in the order built), with the
    encoder of a response built once.

    Flask's provider builds a new `json.JSONEncoder` from its settings for every body
    it renders; ours renders compact bodies, the API's only kind, through one made at
    start with the same settings, so the bytes are the same.
    """

    sort_keys = False
    compact = True

    def __init__(self, app: Flask) -> None:
        super().__init__(app)
        self._compact = json.JSONEncoder(
            ensure_ascii=self.ensure_ascii,
            sort_keys=self.sort_keys,
            separators=(",", ":"),
            default=self.default,
        )

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        if kwargs == {"separators": (",", ":")}:
            return self._compact.encode(obj)
        return super().dumps(obj, **kwargs)


#: Whether each view, hook and handler is a coroutine function, by function (see
#: `_ensure_sync`); bounded, in case something registers callables per request.
_COROUTINE: dict[Any, bool] = {}
_COROUTINE_MAX = 4096


def _ensure_sync(app: Flask, func: Callable[..., Any]) -> Callable[..., Any]:
    """Flask's `ensure_sync`, remembering its answer per function.

    Flask asks `inspect.iscoroutinefunction` of every hook, view and decorator layer
    on every request (nine times for a POST), though the answer for a function never
    changes. A bound method is asked about by its function.
    """
    target = getattr(func, "__func__", func)
    try:
        coroutine = _COROUTINE.get(target)
    except TypeError:  # unhashable: ask Flask
        return Flask.ensure_sync(app, func)
    if coroutine is None:
        coroutine = inspect.iscoroutinefunction(func)
        if len(_COROUTINE) >= _COROUTINE_MAX:
            _COROUTINE.clear()
        _COROUTINE[target] = coroutine
    return app.async_to_sync(func) if coroutine else func


def _refuse_leading_double_slash() -> None:
    """`//v1/chains` is a 404 like `/v1//chains` (Werkzeug strips leading slashes from
    `request.path` and before matching, so it would answer as `/v1/chains`)."""
    if request.environ.get("PATH_INFO", "").startswith("//"):
        raise NotFound("no such route")


#: How long a safe request (GET, HEAD) is run again across a failover before the API
#: answers 503: within an ordinary client's timeout.
SAFE_REQUEST_RETRY_S = 8.0


def _answer_failovers(app: Flask) -> None:
    """A Flask app's answer to a failover: safe requests (GET, HEAD) are run again while
    the primary changes; any request the failover still cuts answers 503
    service_unavailable with Retry-After (it rolled back whole: a POST may be sent
    again, with its Idempotency-Key), or 503 outcome_unknown when it was cut while it
    committed; never a 500."""
    dispatch = app.dispatch_request

    def dispatch_request() -> Any:
        if request.method not in ("GET", "HEAD"):
            return dispatch()
        return failover.retry_idempotent(
            dispatch, what=f"{request.method} {request.path}", retry_for_s=SAFE_REQUEST_RETRY_S
        )

    app.dispatch_request = dispatch_request  # type: ignore[method-assign]

    @app.errorhandler(failover.CommitOutcomeUnknown)
    def _outcome_unknown(err: failover.CommitOutcomeUnknown) -> Response:
        log.warning("write cut by a database failover while it committed: %s", err.__cause__)
        return error_response(OUTCOME_UNKNOWN)

    @app.errorhandler(sa.exc.DBAPIError)
    @app.errorhandler(psycopg.Error)
    def _database_error(err: Exception) -> Response:
        if not failover.is_failover(err):
            log.exception("unhandled database error")
            return error_response(InternalError("something went wrong on our side; try again"))
        log.warning("request cut by a database failover: %s", err)
        return error_response(
            ServiceUnavailable(
                "the database is changing over; retry in 2 s", headers={"Retry-After": "2"}
            )
        )


#: What every operation's 400 says when the route documents no 400 of its own.
CONTROL_CHARACTER_400 = "invalid_request: a control character in the path or the query"


def _document_control_characters(
    doc: dict[str, Any], doc_info: dict[str, Any], **_: Any
) -> dict[str, Any]:
    """Every operation lists 400: any of them answers it to a control character in its
    path or query (`_refuse_control_characters`)."""
    responses = doc.setdefault("responses", {})
    if "400" not in responses and 400 not in responses:
        responses["400"] = {
            "description": CONTROL_CHARACTER_400,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    return doc


#: C0 controls (NUL, tab, newline ...), DEL and the C1 controls.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _refuse_control_characters() -> None:
    """A control character in the path or the query (a name or a value) is a 400.

    No id, cursor or filter holds one, and PostgreSQL refuses a NUL in text (a NUL in
    a member id answered 500). One check before routing's own 404 and before any
    handler, for every route of both services, the portal's pages included (issue 23).
    """
    if _CONTROL.search(request.path):
        raise InvalidRequest("the path holds a control character (NUL, a line break, ...)")
    query = request.query_string
    if not query:
        return
    text = query.decode("latin-1")
    if not _CONTROL.search(urllib.parse.unquote_plus(text, encoding="utf-8", errors="replace")):
        return
    message = "holds a control character (NUL, a line break, ...)"
    for name, value in urllib.parse.parse_qsl(
        text, keep_blank_values=True, encoding="utf-8", errors="replace"
    ):
        if _CONTROL.search(name) or _CONTROL.search(value):
            # Name the parameter, as a filter's own validation does (escaped: JSON).
            raise field_error(name, message)
    raise InvalidRequest(f"the query {message}")


#: An HTML page's policy unless it sets its own (the portal, the API docs): nothing
#: loads, nothing frames it. A page's own policy must forbid framing too.
HTML_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def _secure_headers(response: Response) -> Response:
    """`nosniff` on every answer; on an HTML one (a page, a redirect's little body) a
    CSP and `X-Frame-Options: DENY` against clickjacking (issue 23)."""
    headers = response.headers
    headers.setdefault("X-Content-Type-Options", "nosniff")
    if response.mimetype == "text/html":
        headers.setdefault("Content-Security-Policy", HTML_CSP)
        headers.setdefault("X-Frame-Options", "DENY")
    return response


def no_store(response: Response) -> Response:
    """An answer no cache may keep (a session's CSRF token, recovery codes): for
    `Blueprint.after_request` of the routes that answer about sessions."""
    response.headers["Cache-Control"] = "no-store"
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    return response
