"""Core's Flask app factory."""

from __future__ import annotations

from flask import Flask

from services.core.api.status import VERSION
from services.core.config import CoreConfig
from services.core.context import EXTENSION, CoreContext
from shared import idempotency, ratelimit
from shared.api import make_api
from shared.identity import signin_guard
from shared.identity.auth import IDENTITY_DB
from shared.metrics import metrics_blueprint


def create_app(config: CoreConfig | None = None, *, context: CoreContext | None = None) -> Flask:
    """Build core's WSGI app. Pass a `context` to share databases with other parts."""
    if context is None:
        context = CoreContext.build(config or CoreConfig.from_env())
    # static_folder=None: a JSON API serves no files (Flask would add /static/<path>).
    app = Flask("settle.core", static_folder=None)
    app.extensions[EXTENSION] = context
    idempotency.install(app, context.db, context.config.secret_key)
    app.extensions[IDENTITY_DB] = context.identity_db
    api = make_api(app, title="Settle core API", version=VERSION, openapi_path="/v1/openapi.json")

    from services.core.api import (
        accounts,
        api_keys,
        audit,
        chains,
        deposits,
        event_types,
        fee_preview,
        members,
        mfa,
        policy,
        portal_links,
        sandbox,
        sessions,
        statements,
        status,
    )

    for module in (
        chains,
        event_types,
        status,
        policy,
        accounts,
        fee_preview,
        sessions,
        deposits,
        statements,
        sandbox,
        api_keys,
        members,
        portal_links,
        audit,
        mfa,
    ):
        api.register_blueprint(module.blp)
    # The portal's pages at /portal/ (static; they call the JSON APIs) and / redirecting there.
    from services.portal.web import portal_blueprint

    app.register_blueprint(portal_blueprint())
    # The API reference page (HTML, not in the OpenAPI document).
    from services.core.api import docs

    app.register_blueprint(docs.blp)
    # Prometheus text on /metrics (not in the OpenAPI document; the ingress hides it).
    from services.core.relay import api_metrics_registry

    registry = api_metrics_registry(context.db)
    app.register_blueprint(metrics_blueprint(registry))
    ratelimit.install(app, context.config.rate_limits)
    guard = signin_guard.install(app, context.config.signin, ratelimit.store(app))
    registry.register(signin_guard.SignInCollector(guard))
    return app
