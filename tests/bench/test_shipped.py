"""The shipped-windows phase of the bench: the daemon's settings, how its /metrics are read, its targets."""

from __future__ import annotations

from typing import Any

import pytest

import bench.shipped
from bench.run import targets as bench_targets
from bench.shipped import _metric_sum, _progress, report, shipped_env, targets
from streamer import config

METRICS = """\
trace_repro_committed_offset{partition="0",topic="bench-spans-shipped-t"} 40.0
trace_repro_committed_offset{partition="1",topic="bench-spans-shipped-t"} 2.0
trace_repro_committed_offset{partition="0",topic="bench-spans-shipped-tt"} 7.0
trace_repro_consumer_lag_messages{partition="0",topic="bench-accesses-shippedt"} 0.0
trace_repro_open_traces 3.0
"""


def test_the_daemon_runs_with_the_shipped_windows_and_its_own_topics() -> None:
    env = shipped_env("127.0.0.1:9", "redis://127.0.0.1:9", "shippedt", "bench-spans-shipped-t", 0)
    settings = config.load(None, env=env)
    shipped = config.load(None, env={})
    assert settings.windows == shipped.windows and settings.windows.window_s == 60
    assert settings.kafka.spans_topic == "bench-spans-shipped-t" and settings.kafka.group_id == "bench-shippedt"


def test_progress_reads_the_traces_still_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for the 60 s windows starts only once every trace has closed: a burst's closing work is not idle."""
    monkeypatch.setattr(bench.shipped, "fetch_metrics", lambda port, timeout_s: METRICS)
    assert _progress(0, "bench-spans-shipped-t") == {"consumed": 0.0, "committed": 42.0, "open_traces": 3.0,
                                                     "stage2_lag": 0.0}  # fmt: skip
    monkeypatch.setattr(bench.shipped, "fetch_metrics", lambda port, timeout_s: METRICS.replace(" 3.0", " 0.0"))
    assert _progress(0, "bench-spans-shipped-t")["open_traces"] == 0.0


def test_a_metric_is_summed_over_the_partitions_of_its_topic_only() -> None:
    assert _metric_sum(METRICS, "trace_repro_committed_offset", "bench-spans-shipped-t") == 42.0
    assert _metric_sum(METRICS, "trace_repro_consumer_lag_messages", "bench-accesses-shippedt") == 0.0
    assert _metric_sum(METRICS, "trace_repro_consumer_lag_messages", "bench-spans-shipped-t") is None


def _shipped(**figures: Any) -> dict[str, Any]:
    base = {"spans": 300_000, "idle_s": 30.0, "processes": 1, "idle_no_traffic_cores": 0.012, "waiting_cores": 0.3,
            "waiting_median_cores": 0.015, "waiting_from_s": 25.0, "committed_s": 61.0,
            "idle_after_commit_cores": 0.011, "idle_after_commit_median_cores": 0.01, "peak_rss_mb": 299.0,
            "peak_rss_mb_per_process": [299.0], "rss_before_traffic_mb": 82.0, "consumed_s": 7.0}  # fmt: skip
    return base | figures


def test_targets_idle_below_two_hundredths_of_a_core_and_300_mb() -> None:
    met = {t["name"]: t["met"] for t in targets(_shipped())}
    assert set(met.values()) == {True} and len(met) == 4
    worse = {t["name"]: t for t in targets(_shipped(waiting_median_cores=0.15, peak_rss_mb=435.0))}
    assert worse["shipped: idle waiting for 60 s"]["met"] is False
    assert worse["shipped: daemon peak RSS (MB)"]["met"] is False
    assert worse["shipped: idle, no traffic"]["met"] is True
    unmeasured = {t["name"]: t for t in targets({k: v for k, v in _shipped().items() if not k.startswith("wait")})}
    assert unmeasured["shipped: idle waiting for 60 s"]["met"] is None
    assert "median second 0.150, mean 0.300" in report(_shipped(waiting_median_cores=0.15))


def test_the_bench_reports_the_shipped_targets_beside_its_own() -> None:
    results = {"ratio": {"over_floor": {}, "end_to_end_over_slowest": None, "slowest": ""},
               "phases": {"stage": {"spans": 1, "graph_rows": {}}, "shipped": _shipped(peak_rss_mb=435.0)},
               "config": {"spans": 300_000}, "rss": {}}  # fmt: skip
    names = {t["name"]: t["met"] for t in bench_targets(results)}
    assert names["shipped: daemon peak RSS (MB)"] is False
