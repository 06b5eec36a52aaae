"""Wire shapes of webhook endpoints and deliveries (camelCase on the wire)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import marshmallow as ma

from services.notifier.deliveries import MAX_RECOVER_WINDOW
from services.notifier.models import (
    DELIVERY_STATUSES,
    DISABLED,
    ENABLED,
    Attempt,
    Delivery,
    Endpoint,
)
from services.notifier.sender import BASE_HEADERS
from services.notifier.sla import DEFAULT_SINCE
from services.notifier.urls import MAX_URL_LENGTH
from services.notifier.webhook_endpoints import (
    DEFAULT_EPHEMERAL_TTL_S,
    DEFAULT_SECRET_OVERLAP_S,
    ID_PATTERN,
    MAX_EPHEMERAL_TTL_S,
    MAX_NAME_LENGTH,
    MAX_RATE_LIMIT,
    MAX_SECRET_OVERLAP_S,
    MIN_EPHEMERAL_TTL_S,
    MIN_RATE_LIMIT,
    ORDERINGS,
    previous_secret_expires_at,
)
from shared import signing, subscriptions
from shared.api import ListArgs, Schema, StrictInteger, StrictNumber, Timestamp
from shared.event_catalog import unknown_type_message
from shared.events import EVENT_TYPES
from shared.idempotency import OPENAPI_PARAMETER

_id_validator = ma.validate.Regexp(ID_PATTERN, error="not an id of this API")

#: OpenAPI description of the Idempotency-Key header every POST takes.
IDEMPOTENCY_KEY_PARAM = OPENAPI_PARAMETER
#: Descriptions of the errors every route that reads a body or an Idempotency-Key can answer.
BAD_KEY = "invalid_request: Idempotency-Key is not 1..255 printable characters"
KEY_REUSED = "idempotency_key_reused: the Idempotency-Key came with another request"
TOO_LARGE = "payload_too_large (body over 256 KiB)"


def _known_event_type(value: str) -> None:
    if value not in EVENT_TYPES:
        raise ma.ValidationError(unknown_type_message(value))


def event_type_field(**kwargs: Any) -> ma.fields.String:
    return ma.fields.String(
        validate=_known_event_type,
        metadata={"enum": list(EVENT_TYPES)},
        **kwargs,
    )


def _subscribable(value: str) -> None:
    problem = subscriptions.problem(value)
    if problem is not None:
        raise ma.ValidationError(problem)


SUBSCRIPTIONS_DESCRIPTION = (
    'Event types, or patterns: "*" (every type, today\'s and later ones) or '
    '"<prefix>.*" such as "deposit.*" (every type under the prefix, today\'s and later '
    "ones); duplicates are dropped. GET /v1/event-types lists each pattern's types."
)


def subscription_field(**kwargs: Any) -> ma.fields.String:
    return ma.fields.String(
        validate=_subscribable,
        metadata={"enum": [*EVENT_TYPES, *subscriptions.patterns()]},
        **kwargs,
    )


# -- endpoints ----------------------------------------------------------------------

RATE_LIMIT_DESCRIPTION = (
    "Most deliveries a second this endpoint is sent (each worker process keeps to it; "
    f"{MIN_RATE_LIMIT}..{MAX_RATE_LIMIT}); null: as fast as the fair shares allow."
)


ORDERING_DESCRIPTION = (
    "`per_account`: events about one deposit account reach this endpoint one at a time, "
    "in the order they were committed (a failing delivery holds its account's later "
    "events, not other accounts'); null (the default): every delivery on its own."
)


def ordering_field(**kwargs: Any) -> ma.fields.String:
    return ma.fields.String(
        allow_none=True,
        validate=ma.validate.OneOf(ORDERINGS),
        metadata={"enum": [*ORDERINGS, None], "description": ORDERING_DESCRIPTION},
        **kwargs,
    )


def rate_limit_field(**kwargs: Any) -> StrictNumber:
    return StrictNumber(
        allow_none=True,
        validate=ma.validate.Range(min=MIN_RATE_LIMIT, max=MAX_RATE_LIMIT),
        metadata={"description": RATE_LIMIT_DESCRIPTION, "example": 10},
        **kwargs,
    )


SCHEME_DESCRIPTION = (
    "`settle` (default): our headers (x-service-signature, ...). `standard`: Standard "
    "Webhooks' headers too (webhook-id, webhook-timestamp, webhook-signature), so its "
    "libraries verify deliveries unchanged; the same secret serves both (docs/WEBHOOKS.md)."
)


def scheme_field(**kwargs: Any) -> ma.fields.String:
    return ma.fields.String(
        validate=ma.validate.OneOf(signing.SIGNATURE_SCHEMES),
        metadata={"enum": list(signing.SIGNATURE_SCHEMES), "description": SCHEME_DESCRIPTION},
        **kwargs,
    )


class EndpointSchema(Schema):
    id = ma.fields.String(required=True, metadata={"example": "we_01JD3Y8Q2X4N6R5T7V9W0Z1A2B"})
    name = ma.fields.String(required=True, metadata={"example": "Production ledger"})
    url = ma.fields.String(required=True, metadata={"example": "https://hooks.example.com/settle"})
    event_types = ma.fields.List(
        subscription_field(),
        required=True,
        metadata={"description": "What it subscribes to, as given: " + SUBSCRIPTIONS_DESCRIPTION},
    )
    receives = ma.fields.List(
        event_type_field(),
        required=True,
        metadata={
            "description": "The event types it receives today (its eventTypes with each "
            "pattern expanded), in the catalog's order."
        },
    )
    status = ma.fields.String(required=True, metadata={"enum": [ENABLED, DISABLED]})
    disabled_reason = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={
            "enum": ["manual", "failing", None],
            "description": "`manual` (PATCH) or `failing` (every attempt failed for days); "
            "null while enabled.",
        },
    )
    previous_secret_expires_at = Timestamp(
        required=True,
        allow_none=True,
        metadata={
            "description": "Until when the secret before the last rotation still signs "
            "deliveries; null when it does not."
        },
    )
    rate_limit_per_second = ma.fields.Float(
        required=True, allow_none=True, metadata={"description": RATE_LIMIT_DESCRIPTION}
    )
    signature_scheme = scheme_field(required=True)
    ordering = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"enum": [*ORDERINGS, None], "description": ORDERING_DESCRIPTION},
    )
    ephemeral = ma.fields.Boolean(
        required=True,
        metadata={
            "description": "An ephemeral endpoint (`settle listen`'s) expires at expiresAt "
            "unless renewed (POST .../renew) and does not count against the endpoint limit."
        },
    )
    expires_at = Timestamp(
        required=True,
        allow_none=True,
        metadata={"description": "When an ephemeral endpoint expires; null for the others."},
    )
    created_at = Timestamp(required=True)
    updated_at = Timestamp(required=True)


def endpoint_out(endpoint: Endpoint, now: datetime | None = None) -> dict[str, Any]:
    """The endpoint as EndpointSchema dumps it (never any secret)."""
    return {
        "id": endpoint.id,
        "name": endpoint.name,
        "url": endpoint.url,
        "event_types": list(endpoint.event_types),
        "receives": subscriptions.receives(endpoint.event_types),
        "status": endpoint.status,
        "disabled_reason": endpoint.disabled_reason if endpoint.status == DISABLED else None,
        "previous_secret_expires_at": previous_secret_expires_at(endpoint, now),
        "rate_limit_per_second": endpoint.rate_limit_per_second,
        "signature_scheme": endpoint.signature_scheme,
        "ordering": endpoint.ordering,
        "ephemeral": endpoint.expires_at is not None,
        "expires_at": endpoint.expires_at,
        "created_at": endpoint.created_at,
        "updated_at": endpoint.updated_at,
    }


class EndpointCreateSchema(Schema):
    name = ma.fields.String(
        required=True,
        validate=ma.validate.Length(min=1, max=MAX_NAME_LENGTH),
        metadata={"example": "Production ledger"},
    )
    url = ma.fields.String(
        required=True,
        validate=ma.validate.Length(min=1, max=MAX_URL_LENGTH),
        metadata={
            "description": "https URL of a public host; no credentials, no #fragment "
            "(http and private hosts only when SETTLE_WEBHOOK_ALLOW_PRIVATE is on, in dev).",
            "example": "https://hooks.example.com/settle",
        },
    )
    event_types = ma.fields.List(
        subscription_field(),
        required=True,
        validate=ma.validate.Length(min=1, error="subscribe to at least one event type"),
        metadata={"description": SUBSCRIPTIONS_DESCRIPTION, "example": ["deposit.credited"]},
    )
    rate_limit_per_second = rate_limit_field(load_default=None)
    signature_scheme = scheme_field(load_default=signing.SETTLE)
    ephemeral_ttl_seconds = StrictInteger(
        load_default=None,
        validate=ma.validate.Range(min=MIN_EPHEMERAL_TTL_S, max=MAX_EPHEMERAL_TTL_S),
        metadata={
            "description": "Make the endpoint ephemeral (as `settle listen` does): it "
            "expires this many seconds after its creation or last renewal (POST "
            ".../renew) and does not count against the endpoint limit "
            f"({MIN_EPHEMERAL_TTL_S}..{MAX_EPHEMERAL_TTL_S})."
        },
    )
    ordering = ordering_field(load_default=None)


class EndpointPatchSchema(Schema):
    name = ma.fields.String(validate=ma.validate.Length(min=1, max=MAX_NAME_LENGTH))
    url = ma.fields.String(validate=ma.validate.Length(min=1, max=MAX_URL_LENGTH))
    event_types = ma.fields.List(
        subscription_field(),
        validate=ma.validate.Length(min=1, error="subscribe to at least one event type"),
        metadata={"description": SUBSCRIPTIONS_DESCRIPTION},
    )
    status = ma.fields.String(
        validate=ma.validate.OneOf([ENABLED, DISABLED]), metadata={"enum": [ENABLED, DISABLED]}
    )
    rate_limit_per_second = rate_limit_field()
    signature_scheme = scheme_field()
    ordering = ordering_field()

    @ma.validates_schema
    def _at_least_one(self, data: dict[str, Any], **kwargs: Any) -> None:
        if not data:
            raise ma.ValidationError(
                "give at least one of name, url, eventTypes, status, rateLimitPerSecond, "
                "signatureScheme, ordering"
            )


class RenewSchema(Schema):
    ttl_seconds = StrictInteger(
        load_default=DEFAULT_EPHEMERAL_TTL_S,
        validate=ma.validate.Range(min=MIN_EPHEMERAL_TTL_S, max=MAX_EPHEMERAL_TTL_S),
        metadata={
            "description": "The endpoint expires this many seconds from now "
            f"(default {DEFAULT_EPHEMERAL_TTL_S})."
        },
    )


class RotateSecretSchema(Schema):
    previous_secret_expires_in_seconds = StrictInteger(
        load_default=DEFAULT_SECRET_OVERLAP_S,
        validate=ma.validate.Range(min=0, max=MAX_SECRET_OVERLAP_S),
        metadata={
            "description": "How long the current secret keeps signing next to the new one "
            f"(0..{MAX_SECRET_OVERLAP_S}, default {DEFAULT_SECRET_OVERLAP_S}: a day); "
            "0 retires it at once (a leaked secret)."
        },
    )


class SendTestSchema(Schema):
    event_type = ma.fields.String(
        load_default=None,
        validate=_known_event_type,
        metadata={
            "enum": list(EVENT_TYPES),
            "description": "Send the event catalog's example of this type (a fresh event id) "
            "instead of `webhook.test`, to this endpoint alone, whatever it subscribes to.",
        },
    )


class RecoverSchema(Schema):
    since = Timestamp(required=True, metadata={"description": "Start of the window (inclusive)."})
    until = Timestamp(
        load_default=None,
        metadata={
            "description": "End of the window (exclusive), default now; at most "
            f"{MAX_RECOVER_WINDOW.days} days after since."
        },
    )


class EndpointEnvelopeSchema(Schema):
    webhook_endpoint = ma.fields.Nested(EndpointSchema, required=True)


class EndpointWithSecretSchema(Schema):
    webhook_endpoint = ma.fields.Nested(EndpointSchema, required=True)
    secret = ma.fields.String(
        required=True,
        metadata={
            "example": "whsec_3q2-7wYl0bJm3fSx1cQ3l8v6wB0l9H1c4y2X8Tq5nKc",
            "description": "The signing secret: shown only in this response.",
        },
    )


class EndpointListSchema(Schema):
    webhook_endpoints = ma.fields.List(ma.fields.Nested(EndpointSchema), required=True)
    next_cursor = ma.fields.String(required=True, allow_none=True)


class StatsArgs(Schema):
    """Query of GET /v1/webhook-endpoints/{endpointId}/stats."""

    since = ma.fields.String(
        load_default=DEFAULT_SINCE,
        validate=ma.validate.Length(min=1, max=64),
        metadata={
            "description": "Deliveries made since: a duration back from now (`7d`, `24h`, "
            "`30m`; s, m, h, d, w) or an ISO 8601 time in the past. Default `7d`.",
            "example": "7d",
        },
    )


def _seconds(description: str) -> ma.fields.Float:
    return ma.fields.Float(required=True, allow_none=True, metadata={"description": description})


class EndpointStatsSchema(Schema):
    """An endpoint's delivery SLA over a window (services/notifier/sla.py)."""

    endpoint_id = ma.fields.String(required=True)
    endpoint_name = ma.fields.String(required=True)
    since = Timestamp(required=True, metadata={"description": "Deliveries made from ..."})
    until = Timestamp(required=True, metadata={"description": "... until (now)."})
    deliveries = ma.fields.Integer(
        required=True,
        metadata={"description": "Made in the window: succeeded + failed + pending + skipped."},
    )
    succeeded = ma.fields.Integer(required=True)
    failed = ma.fields.Integer(
        required=True, metadata={"description": "Finished without success (status failed)."}
    )
    exhausted = ma.fields.Integer(
        required=True,
        metadata={
            "description": "Of the failed, those that gave up after the retry schedule (the "
            "rest stopped because the endpoint was deleted)."
        },
    )
    pending = ma.fields.Integer(
        required=True, metadata={"description": "Not finished yet (pending or retrying)."}
    )
    skipped = ma.fields.Integer(
        required=True, metadata={"description": "Kept while the endpoint was disabled."}
    )
    success_rate = ma.fields.Float(
        required=True,
        allow_none=True,
        metadata={"description": "succeeded / (succeeded + failed), 0..1; null: none finished."},
    )
    first_attempt_latency_p50_seconds = _seconds("Median time of first attempts (to the answer).")
    first_attempt_latency_p99_seconds = _seconds("99th percentile of the same.")
    commit_to_success_p50_seconds = _seconds(
        "Median time from the event's commit (createdAt) to its delivery's success (replays "
        "left out)."
    )
    commit_to_success_p99_seconds = _seconds("99th percentile of the same.")
    oldest_pending_age_seconds = _seconds(
        "Age of the oldest delivery of the window still pending; null: none."
    )


class EndpointStatsEnvelopeSchema(Schema):
    stats = ma.fields.Nested(EndpointStatsSchema, required=True)


# -- deliveries ---------------------------------------------------------------------


class DeliverySchema(Schema):
    id = ma.fields.String(required=True, metadata={"example": "whd_01JD3Y8Q2X4N6R5T7V9W0Z1A2B"})
    endpoint_id = ma.fields.String(required=True)
    event_id = ma.fields.String(required=True)
    event_type = event_type_field(required=True)
    status = ma.fields.String(required=True, metadata={"enum": list(DELIVERY_STATUSES)})
    attempt_count = ma.fields.Integer(required=True)
    next_attempt_at = Timestamp(
        required=True, allow_none=True, metadata={"description": "Null once final."}
    )
    last_attempt_at = Timestamp(required=True, allow_none=True)
    last_response_status = ma.fields.Integer(required=True, allow_none=True)
    last_error = ma.fields.String(required=True, allow_none=True)
    replay_of = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "The delivery this one replays or recovers, if any."},
    )
    held_by = ma.fields.String(
        required=True,
        allow_none=True,
        # A Delivery row dumped as it is (not through delivery_out) shows null.
        dump_default=None,
        metadata={
            "description": "Endpoints with `ordering: per_account`: the unfinished delivery "
            "of an earlier event about the same account that this one waits for (it starts "
            "once that one succeeds or fails for good); null when it waits for none."
        },
    )
    created_at = Timestamp(required=True)
    updated_at = Timestamp(required=True)
    succeeded_at = Timestamp(required=True, allow_none=True)


class AttemptSchema(Schema):
    number = ma.fields.Integer(required=True)
    attempted_at = Timestamp(required=True)
    response_status = ma.fields.Integer(required=True, allow_none=True)
    latency_ms = ma.fields.Float(required=True, allow_none=True)
    error = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"example": "timeout", "description": "Null when the attempt succeeded."},
    )
    response_body = ma.fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "The first 4 KiB of the receiver's response body."},
    )
    request_headers = ma.fields.Dict(
        keys=ma.fields.String(),
        values=ma.fields.String(),
        required=True,
        metadata={
            "description": "The headers Settle set on this attempt's request, exactly as "
            "sent (its timestamp and signature included)."
        },
    )


class DeliveryDetailSchema(DeliverySchema):
    attempts = ma.fields.List(ma.fields.Nested(AttemptSchema), required=True)
    request_body = ma.fields.String(
        required=True,
        metadata={"description": "The request body every attempt sent: the exact bytes."},
    )
    event = ma.fields.Dict(
        required=True,
        metadata={
            "description": "The event envelope exactly as sent: id, type, createdAt, "
            "tenantId, data."
        },
    )


#: Attributes a delivery shows (the fields of DeliverySchema).
_DELIVERY_FIELDS = tuple(DeliverySchema().fields)
#: Attributes an attempt row gives as they are (its request headers are rebuilt).
_ATTEMPT_FIELDS = tuple(name for name in AttemptSchema().fields if name != "request_headers")


def delivery_out(delivery: Delivery, held_by: str | None = None) -> dict[str, Any]:
    """The delivery's values as DeliverySchema dumps them (plain data, session-free);
    `held_by` from deliveries.holders."""
    out = {name: getattr(delivery, name) for name in _DELIVERY_FIELDS if name != "held_by"}
    out["held_by"] = held_by
    return out


def delivery_detail(
    delivery: Delivery, attempts: list[Attempt], body: str, held_by: str | None = None
) -> dict[str, Any]:
    """A delivery with its attempts and event, as DeliveryDetailSchema dumps them."""
    out = delivery_out(delivery, held_by)
    out["attempts"] = [
        {
            **{name: getattr(a, name) for name in _ATTEMPT_FIELDS},
            "request_headers": _request_headers(delivery, a),
        }
        for a in attempts
    ]
    out["event"] = json.loads(body)
    out["request_body"] = body
    return out


def _request_headers(delivery: Delivery, attempt: Attempt) -> dict[str, str]:
    """The headers the attempt sent: the sender's, then the delivery's signed ones.

    Each attempt is signed with its own `attempted_at` (whole seconds), so its
    timestamp header is that; the signatures sent are recorded with the attempt (the
    Standard Webhooks one only when the endpoint asked for that scheme).
    """
    timestamp = str(int(attempt.attempted_at.timestamp()))
    headers = {
        **BASE_HEADERS,
        "Content-Type": "application/json",
        signing.SIGNATURE_HEADER: attempt.signature_header or "",
        signing.TIMESTAMP_HEADER: timestamp,
        signing.EVENT_ID_HEADER: delivery.event_id,
        signing.DELIVERY_ID_HEADER: delivery.id,
        **signing.marked_as_test(delivery.event_id),
    }
    if attempt.webhook_signature is not None:
        headers[signing.STANDARD_ID_HEADER] = delivery.event_id
        headers[signing.STANDARD_TIMESTAMP_HEADER] = timestamp
        headers[signing.STANDARD_SIGNATURE_HEADER] = attempt.webhook_signature
    return headers


class DeliveryEnvelopeSchema(Schema):
    webhook_delivery = ma.fields.Nested(DeliverySchema, required=True)


class DeliveryDetailEnvelopeSchema(Schema):
    webhook_delivery = ma.fields.Nested(DeliveryDetailSchema, required=True)


class DeliveryListSchema(Schema):
    webhook_deliveries = ma.fields.List(ma.fields.Nested(DeliverySchema), required=True)
    next_cursor = ma.fields.String(required=True, allow_none=True)


class DeliveryBatchSchema(Schema):
    """Deliveries made by one request (recover), oldest event first."""

    webhook_deliveries = ma.fields.List(ma.fields.Nested(DeliverySchema), required=True)


class DeliveryListArgs(ListArgs):
    """Filters of GET /v1/webhook-deliveries; every one given must match."""

    endpoint_id = ma.fields.String(validate=_id_validator, metadata={"pattern": ID_PATTERN.pattern})
    event_id = ma.fields.String(validate=_id_validator, metadata={"pattern": ID_PATTERN.pattern})
    event_type = event_type_field()
    status = ma.fields.String(
        validate=ma.validate.OneOf(DELIVERY_STATUSES), metadata={"enum": list(DELIVERY_STATUSES)}
    )
    created_after = Timestamp(metadata={"description": "Created at or after (inclusive)."})
    created_before = Timestamp(metadata={"description": "Created before (exclusive)."})
