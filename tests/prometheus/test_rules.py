"""Monitoring config: alert rules and their unit tests under promtool, metric naming, and the Grafana dashboard.

promtool comes from the Debian package ``prometheus``; without it these tests fail (they never skip).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram, generate_latest

from processors.model.events import Resource, SpanKind, StatusCode
from processors.model.sampling import Sampling
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from streamer.mcp.metrics import FAMILIES
from streamer.runtime.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "config" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yml"
DASHBOARD = ROOT / "config" / "grafana" / "trace-repro.json"
RUNBOOKS = "docs/runbooks"

INSTALL = "apt-get install -y --no-install-recommends prometheus"
# Series every scrape adds, and labels PromQL itself introduces.
SCRAPE_METRICS = {"up"}
SCRAPE_LABELS = {"job", "instance", "le", "__name__"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
# Grafana's variables, replaced by values PromQL accepts before an expression is parsed.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$job": ".*",
    "$instance": ".*",
    "$mcp_job": ".*",
}


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(f"promtool not found on PATH: install the Debian package `prometheus` ({INSTALL})", pytrace=False)
    return subprocess.run(
        [path, *args], input=stdin.decode() if stdin else None, capture_output=True, text=True, timeout=120, check=False
    )


def _sampled_trace() -> ClosedTrace:
    res = Resource("shop", "1.0", "test", "")
    span = Span("1" * 32, "2" * 16, "", "GET /", SpanKind.SERVER, 1, 2, StatusCode.UNSET, res,
                sampling=Sampling(0.5, "tracestate"))  # fmt: skip
    return ClosedTrace(span.trace_id, (span,))


def populated_metrics() -> Metrics:
    """The daemon's metrics with one sample in every family, labelled ones included (they are empty at start)."""
    metrics = Metrics()
    for attribute in Metrics.__slots__:
        metric = getattr(metrics, attribute)
        if attribute in ("registry", "service_label"):  # not a metric: the bounded service label helper
            continue
        if attribute == "telemetry":  # components' telemetry: a drop, an event and a state gauge of one component
            t = metric("traces")
            t.drop("max_open_traces")
            t.count("closed")
            t.gauge("open", 1)
            continue
        if attribute == "sampled":  # kept and represented traces: one trace kept at 0.5
            metric.add(_sampled_trace())
            continue
        labels = {name: "x" for name in metric._labelnames}
        child = metric.labels(**labels) if labels else metric
        if isinstance(metric, Counter):
            child.inc()
        elif isinstance(metric, Gauge):
            child.set(1)
        elif isinstance(metric, Histogram):
            child.observe(0.1)
        else:
            raise AssertionError(f"Metrics.{attribute}: unexpected type {type(metric).__name__}")
    return metrics


def exposed() -> tuple[set[str], set[str]]:
    """Every sample name the daemon can expose (``_total``, ``_bucket``, ...) and every label name it uses."""
    names: set[str] = set()
    labels: set[str] = set(SCRAPE_LABELS)
    for family in populated_metrics().registry.collect():
        for sample in family.samples:
            names.add(sample.name)
            labels.update(sample.labels)
    for name, label_names in FAMILIES.items():  # the topology analytics of ``trace-repro mcp``'s /metrics
        names.add(name)
        labels.update(label_names)
    return names, labels


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", []) if t.get("expr")]


def selectors(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names one PromQL expression refers to."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    labels: set[str] = set()
    for body in re.findall(r"\{([^}]*)\}", text):
        labels.update(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", body))
    for body in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        labels.update(name.strip() for name in body.split(",") if name.strip())
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)  # matchers, ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+\w+", " ", text)
    names = {
        m.group(1) for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)\b(?!\s*\()", text) if m.group(1) not in KEYWORDS
    }
    return names, labels


def test_alert_rules_pass_promtool_check() -> None:
    """``promtool check rules`` accepts alerts.yml."""
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alert_rules_unit_tests_pass() -> None:
    """``promtool test rules`` passes every case of alerts_test.yml."""
    result = promtool("test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_labels_annotations_and_unit_tests() -> None:
    """Every alert has a severity, summary, description and runbook_url, and is tested both firing and silent."""
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    checks = [c for t in tests for c in t.get("alert_rule_test", [])]
    for rule in alert_rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        mine = [c for c in checks if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no firing case"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no silent case"


def test_every_runbook_url_is_a_page_of_the_repository() -> None:
    """Every alert's runbook_url ends in docs/runbooks/<alert>.md, that page exists and says what the alert means and
    what to do, and every page there belongs to an alert."""
    names = set()
    for rule in alert_rules():
        name = rule["alert"]
        names.add(name)
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("https://") and url.endswith(f"/{RUNBOOKS}/{name}.md"), f"{name}: {url}"
        page = (ROOT / RUNBOOKS / f"{name}.md").read_text()
        assert page.startswith(f"# {name}\n") and "## What it means" in page and "## What to do" in page, name
    assert {p.stem for p in (ROOT / RUNBOOKS).glob("*.md")} == names


def test_alerts_select_no_scrape_job_and_route_findings_by_service() -> None:
    """No rule names a scrape job (the daemon's job name is the deployment's), and the findings alerts (incidents,
    regressions, WORSE verdicts) keep the ``service`` label for routing."""
    for rule in alert_rules():
        assert not re.search(r"\bjob\s*(=|!=|=~|!~)", rule["expr"]), f"{rule['alert']}: {rule['expr']}"
    findings = {r["alert"]: r for r in alert_rules() if r["alert"] in
                {"TraceReproNewIncident", "TraceReproRegression", "TraceReproWorseVerdict"}}  # fmt: skip
    assert len(findings) == 3
    for name, rule in findings.items():
        assert "service" in selectors(rule["expr"])[1], name


def test_prometheus_config_is_valid(tmp_path: Path) -> None:
    """``promtool check config`` accepts prometheus.yml, which scrapes the daemon (127.0.0.1:9464) and the MCP
    server's analytics (with its bearer token), and loads alerts.yml."""
    for name in ("prometheus.yml", "alerts.yml"):  # as installed: with the token file the operator adds
        shutil.copy(PROMETHEUS / name, tmp_path / name)
    (tmp_path / "trace-repro-mcp.token").write_text("token\n")
    result = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs.keys() == {"trace-repro", "trace-repro-mcp"}
    assert jobs["trace-repro"]["static_configs"][0]["targets"] == ["127.0.0.1:9464"]
    assert jobs["trace-repro-mcp"]["authorization"]["type"] == "Bearer"  # the MCP server refuses unauthenticated


def test_daemon_metrics_follow_prometheus_conventions() -> None:
    """``promtool check metrics`` finds no problem in the daemon's exposition, every family with a sample."""
    metrics = populated_metrics()
    exposition = generate_latest(metrics.registry)
    families = [f for f in metrics.registry.collect() if f.samples]
    # every prometheus-client metric of Metrics (not the registry, the telemetries, the sampled traffic, the service
    # label helper), plus the three families of the components' telemetry and the two of the sampled traffic
    assert len(families) == len(Metrics.__slots__) - 4 + 3 + 2
    result = promtool("check", "metrics", stdin=exposition)
    problems = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not problems, f"promtool check metrics:\n{problems}"


def test_dashboard_loads_and_every_panel_queries_prometheus() -> None:
    """The dashboard is JSON with a Prometheus datasource variable, and every panel has a PromQL target using it."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "trace-repro"
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in dashboard_panels() if p["type"] != "row"]
    assert panels
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        targets = panel.get("targets", [])
        assert targets, panel["title"]
        for target in targets:
            assert target.get("expr", "").strip(), panel["title"]
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_exprs_parse(tmp_path: Path) -> None:
    """Every dashboard expression, with Grafana's variables filled in, is valid PromQL according to promtool."""
    rules = []
    for i, expr in enumerate(dashboard_exprs()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"unknown Grafana variable in {expr}"
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_referenced_metrics_and_labels_exist(source: str) -> None:
    """Every metric and label name in the alert or dashboard expressions is one the daemon's registry exposes."""
    exprs = [r["expr"] for r in alert_rules()] if source == "alerts" else dashboard_exprs()
    names, labels = exposed()
    used_names: set[str] = set()
    for expr in exprs:
        refers, uses = selectors(expr)
        assert refers <= names | SCRAPE_METRICS, f"unknown metric(s) {sorted(refers - names - SCRAPE_METRICS)}: {expr}"
        assert uses <= labels, f"unknown label(s) {sorted(uses - labels)}: {expr}"
        used_names |= refers
    assert used_names & names, f"no daemon metric found in the {source} expressions"


def test_dashboard_shows_what_the_alerts_watch() -> None:
    """Every daemon metric an alert fires on has a dashboard panel (drops, sinks and their backlog, incidents by
    service, regressions, verdicts...), and the dashboard's job variable works whatever the job is called."""
    alerted = {name for r in alert_rules() for name in selectors(r["expr"])[0]} - {"up", "trace_repro_build_info"}
    shown = {name for expr in dashboard_exprs() for name in selectors(expr)[0]}
    assert alerted <= shown, f"alerted but not on the dashboard: {sorted(alerted - shown)}"
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    assert variables["job"]["query"]["query"] == "label_values(trace_repro_build_info, job)"


def test_selectors_finds_names_and_labels() -> None:
    """The expression scanner tells metric names from functions, keywords, label names, ranges and strings."""
    names, labels = selectors(
        'histogram_quantile(0.99, sum by (le, stage) (rate(a_bucket{job=~"$job", x="b{c}"}[$__rate_interval])))'
        " and on (instance) (time() - b offset 10m) unless c > 5"
    )
    assert names == {"a_bucket", "b", "c"}
    assert labels == {"le", "stage", "job", "x", "instance"}
