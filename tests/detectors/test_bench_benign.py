"""The bench's benign traffic through a real ingest stage with the shipped settings: no per-trace finding."""

from __future__ import annotations

from bench.otlp_gen import generate_run
from bench.pertrace_benign import run


def test_bench_traffic_gives_no_performance_finding() -> None:
    """A healthy shop's traffic (the bench generator, errors included) makes no N+1, fan-out or retry finding, and
    no bound of the detectors is hit (the full 300k spans: ``python -m bench.pertrace_benign``)."""
    report = run(generate_run(20_000, seed=7))
    assert report["findings"] == {}
    assert all(not d for d in report["dropped"].values()), report["dropped"]
    assert all(c.get("windows_closed") for c in report["counted"].values()), report["counted"]
