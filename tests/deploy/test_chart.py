"""The Helm chart (deploy/helm/trace-repro) renders with Helm's own renderer and every manifest decodes strictly into
the Kubernetes and prometheus-operator API types (bench.chartcheck); then what the manifests say is checked against
the daemon: its CLI, its settings, its HTTP paths, the image's user, the shipped alert rules."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import chartcheck
from streamer import cli, config, config_names
from streamer.config import CoreSettings
from streamer.runtime import http

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).with_name("fixtures")
PIPELINE = FIXTURES / "pipeline-values.yaml"
ALERTS = ROOT / "config" / "prometheus" / "alerts.yml"
IMAGE_UID = 10001  # the Dockerfile's USER (tests/deploy/test_dockerfile.py)


@pytest.fixture(scope="module")
def default(chartcheck_binary: Path) -> chartcheck.Rendered:
    return chartcheck.render(chartcheck_binary)


@pytest.fixture(scope="module")
def pipeline(chartcheck_binary: Path) -> chartcheck.Rendered:
    return chartcheck.render(chartcheck_binary, PIPELINE)


def render_with(binary: Path, tmp_path: Path, values: str) -> chartcheck.Rendered:
    """The chart rendered (and checked: exit 0) with the default values and ``values`` (YAML text) over them."""
    path = tmp_path / "values.yaml"
    path.write_text(values)
    rendered = chartcheck.render(binary, path)
    assert rendered.returncode == 0, rendered.errors
    return rendered


def deployments(rendered: chartcheck.Rendered) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in rendered.of_kind("Deployment")}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def settings_of(rendered: chartcheck.Rendered, deployment: dict[str, Any], tmp: Path) -> CoreSettings:
    """The daemon's settings in that pod: the ConfigMap's TOML and the container's plain env (secrets set to 'x')."""
    (configmap,) = rendered.of_kind("ConfigMap")
    env = {e["name"]: e.get("value", "x") for e in container(deployment)["env"]}
    assert config_names.unknown_env(env, config.settings_model()) == []
    path = tmp / "trace-repro.toml"
    path.write_text(configmap["data"]["trace-repro.toml"])
    return config.load(path, env)


def test_default_values_render_and_validate(default: chartcheck.Rendered) -> None:
    """Default values: rendered, every manifest strictly valid, helm lint without error or warning, and a Deployment
    per stage (ingest, entities) with a ConfigMap, a Service and a ServiceAccount."""
    assert default.returncode == 0, default.errors
    assert [m for m in default.lint if m["severity"] in ("ERROR", "WARNING")] == []
    kinds = sorted(m["kind"] for m in default.manifests)
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Service", "ServiceAccount"]
    assert set(deployments(default)) == {"ingest", "entities"}


def test_pipeline_values_render_every_kind_strictly(pipeline: chartcheck.Rendered) -> None:
    """A team's values (several workers, GitLab on, prometheus-operator): the ServiceMonitor and PrometheusRule are
    rendered too, and decoded into the prometheus-operator types."""
    assert pipeline.returncode == 0, pipeline.errors
    assert [m for m in pipeline.lint if m["severity"] in ("ERROR", "WARNING")] == []
    kinds = {m["kind"] for m in pipeline.manifests}
    assert kinds == {"ConfigMap", "Deployment", "Service", "ServiceAccount", "ServiceMonitor", "PrometheusRule"}


def test_an_unknown_field_is_refused(chartcheck_binary: Path) -> None:
    """The checker is strict: a mistyped container field (``valueFromm``) makes it fail and name the field."""
    bad = chartcheck.render(chartcheck_binary, FIXTURES / "unknown-field-values.yaml")
    assert bad.returncode == 1
    assert 'unknown field "spec.template.spec.containers[0].env[4].valueFromm"' in bad.errors


def test_each_stage_runs_its_own_command(pipeline: chartcheck.Rendered) -> None:
    """Stage 1 runs ``run --stage ingest --workers 2`` on 3 replicas, stage 2 ``run --stage entities`` on 2: commands
    the CLI accepts (the image's entrypoint is ``trace-repro``)."""
    found = deployments(pipeline)
    assert set(found) == {"ingest", "entities"}
    assert (found["ingest"]["spec"]["replicas"], found["entities"]["spec"]["replicas"]) == (3, 2)
    for stage, deployment in found.items():
        args = cli.parser().parse_args(container(deployment)["args"])
        assert (args.command, args.stage, args.config) == ("run", stage, Path("/etc/trace-repro/trace-repro.toml"))
        assert args.workers == (2 if stage == "ingest" else None)


def test_combined_mode_runs_both_stages_in_one_deployment(chartcheck_binary: Path, tmp_path: Path) -> None:
    """mode: combined is one Deployment running ``run --stage all``."""
    rendered = render_with(chartcheck_binary, tmp_path, "mode: combined\n")
    (deployment,) = rendered.of_kind("Deployment")
    args = cli.parser().parse_args(container(deployment)["args"])
    assert (args.stage, args.workers) == ("all", 1)


def test_the_pods_settings_load_and_listen_on_all_interfaces(pipeline: chartcheck.Rendered, tmp_path: Path) -> None:
    """The ConfigMap's TOML plus the container's env is a valid configuration (no unknown TRACE_REPRO_* name): the
    addresses from values, /metrics on 0.0.0.0 at the container port the probes and the Service use."""
    for deployment in deployments(pipeline).values():
        settings = settings_of(pipeline, deployment, tmp_path)
        assert settings.kafka.bootstrap == "kafka-0.kafka:9092,kafka-1.kafka:9092"
        assert settings.falkordb.url == "redis://falkordb.graph:6379"
        assert settings.environment == "prod-eu"
        assert settings.http.host == "0.0.0.0"
        (port,) = container(deployment)["ports"]
        assert port == {"name": "http-metrics", "containerPort": settings.http.port, "protocol": "TCP"}


def test_probes_use_the_daemons_health_paths(pipeline: chartcheck.Rendered) -> None:
    """Startup and liveness probe /healthz, readiness /readyz: paths the daemon's HTTP server answers."""
    served = http.__doc__ or ""
    for deployment in deployments(pipeline).values():
        c = container(deployment)
        paths = {p: c[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
        assert paths == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
        assert all(f"``{p}``" in served for p in paths.values())
        assert all(c[p]["httpGet"]["port"] == "http-metrics" for p in paths)


def test_the_gitlab_token_comes_from_a_secret_never_from_values(pipeline: chartcheck.Rendered) -> None:
    """TRACE_REPRO_GITLAB_TOKEN is a secretKeyRef; the chart renders no Secret and the ConfigMap names no secret
    setting (GitLab token, redaction key, passwords)."""
    for deployment in deployments(pipeline).values():
        env = {e["name"]: e for e in container(deployment)["env"]}
        token = env["TRACE_REPRO_GITLAB_TOKEN"]
        assert token == {"name": "TRACE_REPRO_GITLAB_TOKEN",
                         "valueFrom": {"secretKeyRef": {"name": "trace-repro-gitlab", "key": "token"}}}  # fmt: skip
    assert pipeline.of_kind("Secret") == []
    (configmap,) = pipeline.of_kind("ConfigMap")
    data = tomllib.loads(configmap["data"]["trace-repro.toml"])
    keys = config_names.keys(config.settings_model())
    secret = {k for k in keys if k.rsplit(".", 1)[-1] in ("gitlab_token", "redaction_key", "password", "sasl_password",
                                                           "ssl_key_password", "bearer_token")}  # fmt: skip
    written = {".".join(p) for p in _paths(data)}
    assert secret and not (written & secret)


def _paths(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in data.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += _paths(value, (*prefix, key))
    return out


def test_pods_run_non_root_on_a_read_only_root(pipeline: chartcheck.Rendered) -> None:
    """Non-root as the image's uid, no privilege escalation, no capabilities, read-only root with /tmp and the home
    directory (repro files) as emptyDirs; the Kubernetes API token is not mounted."""
    for deployment in deployments(pipeline).values():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == IMAGE_UID
        assert pod["automountServiceAccountToken"] is False
        sc = container(deployment)["securityContext"]
        assert sc == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}  # fmt: skip
        mounts = {m["mountPath"]: m["name"] for m in container(deployment)["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]] and "emptyDir" in volumes[mounts["/home/trace-repro"]]
        assert volumes[mounts["/etc/trace-repro"]]["configMap"]["name"] == "trace-repro"
        assert container(deployment)["resources"]["requests"]


def test_the_service_monitor_scrapes_every_stage(pipeline: chartcheck.Rendered) -> None:
    """The ServiceMonitor selects the Service, whose selector takes every stage's pods, on the named metrics port;
    job="trace-repro" (what the alert rules select) comes from the Service's app.kubernetes.io/name label."""
    (service,) = pipeline.of_kind("Service")
    (monitor,) = pipeline.of_kind("ServiceMonitor")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels[monitor["spec"]["jobLabel"]] == "trace-repro"
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for deployment in deployments(pipeline).values():
        assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_prometheus_rule_is_the_shipped_alerts(pipeline: chartcheck.Rendered) -> None:
    """The PrometheusRule carries config/prometheus/alerts.yml's groups as they are."""
    (rule,) = pipeline.of_kind("PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_runbook_urls_point_where_the_team_hosts_the_runbooks(chartcheck_binary: Path, tmp_path: Path) -> None:
    """prometheusRule.runbookBaseUrl replaces the project's own runbook location in every alert's runbook_url."""
    rendered = render_with(
        chartcheck_binary,
        tmp_path,
        "prometheusRule:\n  enabled: true\n  runbookBaseUrl: https://wiki.example.com/sre/trace-repro/\n",
    )
    (rule,) = rendered.of_kind("PrometheusRule")
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"https://wiki.example.com/sre/trace-repro/{alert['alert']}.md"


def test_the_image_is_pinned_by_digest_when_given(pipeline: chartcheck.Rendered, default: chartcheck.Rendered) -> None:
    """image.digest wins over the tag; without one the tag is the chart's appVersion (the package's version)."""
    digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    for deployment in deployments(pipeline).values():
        assert container(deployment)["image"] == f"registry.example.com/platform/trace-repro@{digest}"
    chart = yaml.safe_load((chartcheck.CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    for deployment in deployments(default).values():
        assert container(deployment)["image"] == f"trace-repro:{project['version']}"


def test_a_mistyped_value_is_refused_by_the_schema(chartcheck_binary: Path, tmp_path: Path) -> None:
    """values.schema.json: a key the chart does not have (``stage`` for ``stages``) or a mode it does not know fails
    the render and names it, instead of being silently ignored."""
    typo = tmp_path / "typo.yaml"
    typo.write_text("stage:\n  ingest:\n    replicas: 4\n")
    rendered = chartcheck.render(chartcheck_binary, typo)
    assert rendered.returncode == 1 and "stage" in rendered.errors and "not allowed" in rendered.errors
    typo.write_text("mode: separate\n")
    rendered = chartcheck.render(chartcheck_binary, typo)
    assert rendered.returncode == 1 and "mode" in rendered.errors
