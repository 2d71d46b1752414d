"""The columnar probe reads every span once, groups them by trace, and finds what the stage's CALLS would."""

from __future__ import annotations

import pytest

from bench.columnar_probe import columnar
from bench.otlp_gen import generate_run


@pytest.mark.parametrize("shape", ["bench", "collector"])
def test_every_span_is_counted_once_and_grouped_by_trace(shape: str) -> None:
    gen = generate_run(3_000, 300, 7, partitions=2, shape=shape)
    cols = columnar(gen)
    assert cols.spans == gen.spans
    assert len(cols.traces) == gen.traces
    assert sum(figures[0] for figures in cols.stats.values()) == gen.spans
    assert sum(sum(figures[3].values()) for figures in cols.stats.values()) == gen.spans
    assert all(service for service, _ in cols.stats)  # every generated resource names its service
    errors = sum(figures[2] for figures in cols.stats.values())
    assert (errors > 0) == (gen.error_traces > 0)
    assert cols.calls and all(parent != child for parent, _, child, _ in cols.calls)
