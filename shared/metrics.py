"""Prometheus exposition for both services: a /metrics route and a port for workers.

Each process builds its own `CollectorRegistry` and passes it down (no global
registry at import). API processes serve database-derived gauges on `GET /metrics`
(outside `/v1`, so the ingress does not publish it); worker processes, which have
no HTTP server, serve theirs on `SETTLE_METRICS_PORT` when it is set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import start_http_server as _start_http_server

from shared.settings import env_int, env_str, environ

log = logging.getLogger(__name__)


def metrics_blueprint(registry: CollectorRegistry, *, name: str = "metrics") -> Blueprint:
    """A blueprint with `GET /metrics` rendering `registry` in the text format."""
    blp = Blueprint(name, __name__)

    @blp.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    return blp


def metrics_port(env: Mapping[str, str] | None = None, *, offset: int = 0) -> int | None:
    """SETTLE_METRICS_PORT (+ offset for the n-th child process), or None when unset."""
    env = environ() if env is None else env
    if not env_str(env, "SETTLE_METRICS_PORT"):
        return None
    return env_int(env, "SETTLE_METRICS_PORT", 0) + offset


def serve_metrics(registry: CollectorRegistry, port: int | None, host: str = "127.0.0.1") -> None:
    """Serve `registry` on http://host:port/metrics in a daemon thread (no-op for None).

    SETTLE_METRICS_HOST chooses the interface (default 127.0.0.1; 0.0.0.0 in a container).
    """
    if port is None:
        return
    host = env_str(environ(), "SETTLE_METRICS_HOST", host) or host
    _start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)
