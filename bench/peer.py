"""The peer in ``make bench``: a stock OpenTelemetry Collector on the bench's own spans topic, in the same run.

``bench/collector/peer/otelcol`` is what the Collector Builder generates from ``builder-config.yaml`` beside it
(contrib kafka receiver, groupbytrace processor, spanmetrics connector, the core nop exporter; one pinned release),
compiled once into the cache like the test Collector (:class:`bench.collector.build.GoProgram`).

After the daemon's end-to-end phase the bench runs it twice on the topic the daemon read, each time with a fresh
consumer group reading from the earliest offset:

- ``assemble`` (A): kafka -> groupbytrace -> span_metrics -> nop: trace assembly (every span held by trace id until
  ``wait_duration`` after the trace's first span, 1 s like the daemon's ``trace_gap_s``) and RED metrics;
- ``aggregate`` (B): kafka -> span_metrics -> nop: RED metrics only.

Each run is measured from /proc as the Collector's user + system CPU seconds from the moment its own metrics
endpoint answers (pipelines built, the consumer group about to join) until it has handled every span, judged from
its own internal metrics: the receiver's accepted spans for B, the spans groupbytrace released for A (so A's
figure includes the 1 s wait). Spanmetrics flushes every second (``metrics_flush_interval``, 60 s by default),
like the daemon's 1 s windows. The figures are CPU µs per span beside the daemon's (its processes alone, and with
FalkorDB, from the end-to-end phase) and the ratios daemon / A and daemon / B; the targets are daemon <= A and,
the moonshot, daemon <= 3 x B. They are reported, never asserted.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from bench.collector.build import RELEASE, GoProgram
from bench.metrics import fetch_metrics
from bench.procfs import proc_cpu_s, proc_mb
from streamer.engines.process import EngineError, alive, free_port, spawn, stop

MODULE_DIR = Path(__file__).resolve().parent / "collector" / "peer" / "otelcol"
PEER = GoProgram("otelcol-peer", MODULE_DIR, RELEASE, "the peer Collector")
PIPELINES = {
    "assemble": "kafka -> groupbytrace -> span_metrics -> nop",
    "aggregate": "kafka -> span_metrics -> nop",
}
WAIT_DURATION_S = 1.0  # groupbytrace: like the daemon's trace_gap_s in the bench
FLUSH_INTERVAL_S = 1.0  # spanmetrics: like the daemon's window_s in the bench
POLL_S = 0.5  # how often the Collector's metrics endpoint is read (each read costs it a little CPU)
START_TIMEOUT_S = 60.0
TARGETS = {"daemon_over_assemble": 1.0, "daemon_over_aggregate": 3.0}  # daemon <= A; moonshot: daemon <= 3 x B


def peer_config(pipeline: str, *, bootstrap: str, topic: str, group: str, metrics_port: int) -> dict[str, Any]:
    """The Collector configuration of one peer run: ``pipeline`` is ``assemble`` (A) or ``aggregate`` (B)."""
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {', '.join(PIPELINES)}")
    processors = ["groupbytrace"] if pipeline == "assemble" else []
    return {
        "receivers": {
            "kafka": {
                "brokers": bootstrap.split(","),
                "client_id": f"trace-repro-peer-{pipeline}",
                "group_id": group,
                "initial_offset": "earliest",
                "traces": {"topics": [topic], "encoding": "otlp_proto"},
            }
        },
        "processors": {"groupbytrace": {"wait_duration": f"{WAIT_DURATION_S:g}s"}} if processors else {},
        "connectors": {"span_metrics": {"metrics_flush_interval": f"{FLUSH_INTERVAL_S:g}s"}},
        "exporters": {"nop": {}},
        "service": {
            "telemetry": {
                "logs": {"level": "warn"},
                "metrics": {
                    "level": "normal",
                    "readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": metrics_port}}}}],
                },
            },
            "pipelines": {
                "traces": {"receivers": ["kafka"], "processors": processors, "exporters": ["span_metrics"]},
                "metrics": {"receivers": ["span_metrics"], "exporters": ["nop"]},
            },
        },
    }


def metric_sum(text: str, name: str, **labels: str) -> float | None:
    """The sum of every sample of ``name`` (with or without a ``_total`` suffix) whose labels include ``labels``,
    in the Prometheus text format; None when there is none."""
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:\{{([^}}]*)\}})? (\S+)$", re.M)
    found = None
    for match in pattern.finditer(text):
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            found = (found or 0.0) + float(match.group(2))
    return found


def handled_spans(pipeline: str, text: str) -> float:
    """Spans the peer is done with: released by groupbytrace (A), accepted by the kafka receiver (B)."""
    if pipeline == "assemble":
        return metric_sum(text, "otelcol_processor_groupbytrace_spans_released") or 0.0
    return metric_sum(text, "otelcol_receiver_accepted_spans", receiver="kafka") or 0.0


def us_per_span(cpu_s: float | None, spans: int) -> float | None:
    """CPU microseconds per span; None when not measured."""
    return None if cpu_s is None or spans <= 0 else cpu_s * 1e6 / spans


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def run_one(binary: Path, pipeline: str, *, bootstrap: str, topic: str, spans: int, work_dir: Path) -> dict[str, Any]:
    """One peer run on ``topic`` (``spans`` in it), from a fresh group at the earliest offset; its CPU figures."""
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    group = f"bench-peer-{pipeline}-{uuid.uuid4().hex[:8]}"
    config = work_dir / f"peer-{pipeline}.yaml"
    config.write_text(yaml.safe_dump(peer_config(pipeline, bootstrap=bootstrap, topic=topic, group=group,
                                                 metrics_port=port)))  # fmt: skip
    log = work_dir / f"peer-{pipeline}.log"
    log.write_text("")
    launch = time.monotonic()
    pid = spawn([str(binary), f"--config={config}"], log=log, cwd=work_dir)
    handled = 0.0
    try:
        deadline = launch + START_TIMEOUT_S
        while (text := fetch_metrics(port, timeout_s=5)) is None:
            if not alive(pid) or time.monotonic() > deadline:
                raise EngineError(f"the peer Collector ({pipeline}) did not start; see {log}")
            time.sleep(0.05)
        ready, cpu_ready = time.monotonic(), proc_cpu_s(pid) or 0.0
        deadline = ready + 120 + spans / 5_000
        while (handled := handled_spans(pipeline, text or "")) < spans:
            if not alive(pid) or time.monotonic() > deadline:
                raise EngineError(f"the peer ({pipeline}) handled {handled:,.0f} of {spans:,} spans; see {log}")
            time.sleep(POLL_S)
            text = fetch_metrics(port, timeout_s=5)
        done, cpu_done = time.monotonic(), proc_cpu_s(pid)
        peak_mb = proc_mb(pid, "VmHWM")
    finally:
        stop(pid, grace_s=10)
    cpu_s = None if cpu_done is None else cpu_done - cpu_ready
    return {
        "pipeline": PIPELINES[pipeline],
        "spans": spans,
        "handled_spans": handled,
        "startup_s": ready - launch,
        "seconds": done - ready,
        "spans_per_s": spans / (done - ready) if done > ready else 0.0,
        "cpu_s": cpu_s,
        "startup_cpu_s": cpu_ready,
        "cpu_us_per_span": us_per_span(cpu_s, spans),
        "peak_rss_mb": peak_mb,
        "group": group,
        "log": str(log),
    }


def run_peers(bootstrap: str, topic: str, spans: int, work_dir: Path) -> dict[str, Any]:
    """Both peer runs, A then B, on ``topic`` (the binary is built first if the cache has none)."""
    binary = PEER.binary()
    return {name: run_one(binary, name, bootstrap=bootstrap, topic=topic, spans=spans, work_dir=work_dir)
            for name in PIPELINES}  # fmt: skip


def daemon_cpu_s(e2e: dict[str, Any], names: tuple[str, ...]) -> float | None:
    """CPU seconds the named processes (``daemon``, ``falkordb``) used in the end-to-end phase; None if any of
    them was not measured (FalkorDB only is when the bench started the engines)."""
    exact = e2e.get("cpu_s") or {}
    cores = e2e.get("cpu_cores") or {}
    total = 0.0
    for name in names:
        if name in exact:
            total += exact[name]
        elif name in cores:
            total += cores[name] * e2e["seconds"]  # older results: shares of a core, rounded
        else:
            return None
    return total


def compare(e2e: dict[str, Any] | None, peers: dict[str, Any] | None) -> dict[str, Any]:
    """The daemon's CPU µs per span (alone, with FalkorDB), the peers', and the ratios daemon / A and daemon / B."""
    e2e, peers = e2e or {}, peers or {}
    spans = int(e2e.get("spans", 0))
    daemon = us_per_span(daemon_cpu_s(e2e, ("daemon",)), spans) if e2e else None
    with_db = us_per_span(daemon_cpu_s(e2e, ("daemon", "falkordb")), spans) if e2e else None
    a = (peers.get("assemble") or {}).get("cpu_us_per_span")
    b = (peers.get("aggregate") or {}).get("cpu_us_per_span")
    return {
        "daemon_us_per_span": daemon,
        "daemon_falkordb_us_per_span": with_db,
        "assemble_us_per_span": a,
        "aggregate_us_per_span": b,
        "daemon_over_assemble": ratio(daemon, a),
        "daemon_over_aggregate": ratio(daemon, b),
        "daemon_falkordb_over_assemble": ratio(with_db, a),
        "daemon_falkordb_over_aggregate": ratio(with_db, b),
    }


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def report_lines(phases: dict[str, Any], primary: str = "bench") -> list[str]:
    """The report's rows: per message shape measured, the daemon's and the peers' CPU µs per span and the ratios.
    ``primary`` is the shape of the bench's own messages (``--message-shape``), those of ``end_to_end``."""
    lines: list[str] = []
    for shape, e2e_key, peer_key in SHAPE_KEYS:
        peers = phases.get(peer_key)
        shape = primary if e2e_key == "end_to_end" else shape
        if not peers:
            continue
        c = compare(phases.get(e2e_key), peers)
        lines.append(f"CPU per span against a stock OpenTelemetry Collector {RELEASE} ({shape} messages, same topic):")
        for name, run in peers.items():
            label = f"peer {'A' if name == 'assemble' else 'B'} {run['pipeline']}"
            lines.append(f"   {label:<52}{_us(run['cpu_us_per_span']):>8} µs/span   {run['seconds']:.1f}s, "
                         f"{run['spans_per_s']:,.0f} spans/s, peak RSS {run['peak_rss_mb'] or 0:.0f} MB")  # fmt: skip
        for label, us, key in (("daemon (its processes)", c["daemon_us_per_span"], "daemon"),
                               ("daemon + FalkorDB", c["daemon_falkordb_us_per_span"], "daemon_falkordb")):  # fmt: skip
            lines.append(f"   {label:<52}{_us(us):>8} µs/span   "
                         f"/ A {_x(c[key + '_over_assemble'])}, / B {_x(c[key + '_over_aggregate'])}")  # fmt: skip
    return lines


def targets(phases: dict[str, Any]) -> list[dict[str, Any]]:
    """daemon <= A and (moonshot) daemon <= 3 x B, on the bench-shaped messages; not measured without the peer."""
    c = compare(phases.get("end_to_end"), phases.get("peer"))
    out = []
    for key, name, note in (
        ("daemon_over_assemble", "daemon CPU/span / peer A", "A: kafka -> groupbytrace -> span_metrics"),
        ("daemon_over_aggregate", "daemon CPU/span / peer B", "moonshot; B: kafka -> span_metrics"),
    ):
        value, limit = c[key], TARGETS[key]
        met = None if value is None else value <= limit
        out.append({"name": name, "value": value, "limit": limit, "at_most": True, "met": met, "note": note})
    return out


SHAPE_KEYS = (("bench", "end_to_end", "peer"), ("collector", "end_to_end_collector", "peer_collector"))
"""(message shape, its end-to-end phase, its peer phase) in ``results["phases"]``."""
