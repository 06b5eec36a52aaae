"""deploy/prometheus/: the alert rules pass promtool's check and unit tests, and each
alert has its runbook entry and its test."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.support.services import require_tool

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "alerts.yml"
RULE_TESTS = PROMETHEUS / "alerts_test.yml"
RUNBOOK = ROOT / "docs" / "RUNBOOK.md"


def alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules_and_the_scrape_config() -> None:
    promtool = require_tool("promtool", "prometheus")
    for args in (["check", "rules", str(RULES)], ["check", "config", "prometheus.yml"]):
        done = subprocess.run(
            [promtool, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    promtool = require_tool("promtool", "prometheus")
    done = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        cwd=PROMETHEUS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {str(rule["alert"]) for rule in alerts()} <= fired


def test_every_alert_has_a_runbook_entry_and_a_severity() -> None:
    runbook = RUNBOOK.read_text(encoding="utf-8")
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in runbook.splitlines()
        if line.startswith("#")
    }
    for rule in alerts():
        name = str(rule["alert"])
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook_url"] == f"docs/RUNBOOK.md#{name.lower()}", name
        assert name.lower() in headings, f"docs/RUNBOOK.md has no heading for {name}"
        labels = rule["labels"]
        assert isinstance(labels, dict) and labels["severity"] in ("page", "ticket"), name
