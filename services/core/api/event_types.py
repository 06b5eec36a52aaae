"""GET /v1/event-types: the public event catalog (every type, its JSON Schema, an example)."""

from __future__ import annotations

import functools
import json

import marshmallow as ma
from flask import Response
from flask.views import MethodView

from shared import event_catalog, subscriptions
from shared.api import Blueprint, Schema

blp = Blueprint(
    "event_types",
    __name__,
    url_prefix="/v1",
    description="The webhook event catalog (public): what each event type means and carries.",
)


class EventTypeSchema(Schema):
    type = ma.fields.String(required=True, metadata={"example": "deposit.credited"})
    description = ma.fields.String(
        required=True, metadata={"description": "When it fires and what to do with it."}
    )
    schema = ma.fields.Dict(
        required=True,
        metadata={"description": "JSON Schema (2020-12) of the whole delivery body."},
    )
    example = ma.fields.Dict(required=True, metadata={"description": "An example body."})


class PatternSchema(Schema):
    pattern = ma.fields.String(required=True, metadata={"example": "deposit.*"})
    event_types = ma.fields.List(
        ma.fields.String(),
        required=True,
        metadata={
            "description": "The types it covers today; a type added later under the "
            "pattern is covered too."
        },
    )


class EventTypesSchema(Schema):
    event_types = ma.fields.List(ma.fields.Nested(EventTypeSchema), required=True)
    patterns = ma.fields.List(
        ma.fields.Nested(PatternSchema),
        required=True,
        metadata={
            "description": "What a webhook endpoint's eventTypes may hold besides types: "
            '"*" (every type) and "<prefix>.*", each with the types it covers today.'
        },
    )


@functools.cache
def _body() -> bytes:
    # The catalog is fixed for the life of the process: render it once.
    return json.dumps(
        {"eventTypes": event_catalog.documents(), "patterns": subscriptions.catalog_patterns()},
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


@blp.route("/event-types")
class EventTypes(MethodView):
    @blp.response(200, EventTypesSchema)
    def get(self) -> Response:
        """List every webhook event type (when it fires, its JSON Schema, an example) and the
        patterns an endpoint may subscribe to."""
        return Response(_body(), mimetype="application/json")
