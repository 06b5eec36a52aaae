"""GET /v1/status: public liveness and readiness."""

from __future__ import annotations

import marshmallow as ma
import sqlalchemy as sa
from flask.views import MethodView

from services.core.context import core
from shared.api import Blueprint, Schema
from shared.timefmt import iso_ms, utcnow

blp = Blueprint("status", __name__, url_prefix="/v1", description="Service status (public).")

#: Core's version, shown by status and in its OpenAPI document (the app factory reads it
#: from here: status sits below the app, as the notifier's does).
VERSION = "0.1.0"


class StatusSchema(Schema):
    status = ma.fields.String(required=True, metadata={"enum": ["ok", "degraded"]})
    service = ma.fields.String(required=True)
    version = ma.fields.String(required=True)
    time = ma.fields.String(required=True)
    components = ma.fields.Dict(keys=ma.fields.String(), values=ma.fields.String(), required=True)


@blp.route("/status")
class Status(MethodView):
    @blp.response(200, StatusSchema)
    @blp.alt_response(503, schema=StatusSchema, description="A dependency is down")
    def get(self) -> tuple[dict[str, object], int]:
        """Whether the service and its database answer."""
        try:
            with core().db.reader() as session:
                session.execute(sa.text("SELECT 1"))
            database = "ok"
        except sa.exc.SQLAlchemyError:
            database = "unavailable"
        healthy = database == "ok"
        body = {
            "status": "ok" if healthy else "degraded",
            "service": "core",
            "version": VERSION,
            "time": iso_ms(utcnow()),
            "components": {"database": database},
        }
        return body, 200 if healthy else 503
