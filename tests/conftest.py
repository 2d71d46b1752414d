"""Session fixtures: the real local engines, started once per test run and stopped at its end.

When ``TRACE_REPRO_TEST_REUSE=1`` and a ``trace-repro local up`` is running, its engines are used and left
running (fast local iterations); otherwise the session starts its own in a private run directory.
The OpenTelemetry Collector (``bench.collector``) and the Helm chart checker (``bench.chartcheck``) are compiled once
and cached; when a collected test needs one, its build starts in the background at collection time and those tests
run last, so a cold build overlaps the others.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import chartcheck
from bench.collector import build as collector_build
from bench.collector import process as collector_process
from streamer.engines import Layout, LocalEngines

# Fixtures on a cached Go binary, with the program that builds it.
GO_BUILT = {"otel_collector": collector_build.COLLECTOR, "chartcheck_binary": chartcheck.CHECKER}


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only a selected test starts the build
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests on a Go binary (the Collector, the chart checker) run last (in their order), its build started now: a
    cold build overlaps the rest."""
    last: set[int] = set()
    needs: list[pytest.Item] = []
    for fixture, program in GO_BUILT.items():
        using = [item for item in items if fixture in getattr(item, "fixturenames", ())]
        if using and not config.option.collectonly:
            program.start_background()
        needs += [item for item in using if id(item) not in last]
        last |= set(map(id, using))
    if needs:
        items[:] = [item for item in items if id(item) not in last] + needs


@pytest.fixture(scope="session")
def engines() -> Iterator[LocalEngines]:
    """All four engines (Kafka, FalkorDB, PostgreSQL, Kafka Connect with Debezium), healthy."""
    if os.environ.get("TRACE_REPRO_TEST_REUSE") == "1":
        shared = LocalEngines()
        if all(s.healthy for s in shared.status()):
            yield shared
            return
    default = Layout.default()
    run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-test-"))
    local = LocalEngines(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir))
    try:
        local.up()
        yield local
    finally:
        local.down()


@pytest.fixture(scope="session")
def kafka_bootstrap(engines: LocalEngines) -> str:
    return engines.address("kafka")


@pytest.fixture(scope="session")
def falkordb_url(engines: LocalEngines) -> str:
    return engines.address("falkordb")


@pytest.fixture(scope="session")
def postgres_dsn(engines: LocalEngines) -> str:
    return engines.address("postgres")


@pytest.fixture(scope="session")
def otelcol_binary() -> Path:
    """The stock Collector (otlp receiver, batch processor, kafka exporter), built once and cached."""
    return collector_build.start_background().result()


@pytest.fixture(scope="session")
def chartcheck_binary() -> Path:
    """The Helm chart checker (deploy/helm/check: Helm's renderer, strict Kubernetes decoding), built once, cached."""
    return chartcheck.CHECKER.start_background().result()


@pytest.fixture
def otel_collector(
    otelcol_binary: Path, kafka_bootstrap: str, tmp_path: Path
) -> Iterator[collector_process.StartCollector]:
    """Starts Collectors on the shipped config writing spans to the topic given (logs to ``<topic>-logs``); each
    is stopped at the end of the test (SIGTERM: it drains to Kafka first); its log is in the test's tmp_path."""
    started: list[collector_process.Collector] = []

    def start(spans_topic: str) -> collector_process.Collector:
        collector = collector_process.start(
            otelcol_binary,
            kafka_bootstrap=kafka_bootstrap,
            spans_topic=spans_topic,
            logs_topic=f"{spans_topic}-logs",
            work_dir=tmp_path / f"collector-{len(started)}",
        )
        started.append(collector)
        print(f"Collector {collector.http_endpoint} -> {spans_topic}; log: {collector.log}")
        return collector

    yield start
    for collector in started:
        collector.stop()
