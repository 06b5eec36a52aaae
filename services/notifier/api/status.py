"""GET /v1/notifier/status: public liveness and readiness of the notifier."""

from __future__ import annotations

import marshmallow as ma
import sqlalchemy as sa
from flask.views import MethodView

from services.notifier.context import notifier
from shared.api import Blueprint, Schema
from shared.db import Database
from shared.timefmt import iso_ms, utcnow

blp = Blueprint(
    "notifier_status", __name__, url_prefix="/v1/notifier", description="Service status (public)."
)

#: The notifier's version, shown by status and in its OpenAPI document.
VERSION = "0.1.0"


class StatusSchema(Schema):
    status = ma.fields.String(required=True, metadata={"enum": ["ok", "degraded"]})
    service = ma.fields.String(required=True, metadata={"example": "notifier"})
    version = ma.fields.String(required=True)
    time = ma.fields.String(required=True, metadata={"example": "2026-11-21T04:11:28.123Z"})
    components = ma.fields.Dict(
        keys=ma.fields.String(),
        values=ma.fields.String(),
        required=True,
        metadata={"example": {"database": "ok", "identity": "ok"}},
    )


def _probe(db: Database) -> str:
    try:
        with db.reader() as session:
            session.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError:
        return "unavailable"
    return "ok"


@blp.route("/status")
class Status(MethodView):
    @blp.response(200, StatusSchema)
    @blp.alt_response(503, schema=StatusSchema, description="A dependency is down")
    def get(self) -> tuple[dict[str, object], int]:
        """Whether the notifier, its database and the identity database answer."""
        ctx = notifier()
        components = {"database": _probe(ctx.db)}
        components["identity"] = (
            components["database"] if ctx.identity_db is ctx.db else _probe(ctx.identity_db)
        )
        healthy = all(value == "ok" for value in components.values())
        body = {
            "status": "ok" if healthy else "degraded",
            "service": "notifier",
            "version": VERSION,
            "time": iso_ms(utcnow()),
            "components": components,
        }
        return body, 200 if healthy else 503
