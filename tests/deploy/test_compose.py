"""docker-compose.yml, checked without Docker: every service's image is pinned, every mounted file exists and
parses, and what the services say about each other agrees (addresses, ports, topics, tables, settings)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from bench.shop import db as shop_db
from streamer import config, config_names
from tests.deploy import dockerfile

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
STAGES = dockerfile.stages((ROOT / "Dockerfile").read_text())
INTERPOLATION = re.compile(r"\$(\$|\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)?")


def unescape(value: str) -> str:
    """A value as compose passes it: ``$$`` is a literal ``$``; this file uses no other interpolation."""
    for match in INTERPOLATION.finditer(value):
        assert match.group(1) == "$", f"compose would interpolate {match.group(0)!r} in {value!r}"
    return value.replace("$$", "$")


def mounts(service: str) -> dict[str, Path]:
    """Bind mounts of ``service``: container path -> host path (named volumes left out)."""
    out: dict[str, Path] = {}
    for volume in SERVICES[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            out[target] = ROOT / source
    return out


def mounted_in(service: str, container_path: str) -> Path:
    """The host file that is ``container_path`` in ``service`` (directly, or under a mounted directory)."""
    for target, source in mounts(service).items():
        if container_path == target:
            return source
        if container_path.startswith(target.rstrip("/") + "/"):
            return source / container_path[len(target.rstrip("/")) + 1 :]
    raise AssertionError(f"{container_path} is not mounted in {service}")


def env(service: str) -> dict[str, str | None]:
    values = SERVICES[service].get("environment", {})
    assert isinstance(values, dict)
    return {k: None if v is None else unescape(str(v)) for k, v in values.items()}


def daemon_settings() -> config.CoreSettings:
    configured = {k: v for k, v in env("trace-repro").items() if v is not None}
    image_env = dockerfile.env(dockerfile.chain(STAGES, SERVICES["trace-repro"]["build"]["target"]))
    return config.load(mounted_in("trace-repro", "/etc/trace-repro/trace-repro.toml"), {**image_env, **configured})


def connector() -> dict[str, str]:
    data = json.loads(mounted_in("connect-init", "/connect/debezium-postgres.json").read_text())
    assert isinstance(data, dict)
    return data


def test_every_image_is_pinned_by_tag() -> None:
    """A service runs an image with an explicit tag (never latest), or one built here from a Dockerfile target."""
    for name, service in SERVICES.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest" and "/" not in tag, f"{name}: {image}"
        if "build" in service:
            target = service["build"].get("target")
            assert target is None or target in {s.name for s in STAGES}, name


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_mounted_file_exists_and_parses(service: str) -> None:
    """Each bind-mounted file or directory exists; each YAML or JSON file in it parses."""
    for target, source in mounts(service).items():
        assert source.exists(), f"{service}: {source} (-> {target})"
        files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        assert files, f"{service}: {source} is empty"
        for path in files:
            if path.suffix in (".yml", ".yaml"):
                assert yaml.safe_load(path.read_text()) is not None, path
            elif path.suffix == ".json":
                json.loads(path.read_text())


def test_depends_on_names_services_and_waits_for_what_it_can() -> None:
    """Every dependency is a service; `service_healthy` only on one with a health check (its own or its image's),
    `service_completed_successfully` only on one-shot services."""
    image_health = dockerfile.last(dockerfile.chain(STAGES, "shop"), "HEALTHCHECK")
    for name, service in SERVICES.items():
        needs = service.get("depends_on", {})
        for dep, how in needs.items() if isinstance(needs, dict) else ((d, {}) for d in needs):
            assert dep in SERVICES, f"{name} depends on {dep}"
            condition = how.get("condition")
            if condition == "service_healthy":
                assert "healthcheck" in SERVICES[dep] or ("build" in SERVICES[dep] and image_health), (name, dep)
            if condition == "service_completed_successfully":
                assert SERVICES[dep].get("restart") == "no", (name, dep)


def test_falkordb_keeps_an_append_only_file_and_serves_the_browser() -> None:
    """AOF on (the README's requirement for the graph to survive a crash), and the FalkorDB Browser published."""
    falkordb = env("falkordb")
    args = (falkordb["REDIS_ARGS"] or "").split()
    assert args[args.index("--appendonly") + 1] == "yes"
    assert falkordb["BROWSER"] == "1" and "127.0.0.1:3000:3000" in SERVICES["falkordb"]["ports"]
    assert any(v.split(":")[0] == "falkordb-data" for v in SERVICES["falkordb"]["volumes"])


def test_the_shops_tables_exist_before_the_connector_captures_them() -> None:
    """The one-shot schema service applies the SQL `make demo` applies (bench/shop/schema.sql), every table the
    connector captures is created there, and the connector is registered only after it succeeded."""
    schema = mounted_in("shop-schema", "/schema/shop.sql")
    assert schema == shop_db.SCHEMA
    command = SERVICES["shop-schema"]["command"]
    assert command[-2:] == ["-f", "/schema/shop.sql"] and "ON_ERROR_STOP=1" in command
    dsn = urlsplit(command[1])
    postgres = env("postgres")
    wanted = ("postgres", postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], f"/{postgres['POSTGRES_DB']}")
    assert (dsn.hostname, dsn.username, dsn.password, dsn.path) == wanted
    created = set(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", schema.read_text()))
    captured = {t.split(".")[1] for t in connector()["table.include.list"].split(",")}
    assert captured <= created
    waits = SERVICES["connect-init"]["depends_on"]
    assert waits["shop-schema"] == {"condition": "service_completed_successfully"}


def test_the_connector_reaches_postgres_and_its_topics_are_what_the_daemon_reads() -> None:
    """Debezium's database is the postgres service's; every topic it writes matches the daemon's CDC pattern."""
    c = connector()
    postgres = env("postgres")
    assert c["database.hostname"] in SERVICES
    assert (c["database.user"], c["database.password"], c["database.dbname"]) == (
        postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"])  # fmt: skip
    pattern = re.compile(daemon_settings().kafka.cdc_pattern)
    for table in c["table.include.list"].split(","):
        assert pattern.fullmatch(f"{c['topic.prefix']}.{table}"), table


def test_the_daemon_settings_are_valid_and_every_name_is_one() -> None:
    """The daemon's TRACE_REPRO_* names are settings (config_names: no typo silently ignored) and, with the mounted
    configuration and the image's environment, load; its addresses are the compose services; invariants name a
    captured table."""
    names = {k: v or "x" for k, v in env("trace-repro").items()}
    assert config_names.unknown_env(names, config.settings_model()) == []
    settings = daemon_settings()
    assert settings.http.host == "0.0.0.0"
    assert settings.kafka.bootstrap == "kafka:9092" and "INTERNAL://kafka:9092" in str(
        SERVICES["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"])  # fmt: skip
    assert urlsplit(settings.falkordb.url).hostname == "falkordb"
    assert urlsplit(settings.postgres_dsn).hostname == "postgres"
    captured = {t.split(".")[1] for t in connector()["table.include.list"].split(",")}
    collisions = getattr(settings, "collisions")  # noqa: B009 - a component section: no static attribute
    assert set(collisions.invariants) <= captured and collisions.invariants
    repro = getattr(settings, "repro")  # noqa: B009
    assert repro.enabled and repro.source_root == "/opt/trace-repro"
    shop = dockerfile.chain(STAGES, "shop")
    copied = {rest.split()[-1] for s in shop for op, rest in s.instructions if op == "COPY"}
    assert f"{repro.source_root}/bench/shop" in copied and repro.schema_sql.startswith(
        repro.source_root + "/bench/shop"
    )


def test_the_daemon_publishes_its_metrics_port_and_prometheus_scrapes_it() -> None:
    """The published port is the daemon's http.port; Prometheus (its compose config) scrapes trace-repro at it as
    job="trace-repro" and loads the shipped rules, mounted where rule_files points."""
    port = daemon_settings().http.port
    assert f"127.0.0.1:{port}:{port}" in SERVICES["trace-repro"]["ports"]
    prom_config_path = next(a.split("=", 1)[1] for a in SERVICES["prometheus"]["command"] if "--config.file" in a)
    prom = yaml.safe_load(mounted_in("prometheus", prom_config_path).read_text())
    (job,) = prom["scrape_configs"]
    assert job["job_name"] == "trace-repro"
    assert job["static_configs"][0]["targets"] == [f"trace-repro:{port}"]
    for rule_file in prom["rule_files"]:
        in_container = str(Path(prom_config_path).parent / rule_file)
        assert mounted_in("prometheus", in_container) == ROOT / "config" / "prometheus" / "alerts.yml"
        assert yaml.safe_load(mounted_in("prometheus", in_container).read_text())["groups"]


def test_grafana_is_provisioned_with_the_prometheus_and_the_dashboard() -> None:
    """The provisioned data source is the prometheus service (its default port) and the dashboard's data source
    variable takes its type; the dashboards provider reads the directory the dashboard JSON is mounted in."""
    provisioning = mounted_in("grafana", "/etc/grafana/provisioning")
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    url = urlsplit(datasource["url"])
    assert (
        url.hostname == "prometheus" and url.port == 9090 and "127.0.0.1:9090:9090" in SERVICES["prometheus"]["ports"]
    )
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "trace-repro.yml").read_text())["providers"]
    folder = provider["options"]["path"]
    dashboard = json.loads(mounted_in("grafana", f"{folder}/trace-repro.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == datasource["type"]


def test_the_collector_writes_what_the_daemon_reads() -> None:
    """The mounted Collector config exports to the kafka service, on the daemon's spans and logs topics."""
    collector = SERVICES["otel-collector"]
    path = next(a.split("=", 1)[1] for a in collector["command"] if a.startswith("--config="))
    exporter = yaml.safe_load(mounted_in("otel-collector", path).read_text())["exporters"]["kafka"]
    settings = daemon_settings()
    assert exporter["brokers"] == [settings.kafka.bootstrap]
    assert exporter["traces"] == {"topic": settings.kafka.spans_topic, "encoding": settings.kafka.span_encoding}
    assert exporter["logs"]["topic"] == settings.kafka.logs_topic


def test_the_workload_writes_shop_traffic_where_the_daemon_reads() -> None:
    """The workload is the shop target running bench.shop against the postgres and kafka services, on the spans
    topic the daemon reads (bench.shop's default)."""
    workload = SERVICES["workload"]
    assert workload["build"]["target"] == "shop"
    (script,) = workload["command"]
    assert "python -m bench.shop" in script
    assert "--dsn postgresql://shop:shop@postgres:5432/shop" in script and "--kafka kafka:9092" in script
    assert "--topic" not in script and daemon_settings().kafka.spans_topic == "otlp_spans"
