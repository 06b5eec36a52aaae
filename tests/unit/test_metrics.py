"""The /metrics route both services mount, and the engine's metric names."""

from __future__ import annotations

import threading
import time

from flask import Flask
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from services.core.deposits.worker import PipelineMetrics, loop
from services.notifier.breaker import CircuitBreakers
from services.notifier.metrics import BreakerCollector, NotifierMetrics
from shared.metrics import CachedCollector, metrics_blueprint, metrics_port


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
        == 0
    )


def test_metrics_port_is_optional_and_offset_per_process() -> None:
    assert metrics_port({}) is None
    assert metrics_port({"SETTLE_METRICS_PORT": "9300"}) == 9300
    assert metrics_port({"SETTLE_METRICS_PORT": "9300"}, offset=2) == 9302


class CountingCollector:
    """A collector that counts its readings, and can be made to fail."""

    def __init__(self) -> None:
        self.readings = 0
        self.fail = False

    def collect(self) -> list[GaugeMetricFamily]:
        self.readings += 1
        if self.fail:
            raise OSError("the database does not answer")
        family = GaugeMetricFamily("settle_demo_depth", "A demo gauge")
        family.add_metric([], self.readings)
        return [family]


def test_a_cached_collector_reads_at_most_once_per_ttl_and_goes_missing_on_failure() -> None:
    now = [100.0]
    inner = CountingCollector()
    registry = CollectorRegistry(auto_describe=True)
    # Given a database-derived collector cached for 5 s (registering it reads nothing)
    registry.register(CachedCollector(inner, ttl_s=5.0, clock=lambda: now[0]))
    assert inner.readings == 0
    # When three scrapes come within the TTL
    values = [registry.get_sample_value("settle_demo_depth") for _ in range(3)]
    # Then the database was read once and every scrape got that reading
    assert values == [1.0, 1.0, 1.0] and inner.readings == 1
    # When the TTL has passed, the next scrape reads again
    now[0] += 5.0
    assert registry.get_sample_value("settle_demo_depth") == 2.0
    # When the database fails, the series is missing (an absent() alert) and the scrape
    # still answers; the next TTL tries again
    inner.fail = True
    now[0] += 5.0
    assert registry.get_sample_value("settle_demo_depth") is None
    inner.fail = False
    now[0] += 5.0
    assert registry.get_sample_value("settle_demo_depth") == 4.0


def test_breaker_states_count_open_and_half_open_endpoints() -> None:
    now = [0.0]
    breakers = CircuitBreakers(threshold=2, cooldown_s=10, max_cooldown_s=60, clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(BreakerCollector(breakers))

    def state(name: str) -> float | None:
        return registry.get_sample_value("settle_webhook_breakers", {"state": name})

    # Given no failing endpoint: both states at 0
    assert (state("open"), state("half_open")) == (0, 0)
    # When two endpoints fail twice in a row (threshold) and a third once
    for endpoint in ("a", "a", "b", "b", "c"):
        breakers.record(endpoint, ok=False)
    # Then two breakers are open
    assert (state("open"), state("half_open")) == (2, 0)
    # When the cool-down ends, both are half-open (a probe may go)
    now[0] = 11.0
    assert (state("open"), state("half_open")) == (0, 2)
    # When one answers, it closes
    breakers.record("a", ok=True)
    assert (state("open"), state("half_open")) == (0, 1)


def test_the_engine_counters_exist_at_zero_before_the_first_event() -> None:
    registry = NotifierMetrics().registry
    for result in ("stored", "duplicate", "malformed", "untrusted"):
        assert registry.get_sample_value("settle_notifier_events_total", {"result": result}) == 0
    for outcome in ("succeeded", "failed", "skipped"):
        assert (
            registry.get_sample_value("settle_webhook_deliveries_total", {"outcome": outcome}) == 0
        )
    assert registry.get_sample_value("settle_webhook_attempts_total", {"outcome": "success"}) == 0


def test_pipeline_loops_count_failed_rounds_and_the_last_good_one() -> None:
    registry = CollectorRegistry()
    metrics = PipelineMetrics(registry)
    stop = threading.Event()
    rounds = iter([True, RuntimeError("node down"), RuntimeError("node down"), False])

    def step() -> bool:
        outcome = next(rounds)
        if isinstance(outcome, Exception):
            raise outcome
        if outcome is False:
            stop.set()
        return outcome

    loop(
        "watcher-1",
        step,
        0.0,
        stop,
        succeeded=metrics.watcher_success.labels("1").set_to_current_time,
        failed=metrics.watcher_errors.labels("1").inc,
    )
    assert registry.get_sample_value("settle_watcher_errors_total", {"chain_id": "1"}) == 2
    last = registry.get_sample_value(
        "settle_watcher_last_success_timestamp_seconds", {"chain_id": "1"}
    )
    assert last is not None and abs(last - time.time()) < 60
