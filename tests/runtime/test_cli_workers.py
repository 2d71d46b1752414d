"""``trace-repro run --workers``: the option, the worker count, the plan of processes, the merged /metrics."""

from __future__ import annotations

import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamer import cli, config
from streamer.runtime.workers import plan, worker_count
from streamer.runtime.workers.merge import merge


def test_workers_option_takes_a_positive_count_or_auto() -> None:
    """``--workers 3`` and ``--workers auto`` parse; 0 and words are refused at the command line."""
    assert cli.parser().parse_args(["run", "--workers", "3"]).workers == 3
    assert cli.parser().parse_args(["run", "--workers", "auto"]).workers == "auto"
    assert cli.parser().parse_args(["run"]).workers is None
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit):
            cli.parser().parse_args(["run", "--workers", bad])


def test_worker_count_prefers_the_option_then_the_setting_and_auto_is_the_cores() -> None:
    """The option wins over the ``workers`` setting; "auto" is the cores this process may run on."""
    cores = len(os.sched_getaffinity(0))
    assert worker_count(None, config.load(None, env={})) == 1  # the default, until multi-worker event time is proven
    assert worker_count(None, config.load(None, env={"TRACE_REPRO_WORKERS": "auto"})) == cores
    assert worker_count(None, config.load(None, env={"TRACE_REPRO_WORKERS": "3"})) == 3
    assert worker_count(1, config.load(None, env={"TRACE_REPRO_WORKERS": "3"})) == 1
    assert worker_count("auto", config.load(None, env={"TRACE_REPRO_WORKERS": "3"})) == cores
    with pytest.raises(config.ConfigError, match="workers"):
        config.load(None, env={"TRACE_REPRO_WORKERS": "0"})


def test_plan_runs_stage_two_and_the_sinks_once() -> None:
    """N ingest workers and one for stage 2 with the sinks; with ``--stage ingest`` the first worker runs the sinks."""
    both = plan(("ingest", "entities"), 2)
    assert [(w.role, w.index, w.stages, w.sinks) for w in both] == [
        ("ingest", 0, ("ingest",), False),
        ("ingest", 1, ("ingest",), False),
        ("entities", 0, ("entities",), True),
    ]
    assert [(w.role, w.sinks) for w in plan(("ingest",), 3)] == [("ingest", True), ("ingest", False), ("ingest", False)]


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_merged_metrics_sum_counters_and_keep_the_slowest_watermark() -> None:
    """Counters and histograms add up over workers; the watermark is the slowest one; sink health is the worst; the
    build info stays 1 (alert rules find the daemon by it)."""
    one = """# TYPE trace_repro_build_info gauge
trace_repro_build_info{version="0.1.0"} 1.0
# TYPE trace_repro_consumed_messages_total counter
trace_repro_consumed_messages_total{topic="s"} 3.0
# TYPE trace_repro_watermark_seconds gauge
trace_repro_watermark_seconds{stage="ingest"} 100.0
# TYPE trace_repro_sink_healthy gauge
trace_repro_sink_healthy{sink="graph"} 1.0
# TYPE trace_repro_batch_seconds histogram
trace_repro_batch_seconds_bucket{le="1.0",stage="ingest"} 2.0
trace_repro_batch_seconds_bucket{le="+Inf",stage="ingest"} 2.0
trace_repro_batch_seconds_count{stage="ingest"} 2.0
trace_repro_batch_seconds_sum{stage="ingest"} 0.5
# TYPE trace_repro_open_traces gauge
trace_repro_open_traces 4.0
"""
    two = one.replace(" 3.0", " 4.0").replace(" 100.0", " 90.0").replace('"graph"} 1.0', '"graph"} 0.0')
    merged = _samples(merge([one, two]))
    assert merged[("trace_repro_consumed_messages_total", (("topic", "s"),))] == 7
    assert merged[("trace_repro_watermark_seconds", (("stage", "ingest"),))] == 90
    assert merged[("trace_repro_sink_healthy", (("sink", "graph"),))] == 0
    assert merged[("trace_repro_batch_seconds_count", (("stage", "ingest"),))] == 4
    assert merged[("trace_repro_batch_seconds_bucket", (("le", "1.0"), ("stage", "ingest")))] == 4
    assert merged[("trace_repro_open_traces", ())] == 8
    assert merged[("trace_repro_build_info", (("version", "0.1.0"),))] == 1
