"""Prometheus exposition for both services: a /metrics route and a port for workers.

Each process builds its own `CollectorRegistry` and passes it down (no global
registry at import). API processes serve database-derived gauges on `GET /metrics`
(outside `/v1`, so the ingress does not publish it); worker processes, which have
no HTTP server, serve theirs on `SETTLE_METRICS_PORT` when it is set.

Database-derived gauges go through `CachedCollector`: read at most once per few seconds
per process, however many scrapers ask, and missing (not a failed scrape) while the
database does not answer, so the `absent()` alerts name what is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

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


#: How long a database-derived collector's reading is served again (seconds).
COLLECT_TTL_S = 5.0


class CachedCollector(Collector):
    """Another collector's families, collected at most once per `ttl_s`.

    A collector that raises (its database is down) yields nothing: its series go
    missing from this scrape, which `absent()` rules turn into alerts, and the rest of
    the process's metrics are still served; it is tried again at the next scrape.
    `describe()` is empty, so registering it runs no query.
    """

    def __init__(
        self,
        inner: Collector,
        *,
        ttl_s: float = COLLECT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._families: list[Metric] = []
        self._read_at: float | None = None

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        with self._lock:  # concurrent scrapes share one reading
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._ttl_s:
                try:
                    self._families = list(self._inner.collect())
                except Exception as err:
                    log.warning("%s failed: %s", type(self._inner).__name__, err)
                    self._families = []
                self._read_at = now
            return list(self._families)
