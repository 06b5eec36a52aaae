"""A real Prometheus (Debian's binary) for e2e tests, and the metric names in PromQL.

    with PrometheusServer(jobs={"settle-core-api": ["127.0.0.1:8000"]}, rules=RULES) as prom:
        prom.wait_for(lambda: prom.firing("SettleDeliveryLag"), 120, "the lag alert")

It runs natively on a free loopback port with its own data dir (deleted afterwards),
scrapes and evaluates every second (the rules file is the production one, unchanged),
keeps an hour of data, and is stopped (SIGTERM, then SIGKILL) when the context exits.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.support.processes import free_port
from tests.support.services import require_tool

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: Scrape and rule evaluation interval of the test server.
INTERVAL = "1s"


class PrometheusServer:
    def __init__(self, jobs: Mapping[str, list[str]], rules: Path) -> None:
        self.binary = require_tool("prometheus", "prometheus")
        self.jobs = jobs
        self.rules = rules
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="settle-prometheus-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrometheusServer:
        config = {
            "global": {
                "scrape_interval": INTERVAL,
                "scrape_timeout": INTERVAL,
                "evaluation_interval": INTERVAL,
            },
            "rule_files": [str(self.rules)],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]}
                for job, targets in self.jobs.items()
            ],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        log = (self.dir / "prometheus.log").open("ab")
        try:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    "--storage.tsdb.retention.time=1h",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        self.wait_for(self._ready, START_TIMEOUT_S, "prometheus ready")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log()}")
        try:
            return requests.get(f"{self.base}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def log(self) -> str:
        path = self.dir / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def api(self, path: str, **params: Any) -> Any:
        answer = requests.get(f"{self.base}/api/v1/{path}", params=params, timeout=10)
        answer.raise_for_status()
        body = answer.json()
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]

    def firing(self, name: str) -> bool:
        return any(alert["state"] == "firing" for alert in self.alerts(name))

    def targets_up(self) -> dict[str, str]:
        return {
            target["labels"]["job"]: target["health"]
            for target in self.api("targets")["activeTargets"]
        }

    def wait_for(self, check: Callable[[], Any], timeout: float, what: str) -> float:
        """Poll `check` until truthy; the seconds it took. AssertionError after `timeout`."""
        started = time.monotonic()
        while not check():
            if time.monotonic() - started > timeout:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.log()}")
            time.sleep(0.5)
        return time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_TIMEOUT_S)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: PromQL words that are not metric names.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
_KEYWORDS |= {"unless", "bool", "offset", "le", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (selectors; not functions, labels,
    keywords or strings)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        follows = text[match.end() :].lstrip()
        if follows.startswith("(") or word.lower() in _KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def exported_names(metrics_text: str) -> set[str]:
    """Every series name a /metrics page declares (its `# TYPE` lines, histogram and
    summary parts included), whether or not it has samples yet."""
    names = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
            elif kind == "summary":
                names |= {f"{name}_count", f"{name}_sum"}
    return names


def expressions(dashboard: Mapping[str, Any]) -> Iterable[str]:
    """Every PromQL expression of a Grafana dashboard's panels (rows' panels included)."""
    for panel in dashboard.get("panels", []):
        yield from expressions(panel)
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield target["expr"]
