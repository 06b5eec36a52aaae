"""The notifier's Flask app factory."""

from __future__ import annotations

from flask import Flask

from services.notifier.config import NotifierConfig
from services.notifier.context import EXTENSION, NotifierContext
from shared import idempotency, ratelimit
from shared.api import make_api
from shared.identity.auth import IDENTITY_DB
from shared.metrics import metrics_blueprint


def create_app(
    config: NotifierConfig | None = None, *, context: NotifierContext | None = None
) -> Flask:
    """Build the notifier's WSGI app. Pass a `context` to share databases or the engine."""
    if context is None:
        context = NotifierContext.build(config or NotifierConfig.from_env())
    # static_folder=None: a JSON API serves no files (Flask would add /static/<path>).
    app = Flask("settle.notifier", static_folder=None)
    app.extensions[EXTENSION] = context
    idempotency.install(app, context.db, context.config.secret_key)
    app.extensions[IDENTITY_DB] = context.identity_db

    from services.notifier.api import deliveries, endpoints, status

    api = make_api(
        app,
        title="Settle notifier API",
        version=status.VERSION,
        openapi_path="/v1/notifier/openapi.json",
    )
    for module in (endpoints, deliveries, status):
        api.register_blueprint(module.blp)
    # Prometheus text on /metrics (not in the OpenAPI document; the ingress hides it).
    from services.notifier.metrics import api_metrics_registry

    app.register_blueprint(metrics_blueprint(api_metrics_registry(context.db)))
    ratelimit.install(app, context.config.rate_limits)
    return app
