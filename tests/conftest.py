"""Session fixtures: the real local engines, started once per test run and stopped at its end.

When ``TRACE_REPRO_TEST_REUSE=1`` and a ``trace-repro local up`` is running, its engines are used and left
running (fast local iterations); otherwise the session starts its own in a private run directory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamer.engines import Layout, LocalEngines


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
