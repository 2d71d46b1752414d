"""Fixtures of the fault tests: a private Kafka and FalkorDB that the tests kill and restart.

They never touch the session's shared engines (``tests/conftest.py``): the engines here live in a run directory of
their own, started once for this folder and stopped at its end. A test that kills an engine restarts it before it
ends, so the next test finds both healthy.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamer.engines import LocalEngines
from tests.faults.faultkit import private_engines


@pytest.fixture(scope="package")
def fault_engines() -> Iterator[LocalEngines]:
    """Kafka (KRaft) and FalkorDB (AOF on), private to the fault tests."""
    with private_engines("kafka", "falkordb") as engines:
        yield engines


@pytest.fixture
def healthy(fault_engines: LocalEngines) -> LocalEngines:
    """The private engines, restarted first if an earlier test left one down."""
    for status in fault_engines.status():
        if status.name in ("kafka", "falkordb") and not status.healthy:
            fault_engines.restart(status.name)
    return fault_engines
