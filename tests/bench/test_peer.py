"""The bench's peer Collector: the configuration it runs with, how it is judged done, and the CPU arithmetic.

Nothing here builds or runs the Collector (``make bench`` does); the configuration is checked against what the
pinned components accept by name, the figures are arithmetic on one run's numbers.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from bench import peer

BOOTSTRAP = "127.0.0.1:9092,127.0.0.1:9093"


def _config(pipeline: str) -> dict[str, Any]:
    cfg = peer.peer_config(pipeline, bootstrap=BOOTSTRAP, topic="bench-spans-x", group="g-1", metrics_port=18888)
    loaded: dict[str, Any] = yaml.safe_load(yaml.safe_dump(cfg))  # what the Collector reads
    return loaded


def test_pipeline_a_assembles_traces_before_the_span_metrics() -> None:
    cfg = _config("assemble")
    kafka = cfg["receivers"]["kafka"]
    assert kafka["brokers"] == ["127.0.0.1:9092", "127.0.0.1:9093"]
    assert kafka["group_id"] == "g-1" and kafka["initial_offset"] == "earliest"
    assert kafka["traces"] == {"topics": ["bench-spans-x"], "encoding": "otlp_proto"}
    assert cfg["processors"] == {"groupbytrace": {"wait_duration": "1s"}}
    assert cfg["connectors"] == {"span_metrics": {"metrics_flush_interval": "1s"}}
    pipelines = cfg["service"]["pipelines"]
    assert pipelines["traces"] == {
        "receivers": ["kafka"],
        "processors": ["groupbytrace"],
        "exporters": ["span_metrics"],
    }
    assert pipelines["metrics"] == {"receivers": ["span_metrics"], "exporters": ["nop"]}
    reader = cfg["service"]["telemetry"]["metrics"]["readers"][0]["pull"]["exporter"]["prometheus"]
    assert reader == {"host": "127.0.0.1", "port": 18888}


def test_pipeline_b_only_aggregates() -> None:
    cfg = _config("aggregate")
    assert cfg["processors"] == {}
    assert cfg["service"]["pipelines"]["traces"]["processors"] == []
    assert cfg["service"]["pipelines"]["metrics"]["exporters"] == ["nop"]
    with pytest.raises(ValueError, match="pipeline"):
        peer.peer_config("servicegraph", bootstrap=BOOTSTRAP, topic="t", group="g", metrics_port=1)


def test_every_component_configured_is_one_the_build_has() -> None:
    """A component the builder config does not list would make the Collector refuse to start."""
    built = yaml.safe_load((peer.MODULE_DIR.parent / "builder-config.yaml").read_text())
    listed = {entry["gomod"].split()[0].rsplit("/", 1)[1].removesuffix(kind)
              for kind in ("receiver", "processor", "connector", "exporter")
              for entry in built.get(kind + "s", [])}  # fmt: skip
    for pipeline in peer.PIPELINES:
        cfg = _config(pipeline)
        used = {name for section in ("receivers", "processors", "connectors", "exporters") for name in cfg[section]}
        assert {name.replace("_", "") for name in used} <= listed, used  # span_metrics: spanmetricsconnector


TELEMETRY = """# HELP otelcol_receiver_accepted_spans_total Number of spans successfully pushed into the pipeline.
# TYPE otelcol_receiver_accepted_spans_total counter
otelcol_receiver_accepted_spans_total{otel_scope_name="x",receiver="kafka",transport="kafka"} 1200
otelcol_receiver_accepted_spans_total{otel_scope_name="x",receiver="otlp",transport="grpc"} 7
otelcol_processor_groupbytrace_spans_released_total{otel_scope_name="y",processor="groupbytrace"} 800
otelcol_processor_groupbytrace_num_traces_in_memory{otel_scope_name="y"} 40
"""


def test_done_is_read_from_the_collectors_own_metrics() -> None:
    """B is done with a span once the kafka receiver accepted it; A once groupbytrace released it."""
    assert peer.handled_spans("aggregate", TELEMETRY) == 1200  # the otlp receiver's 7 are not the bench's
    assert peer.handled_spans("assemble", TELEMETRY) == 800
    assert peer.metric_sum(TELEMETRY, "otelcol_processor_groupbytrace_num_traces_in_memory") == 40
    assert peer.metric_sum(TELEMETRY, "otelcol_receiver_accepted_spans") == 1207
    assert peer.metric_sum(TELEMETRY, "otelcol_receiver_refused_spans") is None
    assert peer.handled_spans("assemble", "") == 0


def test_cpu_per_span_and_the_ratios() -> None:
    """µs per span from CPU seconds; daemon / A and daemon / B, alone and with FalkorDB."""
    e2e = {"spans": 300_000, "seconds": 30.0, "cpu_s": {"daemon": 20.04, "falkordb": 8.31, "kafka": 3.0},
           "cpu_cores": {"daemon": 0.67, "falkordb": 0.28}}  # fmt: skip
    peers = {"assemble": {"cpu_us_per_span": peer.us_per_span(9.12, 300_000)},
             "aggregate": {"cpu_us_per_span": peer.us_per_span(1.005, 300_000)}}  # fmt: skip
    c = peer.compare(e2e, peers)
    assert c["daemon_us_per_span"] == pytest.approx(66.8)
    assert c["daemon_falkordb_us_per_span"] == pytest.approx(94.5)
    assert c["assemble_us_per_span"] == pytest.approx(30.4) and c["aggregate_us_per_span"] == pytest.approx(3.35)
    assert c["daemon_over_assemble"] == pytest.approx(66.8 / 30.4)
    assert c["daemon_over_aggregate"] == pytest.approx(66.8 / 3.35)
    assert c["daemon_falkordb_over_assemble"] == pytest.approx(94.5 / 30.4)
    # results without the unrounded seconds fall back to the shares of a core over the phase
    older = peer.compare({"spans": 300_000, "seconds": 30.0, "cpu_cores": {"daemon": 0.5}}, peers)
    assert older["daemon_us_per_span"] == pytest.approx(50.0) and older["daemon_falkordb_us_per_span"] is None
    assert peer.compare(e2e, None)["daemon_over_assemble"] is None
    assert peer.us_per_span(None, 10) is None and peer.us_per_span(1.0, 0) is None


def test_the_targets_are_reported_not_asserted() -> None:
    """daemon <= A and, the moonshot, daemon <= 3 x B; without a peer run both are not measured."""
    phases: dict[str, Any] = {
        "end_to_end": {"spans": 1_000, "seconds": 1.0, "cpu_s": {"daemon": 0.05}},
        "peer": {"assemble": {"cpu_us_per_span": 60.0}, "aggregate": {"cpu_us_per_span": 10.0}},
    }
    got = {t["name"]: (t["value"], t["limit"], t["met"]) for t in peer.targets(phases)}
    assert got == {"daemon CPU/span / peer A": (pytest.approx(50 / 60), 1.0, True),
                   "daemon CPU/span / peer B": (pytest.approx(5.0), 3.0, False)}  # fmt: skip
    assert {t["met"] for t in peer.targets({"end_to_end": phases["end_to_end"]})} == {None}


def test_the_report_prints_both_peers_beside_the_daemon() -> None:
    run = {"pipeline": "p", "seconds": 2.0, "spans_per_s": 500.0, "peak_rss_mb": 90.0}
    phases = {
        "end_to_end": {"spans": 1_000, "seconds": 1.0, "cpu_s": {"daemon": 0.05, "falkordb": 0.01}},
        "peer": {"assemble": run | {"cpu_us_per_span": 25.0}, "aggregate": run | {"cpu_us_per_span": 5.0}},
    }
    text = "\n".join(peer.report_lines(phases))
    assert "(bench messages, same topic)" in text and "collector messages" not in text
    assert "25.00" in text and "5.00" in text
    assert "50.00 µs/span   / A 2.00x, / B 10.00x" in text
    assert "60.00 µs/span   / A 2.40x, / B 12.00x" in text
    assert peer.report_lines({"end_to_end": phases["end_to_end"]}) == []
    assert "(collector messages, same topic)" in peer.report_lines(phases, "collector")[0]  # --message-shape collector


def test_the_peer_is_its_own_module_built_from_what_the_builder_config_lists() -> None:
    """The committed sources are the Builder's output for its config: every component at the pinned version in
    ``go.mod`` (with ``go.sum`` committed), and a cache entry of its own beside the test Collector's."""
    from bench.collector import build

    built = yaml.safe_load((peer.MODULE_DIR.parent / "builder-config.yaml").read_text())
    go_mod = (peer.MODULE_DIR / "go.mod").read_text()
    for kind in ("receivers", "processors", "connectors", "exporters", "providers"):
        for entry in built[kind]:
            module, version = entry["gomod"].split()
            assert f"\t{module} {version}\n" in go_mod, entry
    assert (peer.MODULE_DIR / "go.sum").is_file() and built["dist"]["version"] == build.RELEASE
    assert peer.PEER.cached_path().parent.name.startswith(f"otelcol-peer-{build.RELEASE}-")
    assert peer.PEER.digest() != build.digest()
