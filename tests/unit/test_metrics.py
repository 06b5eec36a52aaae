"""The /metrics route both services mount, and the engine's metric names."""

from __future__ import annotations

from flask import Flask
from prometheus_client import CollectorRegistry, Counter

from services.notifier.metrics import NotifierMetrics
from shared.metrics import metrics_blueprint, metrics_port


def test_the_route_renders_its_registry_in_the_text_format() -> None:
    # Given an app with the metrics blueprint over a registry with one counter
    registry = CollectorRegistry()
    Counter("settle_demo", "A demo counter", registry=registry).inc(3)
    app = Flask("demo")
    app.register_blueprint(metrics_blueprint(registry))
    # When it is scraped
    response = app.test_client().get("/metrics")
    # Then it answers the Prometheus text format with the counter
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    assert "settle_demo_total 3.0" in response.get_data(as_text=True)


def test_engine_metrics_live_on_their_own_registry() -> None:
    # Two engines in one process (tests, settle dev) do not collide on a global registry
    first, second = NotifierMetrics(), NotifierMetrics()
    first.deliveries.labels("succeeded").inc()
    value = first.registry.get_sample_value(
        "settle_webhook_deliveries_total", {"outcome": "succeeded"}
    )
    assert value == 1.0
    assert (
        second.registry.get_sample_value(
            "settle_webhook_deliveries_total", {"outcome": "succeeded"}
        )
        is None
    )


def test_metrics_port_is_optional_and_offset_per_process() -> None:
    assert metrics_port({}) is None
    assert metrics_port({"SETTLE_METRICS_PORT": "9300"}) == 9300
    assert metrics_port({"SETTLE_METRICS_PORT": "9300"}, offset=2) == 9302
