"""``make bench``: throughput ceilings of each part of the pipeline, and the real daemon end to end, in one run.

    .venv/bin/python -m bench.run [--spans N] [--quick] [--set section__key=value ...]
    .venv/bin/python -m bench.run --profile            # only the stage-only path, under cProfile
    .venv/bin/python -m bench.run --profile-daemon     # the end-to-end daemon under cProfile (out/daemon.prof)

Phases, over the same generated OTLP messages (``bench.otlp_gen``, on one partition per core by default, every
trace on one partition), all in spans per second and as a ratio to THE FLOOR (phase 0b):

0a. protobuf parse: ``TracesData.FromString`` of every message (upb), nothing read;
0b. the floor: parse + walk of every span's core fields (trace id, span id, parent id, start and end time, name,
   kind, status code), the least any decoder of these messages must do;
1. decode-only ceiling: ``decode_traces_proto`` over every message, in process;
2. stage-only ceiling: ``IngestStage.process`` over ``Record`` s in the batches the daemon's polls get (at most
   ``kafka.max_poll_records`` messages and ``kafka.max_partition_fetch_bytes`` per partition; decode, trace assembly,
   SQL analysis, windows, graph rows, access encoding), with an injected clock that is moved on at the end so that
   every trace and window closes (that final flush is timed too); its graph rows per span are reported;
3. FalkorDB-write ceiling: the graph batches of phase 2, written with ``GraphWriter.write`` into a fresh graph
   (only the writes are timed; the bench's own CPU time during the writes is the client-side share);
4. Kafka: every message produced to a fresh topic (timed: produce MB/s), then read back by a plain consumer
   (``getmany``, ``max_records=500``), spans counted from the known per-message counts, nothing decoded;
5. end to end: the real daemon as a user runs it (``python -m streamer.cli run``, both stages, its default
   ``--workers`` when it has the option) in a subprocess, on that topic, with a unique group, graph and internal
   topics, ``trace_gap_s = idle_s = window_s = proof.settle_s = 1``, no lateness. Timed from the moment its ingest
   consumer got a spans partition (stamped in the daemon's log) until the group has committed the end of every
   partition AND the graph holds every Trace that phase 2 produced. That includes closing the last traces and windows
   (gap + idle); nothing is subtracted. The time until /metrics showed every message consumed is reported too, with
   the daemon's own counters, the CPU each process used (the daemon: all its processes; engines only when the bench
   started them) and the daemon's peak RSS (``VmHWM`` of each of its processes, summed: an upper bound, as the
   workers share the pages of the supervisor they were forked from) with its PSS summed at the sample it peaked;
5b. the peer (``bench.peer``, unless ``--no-peer``): a stock OpenTelemetry Collector on the same topic, kafka ->
   groupbytrace -> span_metrics -> nop (A) and kafka -> span_metrics -> nop (B), each from a fresh group at the
   earliest offset; their CPU µs per span beside the daemon's (alone, and with FalkorDB) and the ratios;
5c. collector-shaped messages (``--message-shape both``, the default): the same spans cut as the Collector's kafka
   exporter writes them, one trace per message keyed by its id (``bench.otlp_gen``), produced to a topic of their
   own and run end to end (and the peer on them), reported as rows of their own;
5d. the shipped windows (``bench.shipped``): the daemon with the shipped ``[windows]`` and ``[proof]``, its CPU idle
   before any traffic and after these messages (windows open), and its peak RSS on them (``--no-shipped``: skipped);
6. detection latency (``bench.latency``): the sample shop's three defects, tuned and with the shipped defaults.

Ratios: every phase over the floor; end to end over the slowest ceiling (1-4). Targets (issue 14) are judged on
those ratios in this one run and printed met / not met. Correctness: the graphs of phases 3 and 5 hold exactly
the Trace count of phase 2, phase 3's holds exactly the Span nodes of phase 2's rows (a detailed trace's row carries
its kept spans: reported as Span nodes per span beside the rows), and the shop's incidents are the planted defects;
if not, the run exits 1.

Engines: the running ones named by ``TRACE_REPRO_KAFKA_BOOTSTRAP`` and ``TRACE_REPRO_FALKORDB_URL`` when both
are set (the bench's topics and graphs are deleted afterwards unless ``--keep``), otherwise a private Kafka and
FalkorDB in a temporary run directory, stopped at the end. Results go to ``out/bench.json``. Each phase's title is
flushed as it starts, and a phase still running after ``STALL_S`` prints every thread's stack to standard error
(``faulthandler``) and goes on: a stalled run shows where it waits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import faulthandler
import gc
import json
import os
import platform
import pstats
import re
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from google.protobuf.internal import api_implementation
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from bench import peer, shipped
from bench.metrics import fetch_metrics
from bench.otlp_gen import SHAPES, Generated, generate_run
from bench.procfs import DaemonTree, cpu_deltas, proc_cpu_s, terminate
from bench.readings import assigned_at, delete_graph, end_offsets, free_port, group_committed, node_count, rate
from processors.model.finding import FindingEvent
from processors.model.graph import GraphBatch
from sinks.graph import GraphWriter
from streamer import config
from streamer.components import default
from streamer.config import Settings
from streamer.decode import decode_traces_proto
from streamer.engines import Layout, LocalEngines
from streamer.engines.process import EngineError
from streamer.runtime import collector
from streamer.runtime.context import stage_processors
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import Record, StageOutput
from streamer.runtime.topics import create_topics

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "out"
MB = 1024 * 1024
FLOOR = "walk"  # parse + walk of every span's core fields: what every phase is measured against
CEILINGS = ("decode", "stage", "falkordb_write", "kafka_consume")
STALL_S = 600  # a phase still running after this long prints every thread's stack (faulthandler), and goes on
METRICS_EVERY_S = 1.0  # the end-to-end phase scrapes the daemon's /metrics this often (a scrape costs it ~15 ms)
ENTITIES_WAIT_S = 60.0  # the end-to-end phase waits this long at most for stage 2, once stage 1 is done
TARGETS = {
    "end_to_end_over_floor": 0.15,  # end to end >= 0.15 x the parse+walk floor
    "end_to_end_over_slowest": 0.6,  # end to end >= 0.6 x the slowest ceiling
    "latency_margin_s": 0.5,  # detection latency p99 (tuned) <= trace gap + window + settle + 0.5 s
    "daemon_peak_rss_mb": 300.0,  # on the 300k-span run
    "graph_rows_per_span": 0.25,  # the stage-only phase's GraphBatch rows / spans
}


# ---- engines and settings ------------------------------------------------------------------------------------


@dataclass
class Engines:
    kafka: str
    falkordb: str
    pids: dict[str, int] = field(default_factory=dict)  # known only for the private engines
    private: bool = True


@contextlib.contextmanager
def engines() -> Iterator[Engines]:
    kafka, graph = os.environ.get("TRACE_REPRO_KAFKA_BOOTSTRAP"), os.environ.get("TRACE_REPRO_FALKORDB_URL")
    if kafka and graph:
        yield Engines(kafka, graph, private=False)
        return
    default = Layout.default()
    run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-bench-"))
    local = LocalEngines(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir))
    try:
        begin = time.monotonic()
        states = local.up(["kafka", "falkordb"])
        print(f"   private Kafka + FalkorDB up in {time.monotonic() - begin:.1f}s ({run_dir})", flush=True)
        yield Engines(local.address("kafka"), local.address("falkordb"), {n: s.pid for n, s in states.items()})
    finally:
        local.down()


def settings_env(
    kafka: str, graph_url: str, tag: str, spans_topic: str, http_port: int = 0, overrides: Sequence[str] = ()
) -> dict[str, str]:
    """``TRACE_REPRO_*`` for a daemon with its own group, graph and topics (like ``tests/harness.py``).

    ``overrides`` are ``SECTION__KEY=VALUE`` settings (``--set``) applied to the stage and the daemon alike.
    """
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": kafka,
        "TRACE_REPRO_FALKORDB_URL": graph_url,
        "TRACE_REPRO_ENVIRONMENT": f"bench_{tag}",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"bench-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__SPANS_TOPIC": spans_topic,
        "TRACE_REPRO_KAFKA__LOGS_TOPIC": f"bench-logs-{tag}",
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^benchcdc{tag}\.[^.]+\.[^.]+$",
        "TRACE_REPRO_KAFKA__ACCESSES_TOPIC": f"bench-accesses-{tag}",
        "TRACE_REPRO_KAFKA__ACCESSES_PARTITIONS": "2",
        "TRACE_REPRO_KAFKA__DLQ_TOPIC": f"bench-dlq-{tag}",
        "TRACE_REPRO_KAFKA__INCIDENTS_TOPIC": f"bench-incidents-{tag}",
        "TRACE_REPRO_KAFKA__REPROS_TOPIC": f"bench-repros-{tag}",
        "TRACE_REPRO_KAFKA__VERDICTS_TOPIC": f"bench-verdicts-{tag}",
        "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "1",
        "TRACE_REPRO_WINDOWS__IDLE_S": "1",
        "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0",
        "TRACE_REPRO_WINDOWS__WINDOW_S": "1",
        "TRACE_REPRO_PROOF__SETTLE_S": "1",  # the judge's open slices pin their input for settle_s (30 s shipped)
        "TRACE_REPRO_HTTP__PORT": str(http_port),
    }
    for item in overrides:
        key, _, value = item.partition("=")
        env[f"TRACE_REPRO_{key.upper()}"] = value
    return env


def _span_counts(gen: Generated) -> dict[tuple[int, int], int]:
    """Spans per (partition, offset) of a fresh topic."""
    offsets: dict[int, int] = {}
    out = {}
    for n, partition in zip(gen.span_counts, gen.partitions, strict=True):
        offset = offsets[partition] = offsets.get(partition, -1) + 1
        out[partition, offset] = n
    return out


# ---- in-process ceilings -------------------------------------------------------------------------------------


def bench_parse(gen: Generated) -> dict[str, Any]:
    """The raw protobuf parse: ``TracesData.FromString`` of every message (upb), nothing read."""
    parse = TracesData.FromString
    begin = time.perf_counter()
    for m in gen.messages:
        parse(m)
    seconds = time.perf_counter() - begin
    return {"spans": gen.spans, "seconds": seconds, "spans_per_s": rate(gen.spans, seconds),
            "protobuf": api_implementation.Type()}  # fmt: skip


def bench_walk(gen: Generated) -> dict[str, Any]:
    """THE FLOOR: parse every message and read every span's core fields (trace id, span id, parent id, start and
    end time, name, kind, status code), the least any decoder must do."""
    parse = TracesData.FromString
    begin = time.perf_counter()
    n = 0
    for m in gen.messages:
        for rs in parse(m).resource_spans:
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    core = (sp.trace_id, sp.span_id, sp.parent_span_id, sp.start_time_unix_nano,
                            sp.end_time_unix_nano, sp.name, sp.kind, sp.status.code)  # fmt: skip
                    n += 1
    seconds = time.perf_counter() - begin
    assert n == gen.spans and len(core) == 8, (n, gen.spans)
    return {"spans": n, "seconds": seconds, "spans_per_s": rate(n, seconds)}


def bench_decode(gen: Generated) -> dict[str, Any]:
    decode = decode_traces_proto
    begin = time.perf_counter()
    n = 0
    for m in gen.messages:
        n += len(decode(m))
    seconds = time.perf_counter() - begin
    assert n == gen.spans, (n, gen.spans)
    return {"spans": n, "seconds": seconds, "spans_per_s": rate(n, seconds)}


class _Clock:
    """The stage's wall clock, frozen while it works (nothing is idle) and moved on to close everything."""

    def __init__(self) -> None:
        self.now = time.time_ns()

    def __call__(self) -> int:
        return self.now


def _records(gen: Generated, topic: str) -> list[Record]:
    """The messages as the stage would poll them: each on its partition, at that partition's next offset."""
    ts = gen.start_ns // 1_000_000
    offsets: dict[int, int] = {}
    out = []
    keys: list[bytes | None] = [*gen.keys] or [None] * len(gen.messages)  # collector shape: trace id keys
    for m, key, partition in zip(gen.messages, keys, gen.partitions, strict=True):
        offset = offsets[partition] = offsets.get(partition, -1) + 1
        out.append(Record(topic, partition, offset, key, m, ts))
    return out


def _polls(records: list[Record], settings: Settings) -> Iterator[list[Record]]:
    """``records`` in the batches a consumer's polls would give: at most ``kafka.max_poll_records`` messages and,
    per partition, ``kafka.max_partition_fetch_bytes`` (a larger message alone); each batch partition by partition,
    as ``getmany`` returns them and the runner hands them to the stage."""
    k = settings.kafka
    batch: list[Record] = []
    size: dict[int, int] = {}
    for r in records:
        n = len(r.value or b"")
        if batch and (len(batch) >= k.max_poll_records or size.get(r.partition, 0) + n > k.max_partition_fetch_bytes):
            yield sorted(batch, key=lambda r: r.partition)  # stable: each partition's in offset order
            batch, size = [], {}
        batch.append(r)
        size[r.partition] = size.get(r.partition, 0) + n
    if batch:
        yield sorted(batch, key=lambda r: r.partition)


def close_all(stage: IngestStage) -> Iterator[StageOutput]:
    """Empty batches, as the daemon's polls give when input stops, until the stage holds no open trace or window
    (a burst's close is spread over batches: ``TraceAssembler.closing``); at most one a trace."""
    for _ in range(len(stage.traces) + 2):
        yield stage.process([])
        if len(stage.traces) == 0 and len(stage.calls) == 0:
            return


def run_stage(gen: Generated, settings: Settings, *, keep: bool) -> tuple[list[GraphBatch], dict[str, Any]]:
    """Every message through a fresh ``IngestStage``; returns the graph batches (if ``keep``) and the figures."""
    clock = _Clock()
    metrics, tracker = Metrics(), PinTracker()
    processors = stage_processors(settings, metrics, clock, "ingest", tracker, default().factories)
    stage = IngestStage(settings, metrics, clock, tracker=tracker, processors=processors)
    stage.broadcast_partitions = settings.kafka.accesses_partitions  # as the daemon's runner sets it (packs accesses)
    records = _records(gen, settings.kafka.spans_topic)
    batches: list[GraphBatch] = []
    produced = 0
    findings: Counter[str] = Counter()
    begin = time.perf_counter()
    for polled in _polls(records, settings):
        out = stage.process(polled)
        produced += len(out.produce)
        findings.update(e.finding_type() for e in out.events if isinstance(e, FindingEvent))
        if keep:
            batches.append(out.graph)
    clock.now += 3600 * 1_000_000_000  # every partition idle: event time follows the clock, all state closes
    for out in close_all(stage):
        produced += len(out.produce)
        findings.update(e.finding_type() for e in out.events if isinstance(e, FindingEvent))
        if keep:
            batches.append(out.graph)
    seconds = time.perf_counter() - begin
    assert len(stage.traces) == 0 and len(stage.calls) == 0, "stage kept open state"
    figures = {
        "spans": gen.spans,
        "seconds": seconds,
        "spans_per_s": rate(gen.spans, seconds),
        "batch_messages": settings.kafka.max_poll_records,
        "batch_partition_bytes": settings.kafka.max_partition_fetch_bytes,
        "internal_produced": produced,  # to stage 2: accesses, row changes, watermarks, relays
        "sql": dict(stage.extractor.counters),
        "findings": dict(findings),  # FindingEvents of stage 1's detectors (the bench's traffic is benign: none)
    }
    return batches, figures


def bench_stage(gen: Generated, settings: Settings) -> tuple[list[GraphBatch], dict[str, Any]]:
    batches, figures = run_stage(gen, settings, keep=True)
    rows = {name: sum(len(getattr(b, name)) for b in batches) for name in GraphBatch.__slots__}
    figures["graph_rows"] = {k: v for k, v in rows.items() if v}
    detailed = {r["id"] for b in batches for r in b.traces}
    figures["detailed_traces"] = len(detailed)
    # A detailed trace's row carries its kept spans (policy ``paths``): each is a Span node with OF and CHILD_OF
    # edges on the server, so "rows" alone understates what a write does; reported beside them. The Span nodes the
    # graph will hold: distinct ids, and a late fragment's only when its trace is detailed (it is written onto it).
    ids = {p[0] for b in batches for r in b.traces for p in r.get("spans") or ()}
    ids.update(p[0] for b in batches for r in b.late_traces if r["id"] in detailed for p in r.get("spans") or ())
    ids.update(r["id"] for b in batches for r in b.spans)
    figures["span_nodes"] = len(ids)
    return batches, figures


def profile_stage(gen: Generated, settings: Settings, top: int) -> None:
    OUT.mkdir(exist_ok=True)
    prof = cProfile.Profile()
    prof.enable()
    _, figures = run_stage(gen, settings, keep=False)
    prof.disable()
    path = OUT / "stage.prof"
    prof.dump_stats(path)
    print(f"stage-only under cProfile: {figures['spans_per_s']:,.0f} spans/s (profiler overhead included); {path}")
    stats = pstats.Stats(prof)
    stats.strip_dirs()
    for order in ("cumulative", "tottime"):
        print(f"\n---- top {top} by {order} ----")
        stats.sort_stats(order).print_stats(top)


# ---- FalkorDB ------------------------------------------------------------------------------------------------


async def bench_write(
    eng: Engines,
    graph: str,
    batches: list[GraphBatch],
    spans: int,
    settings: Settings,
    expected: int,
    expected_span_nodes: int | None = None,
) -> dict[str, Any]:
    writer = GraphWriter(
        eng.falkordb, graph, batch_rows=settings.falkordb.batch_rows, timeout_ms=settings.falkordb.query_timeout_ms
    )
    await writer.bootstrap()
    rows = 0
    cpu_before = {"falkordb": proc_cpu_s(eng.pids.get("falkordb"))}
    client_cpu = time.process_time()
    begin = time.perf_counter()
    for batch in batches:
        rows += await writer.write(batch)
    seconds = time.perf_counter() - begin
    client_cpu = time.process_time() - client_cpu
    cpu = cpu_deltas(cpu_before, {"falkordb": proc_cpu_s(eng.pids.get("falkordb"))}, seconds)
    await writer.close()
    traces = node_count(eng.falkordb, graph, "Trace")
    return {
        "spans": spans,
        "traces": traces,
        "expected_traces": expected,
        "span_nodes": node_count(eng.falkordb, graph, "Span"),
        "expected_span_nodes": expected_span_nodes,
        "rows": rows,
        "statements": len(batches),
        "seconds": seconds,
        "spans_per_s": rate(spans, seconds),
        "rows_per_s": rate(rows, seconds),
        "client_cpu_share": client_cpu / seconds if seconds else 0.0,
        "cpu_cores": cpu,
    }


# ---- Kafka ---------------------------------------------------------------------------------------------------


async def delete_topics(bootstrap: str, prefix_tag: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        mine = [t for t in await admin.list_topics() if t.startswith("bench-") and prefix_tag in t]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


async def bench_produce(eng: Engines, topic: str, gen: Generated) -> dict[str, Any]:
    await create_topics(eng.kafka, {topic: max(gen.partitions) + 1})
    producer = AIOKafkaProducer(
        bootstrap_servers=eng.kafka, max_request_size=16 * MB, linger_ms=5, max_batch_size=1 * MB
    )
    await producer.start()
    try:
        before = {"kafka": proc_cpu_s(eng.pids.get("kafka"))}
        begin = time.perf_counter()
        keys: list[bytes | None] = [*gen.keys] or [None] * len(gen.messages)  # collector shape: trace id keys
        futures = [
            await producer.send(topic, m, key=k, partition=p)
            for m, k, p in zip(gen.messages, keys, gen.partitions, strict=True)
        ]
        sent = await asyncio.gather(*futures)
        seconds = time.perf_counter() - begin
        cpu = cpu_deltas(before, {"kafka": proc_cpu_s(eng.pids.get("kafka"))}, seconds)
    finally:
        await producer.stop()
    ends = {md.partition: md.offset + 1 for md in sent}
    assert ends == end_offsets(gen), (ends, end_offsets(gen))
    return {
        "messages": len(gen.messages),
        "bytes": gen.bytes,
        "seconds": seconds,
        "mb_per_s": rate(gen.bytes / MB, seconds),
        "messages_per_s": rate(len(gen.messages), seconds),
        "spans_per_s": rate(gen.spans, seconds),
        "cpu_cores": cpu,
    }


async def bench_consume(eng: Engines, topic: str, gen: Generated, settings: Settings) -> dict[str, Any]:
    k = settings.kafka
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=eng.kafka,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=min(k.fetch_max_bytes, 16 * MB),
        fetch_max_bytes=k.fetch_max_bytes,
    )
    await consumer.start()
    counts = _span_counts(gen)
    messages = spans = size = 0
    try:
        begin = time.perf_counter()
        deadline = time.monotonic() + 120
        while messages < len(counts):
            assert time.monotonic() < deadline, f"consumed {messages} of {len(counts)} messages"
            batch = await consumer.getmany(timeout_ms=500, max_records=500)
            for records in batch.values():
                for r in records:
                    messages += 1
                    spans += counts[r.partition, r.offset]
                    size += len(r.value)
        seconds = time.perf_counter() - begin
    finally:
        await consumer.stop()
    return {
        "messages": messages,
        "spans": spans,
        "seconds": seconds,
        "spans_per_s": rate(spans, seconds),
        "mb_per_s": rate(size / MB, seconds),
    }


# ---- end to end ----------------------------------------------------------------------------------------------


def _daemon_metrics(port: int) -> dict[str, float]:
    """Where the daemon's time went, from its own counters: batches, graph writes, messages produced."""
    text = fetch_metrics(port, timeout_s=10)
    if text is None:
        return {}
    wanted = {
        "ingest_batches": r'trace_repro_batch_seconds_count\{stage="ingest"\}',
        "ingest_batch_s": r'trace_repro_batch_seconds_sum\{stage="ingest"\}',
        "entities_batch_s": r'trace_repro_batch_seconds_sum\{stage="entities"\}',
        "graph_writes": r"trace_repro_graph_write_seconds_count",
        "graph_write_s": r"trace_repro_graph_write_seconds_sum",
        "graph_rows": r"trace_repro_graph_rows_written_total",
    }
    out: dict[str, float] = {}
    for name, pattern in wanted.items():
        m = re.search(rf"^{pattern} (\S+)$", text, re.M)
        if m:
            out[name] = float(m.group(1))
    out["published"] = sum(
        float(v) for v in re.findall(r"^trace_repro_published_messages_total\{[^}]*\} (\S+)$", text, re.M)
    )
    return out


def _scrape(port: int, spans_topic: str) -> tuple[int, bool]:
    """(messages consumed from the spans topic, reachable) from the daemon's /metrics."""
    text = fetch_metrics(port, timeout_s=2)
    if text is None:
        return 0, False
    m = re.search(rf'^trace_repro_consumed_messages_total\{{topic="{re.escape(spans_topic)}"\}} (\S+)$', text, re.M)
    return (int(float(m.group(1))) if m else 0), True


def _internal(port: int, topic: str) -> tuple[int, int]:
    """(messages stage 1 produced to the internal topic, messages stage 2 consumed from it) from the daemon's
    /metrics; (-1, -1) when it cannot be read or holds neither (then the run does not wait for stage 2)."""
    text = fetch_metrics(port, timeout_s=2)
    counts = [
        re.search(rf'^trace_repro_{what}_messages_total\{{topic="{re.escape(topic)}"\}} (\S+)$', text or "", re.M)
        for what in ("published", "consumed")
    ]
    if text is None or counts[0] is None:
        return -1, -1
    return int(float(counts[0].group(1))), int(float(counts[1].group(1))) if counts[1] else 0


def _cli_workers() -> bool:
    """Whether ``trace-repro run`` takes ``--workers`` (then its default, one worker per core, applies)."""
    out = subprocess.run([sys.executable, "-m", "streamer.cli", "run", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=False)  # fmt: skip
    return "--workers" in out.stdout


async def bench_end_to_end(
    eng: Engines,
    env: dict[str, str],
    settings: Settings,
    gen: Generated,
    expected_traces: int,
    log: Path,
    profile: Path | None = None,
) -> dict[str, Any]:
    """The daemon on the pre-filled spans topic, started as a user would (``trace-repro run``, default workers);
    times are Unix seconds (the daemon's log stamps assignment).

    Done when the group has committed the end of every partition, the graph holds ``expected_traces`` and stage 2
    has read every message stage 1 had sent it by then (``_internal``: its work on those spans is inside the run).
    With ``profile``, the daemon runs under cProfile and dumps its profile there when it stops.
    """
    spans_topic, group, graph = settings.kafka.spans_topic, settings.kafka.group_id, settings.graph_name
    internal_topic = settings.kafka.accesses_topic
    port = int(env["TRACE_REPRO_HTTP__PORT"])
    end_offset = len(gen.messages)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_REPRO_")} | env
    workers = _cli_workers()
    admin = AIOKafkaAdminClient(bootstrap_servers=eng.kafka)
    await admin.start()
    t: dict[str, float] = {}
    cpu_at_start: dict[str, float | None] = {}
    with log.open("wb") as log_file:
        launch = time.time()
        profiler = ["-m", "cProfile", "-o", str(profile)] if profile else []
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *profiler,
            "-m",
            "streamer.cli",
            "run",
            env=child_env,
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        tree = DaemonTree(proc.pid)
        try:
            deadline = launch + 90 + gen.spans / 2_000
            consumed = committed = traces = 0
            scraped = 0.0
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"daemon exited with {proc.returncode}; see {log}")
                if time.time() > deadline:
                    raise TimeoutError(
                        f"daemon: consumed {consumed}/{end_offset} messages, committed {committed}, "
                        f"{traces}/{expected_traces} traces; see {log}"
                    )
                tree.sample()
                if "assigned" not in t:
                    assigned = assigned_at(log, spans_topic)
                    if assigned is not None:
                        t["assigned"] = assigned
                        cpu_at_start = {n: proc_cpu_s(p) for n, p in eng.pids.items()} | {"daemon": tree.cpu()}
                        t["cpu_from"] = time.time()
                    await asyncio.sleep(0.05)
                    continue
                # /metrics may be one worker's view: it times "all consumed", never the end of the run. Scraped once
                # a second, not at every check: a scrape costs the daemon ~15 ms of its core (5 a second took ~8 %)
                if "consumed" not in t and time.time() - scraped >= METRICS_EVERY_S:
                    scraped = time.time()
                    consumed, _ = _scrape(port, spans_topic)
                    if consumed >= end_offset:
                        t["consumed"] = scraped
                if "committed" not in t:
                    committed = await group_committed(admin, group, spans_topic)
                    if committed >= end_offset:
                        t["committed"] = time.time()
                if "graph" not in t and "committed" in t:
                    traces = node_count(eng.falkordb, graph, "Trace")
                    if traces >= expected_traces:
                        t["graph"] = time.time()
                if "committed" in t and "graph" in t:
                    # stage 1 is done; stage 2 too once it has read what stage 1 sent it by then (its CPU inside),
                    # waited for at most ENTITIES_WAIT_S (then ``entities_caught_up`` is false)
                    produced, read = _internal(port, internal_topic)
                    t.setdefault("internal", produced)
                    waited = time.time() - max(t["committed"], t["graph"])
                    if read >= t["internal"] or produced < 0 or waited > ENTITIES_WAIT_S:
                        t["entities"], caught_up = time.time(), read >= t["internal"] >= 0
                        break
                    await asyncio.sleep(0.25)  # (the scrapes of this wait cost the daemon ~15 ms each)
                    continue
                await asyncio.sleep(0.2)
            done = max(t["committed"], t["graph"], t["entities"])
            tree.sample()
            after = {n: proc_cpu_s(p) for n, p in eng.pids.items()} | {"daemon": tree.cpu()}
            cpu = cpu_deltas(cpu_at_start, after, done - t["cpu_from"])
            cpu_s = {n: (after.get(n) or 0.0) - b for n, b in cpu_at_start.items() if b is not None and after.get(n)}
            inside = _daemon_metrics(port)
        finally:
            await terminate(proc, 30)
            await admin.close()
    traces = node_count(eng.falkordb, graph, "Trace")
    start = t["assigned"]
    seconds = done - start
    consumed_s = t.get("consumed", t["committed"]) - start
    return {
        "spans": gen.spans,
        "seconds": seconds,
        "spans_per_s": rate(gen.spans, seconds),
        "cli_workers": "default" if workers else "not supported (one process)",
        "daemon_processes": tree.processes,
        "partitions": len(end_offsets(gen)),
        "startup_s": start - launch,
        "consumed_s": consumed_s,
        "consumed_spans_per_s": rate(gen.spans, consumed_s),
        "committed_s": t["committed"] - start,
        "graph_s": t["graph"] - start,
        "entities_s": t["entities"] - start,  # stage 2 has read what stage 1 sent it (``_internal``)
        "entities_caught_up": caught_up,
        "traces": traces,
        "expected_traces": expected_traces,
        "daemon_peak_rss_mb": sum(tree.peak_mb.values()),  # each process's VmHWM, summed: an upper bound
        "daemon_peak_rss_mb_per_process": sorted(tree.peak_mb.values(), reverse=True),
        "daemon_peak_sampled_rss_mb": tree.peak_sum_rss_mb,
        "daemon_peak_sampled_pss_mb": tree.peak_sum_pss_mb,
        "daemon_peak_pss_mb_per_process": sorted(tree.peak_pss_mb.values(), reverse=True),
        "daemon_metrics": inside,
        "cpu_cores": cpu,
        "cpu_s": cpu_s,  # CPU seconds per process over the same interval, unrounded
        "log": str(log),
    }


# ---- ratios, targets, checks and the report ------------------------------------------------------------------


def ratios(phases: dict[str, Any]) -> dict[str, Any]:
    """Every phase over the parse+walk floor, the slowest ceiling, and end to end over it (one run's figures)."""
    floor = phases[FLOOR]["spans_per_s"]
    over_floor = {name: rate(p["spans_per_s"], floor) for name, p in phases.items() if "spans_per_s" in p}
    ceilings = {name: phases[name]["spans_per_s"] for name in CEILINGS if name in phases}
    slowest = min(ceilings, key=lambda n: ceilings[n])
    e2e = phases.get("end_to_end")
    return {
        "floor": FLOOR,
        "floor_spans_per_s": floor,
        "over_floor": over_floor,
        "slowest": slowest,
        "slowest_spans_per_s": ceilings[slowest],
        "end_to_end_over_slowest": rate(e2e["spans_per_s"], ceilings[slowest]) if e2e else None,
    }


def graph_rows_per_span(stage: dict[str, Any]) -> float:
    return rate(sum(stage["graph_rows"].values()), stage["spans"])


def span_nodes_per_span(stage: dict[str, Any]) -> float | None:
    """The stage-only phase's Span nodes (the kept spans its rows carry) over its spans; None if not measured."""
    return None if stage.get("span_nodes") is None else rate(stage["span_nodes"], stage["spans"])


def _rows_note(stage: dict[str, Any]) -> str:
    note, nodes = "stage-only GraphBatch rows / spans", span_nodes_per_span(stage)
    return note if nodes is None else f"{note}; a trace's row carries its kept spans: {nodes:.2f} Span nodes/span"


def _target(name: str, value: float | None, limit: float, at_most: bool, note: str = "") -> dict[str, Any]:
    met = None if value is None else (value <= limit if at_most else value >= limit)
    return {"name": name, "value": value, "limit": limit, "at_most": at_most, "met": met, "note": note}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each met, not met or not measured (``met`` None) in this run."""
    r, p = results["ratio"], results["phases"]
    lat = (results.get("detection_latency") or {}).get("tuned")
    latency_limit = lat["floor_s"] + TARGETS["latency_margin_s"] if lat else TARGETS["latency_margin_s"]
    spans = results["config"]["spans"]
    return [
        _target("end to end / parse+walk floor", r["over_floor"].get("end_to_end"),
                TARGETS["end_to_end_over_floor"], at_most=False),
        _target("end to end / slowest ceiling", r["end_to_end_over_slowest"],
                TARGETS["end_to_end_over_slowest"], at_most=False, note=r["slowest"]),
        _target("detection latency p99 (s)", lat["latency_p99_s"] if lat else None, latency_limit, at_most=True,
                note=f"trace gap + window + settle = {lat['floor_s']:g} s, + 0.5 s" if lat else ""),
        _target("daemon peak RSS (MB)", results["rss"].get("daemon_peak_mb"), TARGETS["daemon_peak_rss_mb"],
                at_most=True, note="" if spans >= 300_000 else f"{spans:,}-span run; the target is for 300k"),
        _target("graph rows per span", graph_rows_per_span(p["stage"]), TARGETS["graph_rows_per_span"],
                at_most=True, note=_rows_note(p["stage"])),
        *peer.targets(p),
    ] + (shipped.targets(p["shipped"]) if "shipped" in p else [])  # fmt: skip


def checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Correctness: the same traces in every graph, the planted incidents on the shop. Any failure fails the run."""
    p, out = results["phases"], []
    for name in ("falkordb_write", "end_to_end", "end_to_end_collector"):
        if name in p:
            got, want = p[name]["traces"], p[name]["expected_traces"]
            out.append({"check": f"{name}: Trace nodes in the graph = the stage-only phase's traces",
                        "ok": got == want, "detail": f"{got:,} vs {want:,}"})  # fmt: skip
    if "stage" in p:
        found = p["stage"].get("findings") or {}
        detail = ", ".join(f"{t}: {n}" for t, n in sorted(found.items())) or "none"
        out.append({"check": "stage: no detector finding on the benign traffic", "ok": not found, "detail": detail})
    w = p.get("falkordb_write") or {}
    if w.get("expected_span_nodes") is not None:
        got, want = w["span_nodes"], w["expected_span_nodes"]
        out.append({"check": "falkordb_write: Span nodes in the graph = the kept spans of the stage-only phase's rows",
                    "ok": got == want, "detail": f"{got:,} vs {want:,}"})  # fmt: skip
    for name, lat in (results.get("detection_latency") or {}).items():
        planted = lat["as_planted"]
        detail = "; ".join(f"{t}: {v['found']}/{v['planted']} found, {v['latent']} latent"
                           + (f", missed {v['missed']}" if v["missed"] else "")
                           + (f", unexpected {v['unexpected']}" if v["unexpected"] else "")
                           for t, v in planted["tables"].items())  # fmt: skip
        out.append({"check": f"latency ({name}): the incidents are the planted defects", "ok": planted["ok"],
                    "detail": detail})  # fmt: skip
        low = lat.get("latency_min_s")
        out.append({"check": f"latency ({name}): every latency >= 0 (an incident after its last input)",
                    "ok": low is None or low >= 0, "detail": f"min {low} s"})  # fmt: skip
    return out


def _fmt(n: float) -> str:
    return f"{n:,.0f}"


def report(results: dict[str, Any]) -> str:
    p = results["phases"]
    c = results["config"]
    r = results["ratio"]
    of = r["over_floor"]
    shape = c.get("message_shape") == "collector"
    per = (
        f"of one trace (batches of {c['spans_per_message']} spans split)"
        if shape
        else f"of {c['spans_per_message']} spans"
    )
    lines = [
        "",
        f"trace-repro bench: {c['spans']:,} spans, {c['traces']:,} traces ({c['db_spans'] / c['spans']:.1%} DB spans, "
        f"{c['error_traces'] / c['traces']:.1%} error traces), {c['messages']:,} messages {per} "
        f"({c['bytes'] / MB:.1f} MB) on {c['partitions']} partition(s), {c['cpus']} CPUs",
        "",
        f"{'phase':<30}{'spans/s':>12}{'/ floor':>9}{'seconds':>9}   notes",
        "-" * 110,
    ]

    def row(name: str, key: str, spans_per_s: float, seconds: float, note: str = "") -> None:
        ratio = f"{of[key]:.3f}" if key in of else ""
        lines.append(f"{name:<30}{_fmt(spans_per_s):>12}{ratio:>9}{seconds:>9.2f}   {note}")

    g = p["generate"]
    row("generate (not a ceiling)", "generate", g["spans_per_s"], g["seconds"], "OTLP protobuf, encoded once")
    x = p["parse"]
    row("protobuf parse", "parse", x["spans_per_s"], x["seconds"], f"TracesData.FromString ({x['protobuf']})")
    x = p["walk"]
    row("parse + walk = THE FLOOR", "walk", x["spans_per_s"], x["seconds"],
        "ids, parent, start/end, name, kind, status of every span")  # fmt: skip
    d = p["decode"]
    row("decode-only ceiling", "decode", d["spans_per_s"], d["seconds"], "decode_traces_proto")
    s = p["stage"]
    note = (
        f"IngestStage.process; {s['detailed_traces']:,} detailed traces, {s['internal_produced']:,} internal messages, "
        f"{graph_rows_per_span(s):.2f} graph rows/span ({span_nodes_per_span(s) or 0:.2f} Span nodes/span)"
    )
    row("stage-only ceiling", "stage", s["spans_per_s"], s["seconds"], note)
    if "falkordb_write" in p:
        w = p["falkordb_write"]
        cores = w["cpu_cores"].get("falkordb")
        server = f", server {cores:.2f} core" if cores is not None else ""
        note = f"{_fmt(w['rows_per_s'])} rows/s ({w['rows']:,} rows); client {w['client_cpu_share']:.2f} core{server}"
        row("FalkorDB-write ceiling", "falkordb_write", w["spans_per_s"], w["seconds"], note)
    if "kafka_produce" in p:
        k = p["kafka_produce"]
        note = f"{k['mb_per_s']:.1f} MB/s, {_fmt(k['messages_per_s'])} msg/s (setup, not a ceiling)"
        row("Kafka produce", "kafka_produce", k["spans_per_s"], k["seconds"], note)
        k = p["kafka_consume"]
        row("Kafka-consume ceiling", "kafka_consume", k["spans_per_s"], k["seconds"],
            f"{k['mb_per_s']:.1f} MB/s, getmany(500)")  # fmt: skip
    if "end_to_end" in p:
        e = p["end_to_end"]
        cores = ", ".join(f"{n} {v:.2f}" for n, v in e["cpu_cores"].items())
        row("end to end", "end_to_end", e["spans_per_s"], e["seconds"],
            f"assigned -> committed + {e['traces']:,} traces in the graph + stage 2 "
            f"{'caught up' if e.get('entities_caught_up', True) else 'NOT caught up'}; workers: {e['cli_workers']} "
            f"({e['daemon_processes']} process(es))")  # fmt: skip
        lines.append(
            f"{'  until all consumed':<30}{_fmt(e['consumed_spans_per_s']):>12}{'':>9}{e['consumed_s']:>9.2f}"
            f"   (/metrics, scraped every {METRICS_EVERY_S:.0f}s); daemon startup {e['startup_s']:.1f}s before; "
            f"cores: {cores}"
        )
        m = e.get("daemon_metrics") or {}
        if "ingest_batch_s" in m:
            busy, write = m["ingest_batch_s"], m.get("graph_write_s", 0.0)
            lines.append(
                f"{'':<30}daemon /metrics: {m.get('ingest_batches', 0):.0f} ingest batches, "
                f"busy {busy:.1f}s of {e['seconds']:.1f}s "
                f"(graph writes {write:.1f}s, process+produce+commit {busy - write:.1f}s); "
                f"entities stage {m.get('entities_batch_s', 0.0):.1f}s; {m.get('published', 0):,.0f} messages produced"
            )
    if "end_to_end_collector" in p:
        k, e = p["kafka_produce_collector"], p["end_to_end_collector"]
        row("Kafka produce, collector shape", "kafka_produce_collector", k["spans_per_s"], k["seconds"],
            f"{k['messages']:,} messages (one trace each, keyed by trace id), {k['mb_per_s']:.1f} MB/s")  # fmt: skip
        row("end to end, collector shape", "end_to_end_collector", e["spans_per_s"], e["seconds"],
            f"{e['traces']:,} traces in the graph; consumed in {e['consumed_s']:.2f}s; daemon peak RSS "
            f"{e['daemon_peak_rss_mb']:.0f} MB; cores: "
            + ", ".join(f"{n} {v:.2f}" for n, v in e["cpu_cores"].items()))  # fmt: skip
    lines.append("-" * 110)
    lines.append(f"slowest ceiling: {r['slowest']} ({_fmt(r['slowest_spans_per_s'])} spans/s)"
                 + (f"; end to end / slowest ceiling = {r['end_to_end_over_slowest']:.3f}"
                    if r["end_to_end_over_slowest"] is not None else ""))  # fmt: skip
    line = f"peak RSS: bench process {results['rss']['bench_peak_mb']:.0f} MB"
    if results["rss"].get("daemon_peak_mb"):
        e = p["end_to_end"]
        line += (f", daemon {results['rss']['daemon_peak_mb']:.0f} MB (VmHWM summed over "
                 f"{len(e['daemon_peak_rss_mb_per_process'])} process(es))")  # fmt: skip
        if e.get("daemon_peak_sampled_pss_mb"):
            line += (f"; PSS summed at its peak sample {e['daemon_peak_sampled_pss_mb']:.0f} MB "
                     "(the pages its processes share counted once)")  # fmt: skip
    lines.append(line)
    lines += peer.report_lines(p, "collector" if shape else "bench")
    return "\n".join(lines)


def summary(results: dict[str, Any]) -> str:
    """The targets (met / not met / not measured) and the correctness checks."""
    lines = ["", "targets (ratios in this one run, never timed tests):"]
    for t in results["targets"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:,.3f}"
        op = "<=" if t["at_most"] else ">="
        note = f"   ({t['note']})" if t["note"] else ""
        lines.append(f"   {t['name']:<32}{value:>10} {op} {t['limit']:<8g} {verdict}{note}")
    lines.append("correctness:")
    for c in results["checks"]:
        lines.append(f"   {'ok    ' if c['ok'] else 'FAILED'} {c['check']}: {c['detail']}")
    met = sum(1 for t in results["targets"] if t["met"])
    failed = sum(1 for c in results["checks"] if not c["ok"])
    lines.append(f"SUMMARY: {met}/{len(results['targets'])} targets met; "
                 + (f"{failed} correctness check(s) FAILED" if failed else "correctness: all checks ok"))  # fmt: skip
    return "\n".join(lines)


# ---- main ----------------------------------------------------------------------------------------------------


def phase(title: str) -> None:
    """Announce a phase (flushed: a piped log shows where a run is) and re-arm the stall report for it."""
    print(f"== {title}", flush=True)
    faulthandler.dump_traceback_later(STALL_S, exit=False)


async def _with_engines(
    args: argparse.Namespace, gen: Generated, batches: list[GraphBatch], results: dict[str, Any], tag: str
) -> None:
    p = results["phases"]
    with engines() as eng:
        spans_topic = f"bench-spans-{tag}"
        env = settings_env(eng.kafka, eng.falkordb, tag, spans_topic, free_port(), args.set)
        settings = config.load(None, env=env)
        write_graph = f"bench_write_{tag}"
        try:
            phase("FalkorDB-write ceiling")
            p["falkordb_write"] = await bench_write(
                eng, write_graph, batches, gen.spans, settings, p["stage"]["detailed_traces"], p["stage"]["span_nodes"]
            )
            batches.clear()
            delete_graph(eng.falkordb, write_graph)
            phase("Kafka produce, then the Kafka-consume ceiling")
            p["kafka_produce"] = await bench_produce(eng, spans_topic, gen)
            p["kafka_consume"] = await bench_consume(eng, spans_topic, gen, settings)
            if not args.no_daemon:
                phase("end to end: the daemon in a subprocess")
                OUT.mkdir(exist_ok=True)
                profile = OUT / "daemon.prof" if args.profile_daemon else None
                e2e = await bench_end_to_end(
                    eng, env, settings, gen, p["stage"]["detailed_traces"], OUT / "bench-daemon.log", profile
                )
                if profile is not None:
                    print(f"daemon profile (cProfile overhead included in its figures): {profile}")
                    stats = pstats.Stats(str(profile))
                    stats.strip_dirs()
                    stats.sort_stats("tottime").print_stats(args.top)
                p["end_to_end"] = e2e
                results["rss"]["daemon_peak_mb"] = e2e["daemon_peak_rss_mb"]
            await _peer_and_collector_shape(args, eng, gen, results, tag, spans_topic)
            if not args.no_daemon and not args.no_shipped:
                phase("the shipped windows: the daemon idle, and its peak RSS on the same messages (bench.shipped)")
                p["shipped"] = await shipped.measure(eng.kafka, eng.falkordb, gen, idle_s=10 if args.quick else 30,
                                                     tag=tag)  # fmt: skip
                print("   " + shipped.report(p["shipped"]), flush=True)
        finally:
            if not eng.private and not args.keep:
                delete_graph(eng.falkordb, write_graph)
                delete_graph(eng.falkordb, settings.graph_name)
                delete_graph(eng.falkordb, shipped.graph_name(eng.kafka, eng.falkordb, tag))
                await delete_topics(eng.kafka, tag)


async def _peer_and_collector_shape(
    args: argparse.Namespace, eng: Engines, gen: Generated, results: dict[str, Any], tag: str, spans_topic: str
) -> None:
    """The peer Collector (``bench.peer``) on the daemon's topic; then, with ``--message-shape both``, the same spans
    shaped as the Collector writes them (one trace per message): produced to a topic of their own, end to end
    through the daemon, and the peer on them."""
    p, c = results["phases"], results["config"]
    if not args.no_peer and "end_to_end" in p:
        phase(f"the peer: a stock OpenTelemetry Collector on the same topic ({'; '.join(peer.PIPELINES.values())})")
        p["peer"] = await asyncio.to_thread(peer.run_peers, eng.kafka, spans_topic, gen.spans, OUT / "peer")
    if args.message_shape != "both" or args.no_daemon:
        return
    phase("collector-shaped messages (one trace per message): produce, end to end, the peer")
    shaped = generate_run(gen.spans, c["spans_per_message"], c["seed"], start_ns=gen.start_ns,
                          partitions=c["partitions"], shape="collector")  # fmt: skip
    assert (shaped.spans, shaped.traces) == (gen.spans, gen.traces), "the collector shape holds other spans"
    topic, shaped_tag = f"bench-spans-c-{tag}", f"{tag}c"
    env = settings_env(eng.kafka, eng.falkordb, shaped_tag, topic, free_port(), args.set)
    settings = config.load(None, env=env)
    try:
        p["kafka_produce_collector"] = await bench_produce(eng, topic, shaped)
        p["end_to_end_collector"] = await bench_end_to_end(
            eng, env, settings, shaped, p["stage"]["detailed_traces"], OUT / "bench-daemon-collector.log"
        )
        if not args.no_peer:
            p["peer_collector"] = await asyncio.to_thread(
                peer.run_peers, eng.kafka, topic, shaped.spans, OUT / "peer-collector"
            )
    finally:
        if not eng.private and not args.keep:
            delete_graph(eng.falkordb, settings.graph_name)


def latency_phase(rounds: int, isolated_rounds: int) -> dict[str, Any]:
    """bench.latency, tuned and with the shipped defaults, on the running local engines (``local up``) or on a
    private set of all four."""
    from bench.latency import measure

    async def both(engines: LocalEngines) -> dict[str, Any]:
        return {"tuned": await measure(engines, rounds=rounds),
                "defaults": await measure(engines, rounds=isolated_rounds, defaults=True)}  # fmt: skip

    if os.environ.get("TRACE_REPRO_POSTGRES_DSN"):
        return asyncio.run(both(LocalEngines()))
    default = Layout.default()
    local = LocalEngines(
        Layout(default.config_dir, default.cache_dir, Path(tempfile.mkdtemp(prefix="trace-repro-lat-")))
    )
    try:
        local.up()
        return asyncio.run(both(local))
    finally:
        local.down()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--spans", type=int, default=None, help="spans to generate (default 300000; --quick 40000)")
    ap.add_argument("--quick", action="store_true", help="a smaller run (under a minute)")
    ap.add_argument("--spans-per-message", type=int, default=300, help="spans per OTLP message (default 300)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="spans topic partitions (traces split by id; default: one per core)",
    )
    ap.add_argument("--no-engines", action="store_true", help="only the in-process ceilings")
    ap.add_argument("--no-daemon", action="store_true", help="skip the end-to-end phase")
    ap.add_argument("--no-shipped", action="store_true", help="skip the shipped-windows phase (idle CPU, RSS)")
    ap.add_argument("--no-latency", action="store_true", help="skip the detection-latency phase (sample shop)")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer OpenTelemetry Collector (bench.peer)")
    ap.add_argument(
        "--message-shape",
        choices=(*SHAPES, "both"),
        default="both",
        help="bench: ~30 traces per message; collector: one trace per message, as the Collector's kafka exporter "
        "writes them; both (default): every phase on bench-shaped messages, then the collector-shaped ones "
        "produced and run end to end (and the peer on them)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the bench topics and graphs on reused engines")
    ap.add_argument("--profile", action="store_true", help="only profile the stage-only path (cProfile)")
    ap.add_argument("--profile-daemon", action="store_true", help="run the end-to-end daemon under cProfile")
    ap.add_argument("--top", type=int, default=30, help="rows of the profile to print")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION__KEY=VALUE",
        help="a setting for the stage and the daemon, e.g. kafka__max_poll_records=20 (repeatable)",
    )
    ap.add_argument("--json", type=Path, default=OUT / "bench.json", help="where to write the results")
    args = ap.parse_args(argv)
    collector.tune()  # every phase runs under the daemon's garbage collector settings
    spans = args.spans or (40_000 if args.quick else 300_000)
    tag = uuid.uuid4().hex[:8]

    phase(f"generating {spans:,} spans ({args.spans_per_message}/message, seed {args.seed})")
    begin = time.perf_counter()
    partitions = args.partitions or os.cpu_count() or 1
    shape = "collector" if args.message_shape == "collector" else "bench"
    gen = generate_run(spans, args.spans_per_message, args.seed, partitions=partitions, shape=shape)
    gen_s = time.perf_counter() - begin
    local_settings = config.load(
        None, env=settings_env("127.0.0.1:9", "redis://127.0.0.1:9", tag, f"bench-spans-{tag}", 0, args.set)
    )
    if args.profile:
        profile_stage(gen, local_settings, args.top)
        return 0
    if not (args.no_peer or args.no_engines or args.no_daemon):
        phase("the peer Collector's binary (built once into the cache; not timed)")
        try:
            print(f"   {peer.PEER.binary()}", flush=True)
        except EngineError as exc:  # no Go, no module proxy: the rest of the bench still runs
            print(f"   the peer is not measured: {exc}", flush=True)
            args.no_peer = True

    results: dict[str, Any] = {
        "config": {
            "spans": gen.spans,
            "traces": gen.traces,
            "db_spans": gen.db_spans,
            "error_traces": gen.error_traces,
            "messages": len(gen.messages),
            "spans_per_message": args.spans_per_message,
            "message_shape": args.message_shape,
            "partitions": partitions,
            "bytes": gen.bytes,
            "event_time_s": (gen.end_ns - gen.start_ns) / 1e9,
            "seed": args.seed,
            "quick": args.quick,
            "profiled_daemon": args.profile_daemon,
            "overrides": args.set,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "gc_thresholds": list(gc.get_threshold()),
            "windows": local_settings.windows.model_dump(),
            "detail_policy": local_settings.graph_policy.detail,
        },
        "phases": {"generate": {"spans": gen.spans, "seconds": gen_s, "spans_per_s": rate(gen.spans, gen_s)}},
        "rss": {},
    }
    p = results["phases"]
    phase("the floor: protobuf parse, then parse + walk of every span's core fields")
    p["parse"] = bench_parse(gen)
    p[FLOOR] = bench_walk(gen)
    phase("decode-only ceiling")
    p["decode"] = bench_decode(gen)
    phase("stage-only ceiling")
    batches, p["stage"] = bench_stage(gen, local_settings)
    if not args.no_engines:
        asyncio.run(_with_engines(args, gen, batches, results, tag))
    results["ratio"] = ratios(p)
    results["rss"]["bench_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(report(results))
    if not args.no_engines and not args.no_latency:
        phase("detection latency: the sample shop's three defects under the daemon (Kafka, PostgreSQL, Debezium)")
        results["detection_latency"] = latency_phase(rounds=5 if args.quick else 10,
                                                     isolated_rounds=2 if args.quick else 4)  # fmt: skip
        for name, lat in results["detection_latency"].items():
            target = lat["floor_s"] + (1.0 if name == "defaults" else 0.5)
            print(f"   {name}: {lat['incidents']} incidents from {lat['defects_manifested']} manifested defects; "
                  f"latency p50 {lat['latency_p50_s']} s, p99 {lat['latency_p99_s']} s (floor: trace gap + causal "
                  f"window + settle = {lat['floor_s']} s; target <= {target:g} s: "
                  f"{'met' if (lat['latency_p99_s'] or 1e9) <= target else 'NOT met'})")  # fmt: skip
    faulthandler.cancel_dump_traceback_later()
    results["targets"] = targets(results)
    results["checks"] = checks(results)
    print(summary(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results: {args.json}")
    failed = [c["check"] for c in results["checks"] if not c["ok"]]
    if failed:
        print(f"bench FAILED: results changed ({'; '.join(failed)})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
