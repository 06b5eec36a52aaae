"""The one error format of both services.

`{"error": "<code>: <message for a person>", "code": "<code>", "details": {...}?}`.
Every exception that reaches Flask becomes this shape; nothing renders HTML or a
stack trace.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered to the client. Subclasses fix the status and code."""

    status: int = 400
    code: str = "invalid_request"

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": f"{self.code}: {self.message}", "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


class InvalidJson(ApiError):
    status, code = 400, "invalid_json"


class InvalidRequest(ApiError):
    status, code = 400, "invalid_request"


class UnsupportedChain(ApiError):
    status, code = 400, "unsupported_chain"


class Unauthorized(ApiError):
    status, code = 401, "unauthorized"


class MfaRequired(Unauthorized):
    """The password was right; the member signs in with a second factor: send `code`."""

    status, code = 401, "mfa_required"


class InsufficientScope(ApiError):
    status, code = 403, "insufficient_scope"


class StepUpRequired(ApiError):
    """A sensitive change on a session whose last password or code is older than 5 minutes."""

    status, code = 403, "step_up_required"


class MfaEnrolmentRequired(ApiError):
    """The tenant requires a second factor and this member has none yet."""

    status, code = 403, "mfa_enrolment_required"


class Forbidden(ApiError):
    status, code = 403, "forbidden"


class NotFound(ApiError):
    status, code = 404, "not_found"


class Conflict(ApiError):
    status, code = 409, "conflict"


class AccountExists(ApiError):
    status, code = 409, "account_exists"


class IdempotencyKeyReused(ApiError):
    status, code = 409, "idempotency_key_reused"


class PayloadTooLarge(ApiError):
    status, code = 413, "payload_too_large"


class UnsupportedMediaType(ApiError):
    status, code = 415, "unsupported_media_type"


class DestinationPolicyMissing(ApiError):
    status, code = 422, "destination_policy_missing"


class RateLimited(ApiError):
    status, code = 429, "rate_limited"


class ServiceUnavailable(ApiError):
    status, code = 503, "service_unavailable"


class OutcomeUnknown(ApiError):
    """A write the database switch cut while it committed: it may or may not be written."""

    status, code = 503, "outcome_unknown"


#: The answer to a write the failover cut while it committed (no Retry-After: sending it
#: again could do it twice; with the same Idempotency-Key it answers this again).
OUTCOME_UNKNOWN = OutcomeUnknown(
    "the database switched while this request committed, so it may or may not have been "
    "done; check the resource (GET) before sending it again with a new Idempotency-Key"
)


class InternalError(ApiError):
    status, code = 500, "internal_error"


#: Werkzeug's HTTP errors, mapped to our codes (anything else keeps its status).
_HTTP_CODES: dict[int, tuple[str, str]] = {
    400: ("invalid_request", "the request could not be read"),
    401: ("unauthorized", "authentication required"),
    403: ("forbidden", "not allowed"),
    404: ("not_found", "no such route"),
    405: ("method_not_allowed", "method not allowed on this route"),
    413: ("payload_too_large", "body exceeds the limit"),
    415: ("unsupported_media_type", "send the body as application/json"),
    429: ("rate_limited", "too many requests"),
}


def error_response(err: ApiError) -> Response:
    response = jsonify(err.body())
    response.status_code = err.status
    for key, value in err.headers.items():
        response.headers[key] = value
    return response


def register_error_handlers(app: Flask) -> None:
    """Route every exception through the one JSON shape."""

    @app.errorhandler(ApiError)
    def _api_error(err: ApiError) -> Response:
        return error_response(err)

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException) -> Response:
        status = err.code or 500
        if status == 413:
            limit = app.config.get("MAX_CONTENT_LENGTH") or 0
            return error_response(PayloadTooLarge(f"body exceeds {limit // 1024} KiB"))
        code, message = _HTTP_CODES.get(status, ("internal_error", "request failed"))
        api = ApiError(message)
        api.status, api.code = status, code
        response = error_response(api)
        if status == 405 and isinstance(getattr(err, "valid_methods", None), list | tuple):
            response.headers["Allow"] = ", ".join(err.valid_methods or [])
        return response

    @app.errorhandler(sa.exc.TimeoutError)
    def _no_connection(err: sa.exc.TimeoutError) -> Response:
        # Every pooled database connection stayed busy for the pool's whole wait: the
        # service is saturated, not broken; the client may retry shortly.
        log.warning("request refused: %s", err)
        return error_response(
            ServiceUnavailable(
                "every database connection is busy; retry in 1 s", headers={"Retry-After": "1"}
            )
        )

    @app.errorhandler(RecursionError)
    def _too_deep(err: RecursionError) -> Response:
        # Only input can recurse this deep (bodies are capped at 32 levels before
        # parsing; this is the net below that cap): the client's fault, not ours.
        log.warning("request refused: %s", err)
        return error_response(InvalidRequest("the request is nested too deeply to process"))

    @app.errorhandler(Exception)
    def _unexpected(err: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(InternalError("something went wrong on our side; try again"))
