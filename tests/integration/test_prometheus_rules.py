"""The Prometheus and Grafana assets (``dashboards/``) checked by Prometheus' own ``promtool``
(Debian's ``prometheus`` package, which ``make setup`` installs when run as root): the alerting
rules parse and pass their unit tests (each fires on its fault and not on a healthy series), and
every query of the Grafana dashboard is valid PromQL. Every metric either file names is one the
agent or the reconciler exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.telemetry import METRICS as AGENT_METRICS
from audit.reconcile.metrics import METRICS as RECONCILE_METRICS

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "prometheus" / "docket-rules.yml"
RULE_TESTS = ROOT / "dashboards" / "prometheus" / "docket-rules.test.yml"
GRAFANA = ROOT / "dashboards" / "grafana" / "docket.json"
PROMTOOL = shutil.which("promtool")
KNOWN = set(AGENT_METRICS) | set(RECONCILE_METRICS)

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus; make setup "
    "does it as root)")


def _promtool(*args: str, cwd: Path) -> str:
    proc = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:agent|reconcile)_[a-z0-9_]+)\b", expr))


def _dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(GRAFANA.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


@needs_promtool
def test_the_rules_parse_and_pass_their_unit_tests():
    assert "SUCCESS: 16 rules found" in _promtool("check", "rules", str(RULES), cwd=RULES.parent)
    assert "SUCCESS" in _promtool("test", "rules", RULE_TESTS.name, cwd=RULES.parent)


def test_every_alerting_rule_has_a_unit_test_that_fires_it_and_one_that_does_not():
    rules = set(re.findall(r"^\s*- alert: (\w+)$", RULES.read_text(), re.M))
    tests = RULE_TESTS.read_text()
    quiet = set(re.findall(r"alertname: (\w+), exp_alerts: \[\]", tests))
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n", tests))
    assert len(rules) == 16
    # Left to Prometheus and to plain thresholds: ``up == 0``, the pool full, the lag in bytes.
    untested = rules - {"DocketReconcilerDown", "DocketAgentPoolFull", "DocketAgentSourceLag"}
    assert untested <= fired, f"rules no unit test fires: {sorted(untested - fired)}"
    assert untested <= quiet, f"rules not tested quiet: {sorted(untested - quiet)}"


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path):
    queries = _dashboard_queries()
    assert len(queries) >= 15
    # Grafana's variables, as Grafana substitutes them for "All"
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"docket:panel_{i}", "expr": expr.replace("$instance", ".*")}
        for i, (_title, expr) in enumerate(queries)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(json.dumps(rules, indent=1))          # JSON is YAML
    assert f"SUCCESS: {len(queries)} rules found" in _promtool("check", "rules", str(path),
                                                                 cwd=tmp_path)


def test_every_metric_named_is_exported():
    named = {name: "rules" for name in _metric_names(RULES.read_text())}
    for title, expr in _dashboard_queries():
        for name in _metric_names(expr):
            named[name] = f"panel {title!r}"
    unknown = {n: where for n, where in named.items() if n not in KNOWN}
    assert not unknown, f"not exported by the agent or the reconciler: {unknown}"
    # and the dashboard shows every metric the reconciler exports
    shown = set().union(*(_metric_names(e) for _t, e in _dashboard_queries()))
    assert set(RECONCILE_METRICS) <= shown, set(RECONCILE_METRICS) - shown
