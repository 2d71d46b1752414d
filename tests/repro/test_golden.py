"""Golden files of the generated sources: a change to the harness or the data layout shows up as a diff.

Regenerate with ``UPDATE_GOLDEN=1 pytest tests/repro/test_golden.py`` and review the diff.
"""

from __future__ import annotations

import os

import pytest

from bench.shop.repro_specs import CALL_SPECS, SCHEMA_SQL
from processors.repro import GeneratedTest, compile_repro
from tests.repro.cases import ANOMALIES, HERE, REPO, incident

GOLDEN = HERE / "golden"


def normalised(test: GeneratedTest) -> str:
    """The source with the checkout's path (in the recorded files and the source root) replaced."""
    return test.source.replace(repr(str(REPO))[1:-1], "<repo>")


@pytest.mark.parametrize("level", ["sql", "app"])
@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_generated_source_matches_its_golden_file(anomaly: str, level: str) -> None:
    """Compiling a captured incident gives exactly the reviewed source (SQL level derives its table, app level
    carries the shop's schema)."""
    schema = SCHEMA_SQL if level == "app" else None
    test = compile_repro(incident(anomaly), level=level, schema_sql=schema, call_specs=CALL_SPECS)
    golden = GOLDEN / f"{anomaly}_{level}.py.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(normalised(test), encoding="utf-8")
    assert golden.exists(), f"{golden.name} is missing: run with UPDATE_GOLDEN=1"
    assert normalised(test) == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("level", ["sql", "app"])
def test_the_captured_phantom_matches_its_golden_file(level: str) -> None:
    """The shop's double charge as the pipeline now reports it (a phantom over two inserted rows): the SQL level
    carries the stale-read check; the application level calls the charge with its INSERT's parameters (the lookup
    that found nothing is not counted by the shop's call specs)."""
    schema = SCHEMA_SQL if level == "app" else None
    test = compile_repro(incident("phantom"), level=level, schema_sql=schema, call_specs=CALL_SPECS)
    golden = GOLDEN / f"phantom_{level}.py.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(normalised(test), encoding="utf-8")
    assert golden.exists(), f"{golden.name} is missing: run with UPDATE_GOLDEN=1"
    assert normalised(test) == golden.read_text(encoding="utf-8")


def test_compiling_is_deterministic() -> None:
    """The same incident compiles to the same bytes every time."""
    first, second = (compile_repro(incident("lost_update")).source for _ in range(2))
    assert first == second
