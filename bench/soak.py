"""``make soak``: the daemon for minutes on end at a steady rate, with planted collisions; is anything missed, does
memory stay flat?

    .venv/bin/python -m bench.soak [--minutes 10] [--spans-per-s 2000] [--collision-every-s 30]
                                   [--sample-every-s 30] [--warmup-minutes 2] [--json out/soak.json]

What runs:

- the daemon as a subprocess (``python -m streamer.cli run --config out/soak/trace-repro.toml``, both stages, a
  config generated with this run's own topics, consumer groups and graph; its log in ``out/soak/daemon.log``);
- background traffic: ``bench.otlp_gen`` traces (the bench's multi-service shop, ~10 % DB spans, ~1 % errors),
  generated tick by tick with event time *now* and produced to the spans topic at ``--spans-per-s``;
- planted collisions: every ``--collision-every-s`` (the first after half of it), one round of the sample shop's
  lost update (``bench.shop``: ``capture_payment`` racing the ``expire_cart`` job on a fresh order, on the real
  PostgreSQL, its row changes captured by the real Debezium connector), exactly as ``bench.latency`` produces them;
- every ``--sample-every-s``: the daemon's RSS (``VmRSS``; with ``--workers N``, the PSS summed over its processes,
  which share the supervisor's pages), and from its ``/metrics`` the consumer lag
  (``trace_repro_consumer_lag_messages``, summed), the pinned offsets per stage (``trace_repro_pinned_offsets``),
  the open traces (``trace_repro_open_traces``), messages consumed, incidents published, and every component's
  state sizes (``trace_repro_component_state``: where memory could go).

At the end the traffic stops, the daemon gets up to ``--drain-s`` to report the last collisions and drain (no lag,
no open trace, no pinned offset), and is stopped with SIGTERM. The report: every planted collision found (a
``lost_update`` incident on its row on the incidents topic) or missed, reported more than once or not; the
detection latency of each (incident record time minus the end of its round); the RSS curve; and whether RSS stayed
within ``--rss-tolerance`` (10 %) of its post-warm-up value (the first sample at or after ``--warmup-minutes``) for
the rest of the run. Written to ``--json``. Exit code 0 when every planted collision was found exactly once and
RSS stayed within the tolerance, 1 otherwise, 2 when the daemon died.

Engines: the ``trace-repro local up`` ones when all four are healthy (the soak's topics, consumer groups and graph
are its own and are deleted afterwards unless ``--keep``), otherwise a private set of all four in a temporary run
directory, stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import falkordb
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from bench.metrics import fetch_metrics
from bench.otlp_gen import generate_run
from bench.procfs import proc_cpu_s, proc_mb, process_tree
from bench.shop import db
from bench.shop.telemetry import Telemetry, start_telemetry
from bench.shop.traffic import run_traffic
from streamer.engines import Layout, LocalEngines
from streamer.engines.process import free_port
from streamer.runtime.topics import create_topics

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "out"
TABLES = ("orders", "inventory", "charges")
SPANS_PER_MESSAGE = 100
TICK_S = 1.0


# ---- engines, config, daemon -----------------------------------------------------------------------------------


@contextlib.contextmanager
def local_engines() -> Iterator[tuple[LocalEngines, bool]]:
    """(engines, private): the running ``local up`` engines when all are healthy, else a private set."""
    shared = LocalEngines()
    if shared.engines and all(s.healthy for s in shared.status()):
        yield shared, False
        return
    default = Layout.default()
    local = LocalEngines(
        Layout(default.config_dir, default.cache_dir, Path(tempfile.mkdtemp(prefix="trace-repro-soak-")))
    )
    try:
        begin = time.monotonic()
        local.up()
        print(f"   private engines up in {time.monotonic() - begin:.0f}s ({local.layout.run_dir})", flush=True)
        yield local, True
    finally:
        local.down()


@dataclass(frozen=True)
class Names:
    """This run's topics, consumer group and graph."""

    tag: str

    @property
    def prefix(self) -> str:  # Debezium topic.prefix
        return f"soak{self.tag}"

    @property
    def spans(self) -> str:
        return f"soak-spans-{self.tag}"

    @property
    def incidents(self) -> str:
        return f"soak-incidents-{self.tag}"

    @property
    def group(self) -> str:
        return f"soak-{self.tag}"

    @property
    def graph(self) -> str:
        return f"trace_repro_soak_{self.tag}"

    def cdc(self) -> list[str]:
        return [f"{self.prefix}.public.{t}" for t in TABLES]


def config_toml(names: Names, kafka: str, graph_url: str, http_port: int) -> str:
    """The daemon's config for this run: own topics, group and graph; the shop's SQL keys and invariant."""
    t = names.tag
    return f"""# generated by bench/soak.py for run {t}
environment = "soak_{t}"

[kafka]
bootstrap = "{kafka}"
group_id = "{names.group}"
auto_offset_reset = "earliest"
spans_topic = "{names.spans}"
logs_topic = "soak-logs-{t}"
cdc_pattern = '^{names.prefix}\\.public\\.[a-z]+$'
accesses_topic = "soak-accesses-{t}"
accesses_partitions = 2
incidents_topic = "{names.incidents}"
repros_topic = "soak-repros-{t}"
verdicts_topic = "soak-verdicts-{t}"
contracts_topic = "soak-contracts-{t}"
dlq_topic = "soak-dlq-{t}"

[falkordb]
url = "{graph_url}"

[windows]
window_s = 10
allowed_lateness_s = 1
trace_gap_s = 2
idle_s = 2

[sql]
key_columns = {{ inventory = ["sku"] }}
insert_identity = {{ charges = ["order_id"] }}

[collisions]
window_s = 1.0
settle_s = 0.5
invariants = {{ inventory = ["stock >= 0"] }}

[graph_policy]
span_retention_s = 120

[http]
port = {http_port}
"""


def start_daemon(config: Path, env: dict[str, str], log_path: Path, workers: int = 1) -> subprocess.Popen[bytes]:
    """``python -m streamer.cli run --config <config> --workers N``, its output appended to ``log_path``."""
    with log_path.open("wb") as log:
        return subprocess.Popen([sys.executable, "-m", "streamer.cli", "run", "--config", str(config), "--workers",
                                 str(workers)], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


def _memory_mb(pid: int, workers: int) -> float | None:
    """The daemon's memory: its VmRSS; with workers, the PSS summed over its processes (they share pages)."""
    if workers == 1:
        return proc_mb(pid, "VmRSS")
    values = [proc_mb(p, "Pss", "smaps_rollup") for p in process_tree(pid)]
    return sum(v for v in values if v is not None) or None


def scrape(port: int) -> dict[str, Any] | None:
    """The figures the soak follows, from the daemon's ``/metrics``; None when it does not answer."""
    text = fetch_metrics(port, timeout_s=5)
    if text is None:
        return None
    out: dict[str, Any] = {"lag": 0.0, "pinned": {}, "open_traces": 0.0, "consumed": 0.0, "incidents": 0.0, "state": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "trace_repro_consumer_lag_messages":
                out["lag"] += s.value
            elif s.name == "trace_repro_pinned_offsets":
                out["pinned"][s.labels.get("stage", "")] = s.value
            elif s.name == "trace_repro_open_traces":
                out["open_traces"] = s.value
            elif s.name == "trace_repro_consumed_messages_total":
                out["consumed"] += s.value
            elif s.name == "trace_repro_incidents_total":
                out["incidents"] += s.value
            elif s.name == "trace_repro_component_state":
                out["state"][f"{s.labels.get('component')}.{s.labels.get('state')}"] = s.value
    return out


# ---- the run -------------------------------------------------------------------------------------------------


@dataclass
class Planted:
    entity: str
    round_end_unix_ms: float
    manifested: bool


@dataclass
class Sample:
    t_s: float
    rss_mb: float | None
    lag: float | None
    pinned: dict[str, float]
    open_traces: float | None
    consumed: float | None
    incidents: float | None
    spans_produced: int
    cpu_share: float | None  # daemon CPU since the previous sample, as a share of one core
    state: dict[str, float]  # every component's state sizes (trace_repro_component_state)


@dataclass
class Run:
    args: argparse.Namespace
    names: Names
    pid: int
    port: int
    workers: int = 1
    begin: float = field(default_factory=time.monotonic)
    spans_produced: int = 0
    messages_produced: int = 0
    behind_s: float = 0.0  # how far the traffic generator fell behind its schedule, at worst
    planted: list[Planted] = field(default_factory=list)
    incidents: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (record time ms, event)
    samples: list[Sample] = field(default_factory=list)
    _cpu: tuple[float, float] | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.begin

    def sample(self) -> Sample:
        metrics = scrape(self.port) or {}
        cpu, now = proc_cpu_s(self.pid), time.monotonic()
        share = None
        if cpu is not None and self._cpu is not None and now > self._cpu[1]:
            share = round((cpu - self._cpu[0]) / (now - self._cpu[1]), 2)
        if cpu is not None:
            self._cpu = (cpu, now)
        s = Sample(round(self.elapsed(), 1), _memory_mb(self.pid, self.workers), metrics.get("lag"),
                   metrics.get("pinned", {}), metrics.get("open_traces"), metrics.get("consumed"),
                   metrics.get("incidents"), self.spans_produced, share, metrics.get("state", {}))  # fmt: skip
        self.samples.append(s)
        rss = f"{s.rss_mb:.0f} MB" if s.rss_mb is not None else "-"
        print(
            f"   t={s.t_s:6.0f}s  rss {rss:>7}  lag {s.lag}  pinned {s.pinned}  open traces {s.open_traces}  "
            f"incidents {s.incidents}  spans produced {s.spans_produced:,}  cpu {s.cpu_share}",
            flush=True,
        )
        return s


async def traffic(run: Run, bootstrap: str, stop: asyncio.Event, spans_per_trace: float) -> None:
    """Background spans at ``--spans-per-s``, one tick's worth at a time, event time now."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_request_size=16 * 1024 * 1024)
    await producer.start()
    per_tick = max(1, round(run.args.spans_per_s * TICK_S))
    start = time.monotonic()
    tick = 0
    try:
        while not stop.is_set():
            gen = await asyncio.to_thread(generate_run, per_tick, SPANS_PER_MESSAGE, run.args.seed * 1_000_000 + tick,
                                          start_ns=time.time_ns(),
                                          traces_per_s=run.args.spans_per_s / spans_per_trace)  # fmt: skip
            acks = [await producer.send(run.names.spans, m) for m in gen.messages]
            await asyncio.gather(*acks)
            run.spans_produced += gen.spans
            run.messages_produced += len(gen.messages)
            tick += 1
            wait = start + tick * TICK_S - time.monotonic()
            run.behind_s = max(run.behind_s, -wait)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(wait, 0.0))
    finally:
        await producer.stop()


async def plant(run: Run, dsn: str, bootstrap: str, stop: asyncio.Event, telemetry: Telemetry) -> None:
    """One round of the shop's lost update every ``--collision-every-s``."""
    every = run.args.collision_every_s
    n = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, run.begin + every / 2 + n * every - time.monotonic()))
        if stop.is_set():
            return
        summary = await asyncio.to_thread(run_traffic, dsn, bootstrap, scenario="lost_update", rounds=1,
                                          topic=run.names.spans, environment="soak", telemetry=telemetry)  # fmt: skip
        result = summary.result("lost_update")
        for order in result.targets:
            run.planted.append(Planted(f"orders:{order}", time.time() * 1000, result.manifested > 0))
        n += 1


async def collect_incidents(run: Run, bootstrap: str, stop: asyncio.Event) -> None:
    """Every event on the incidents topic, with its record time."""
    consumer = AIOKafkaConsumer(run.names.incidents, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"soak-reader-{run.names.tag}", enable_auto_commit=False)  # fmt: skip
    await consumer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    run.incidents.append((r.timestamp, json.loads(r.value)))
    finally:
        await consumer.stop()


async def sampler(run: Run, stop: asyncio.Event) -> None:
    n = 1
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, run.begin + n * run.args.sample_every_s - time.monotonic()))
        if not stop.is_set():
            run.sample()
            n += 1


def _found(run: Run) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Lost-update incidents by planted row, and the planted rows without one."""
    by_entity: dict[str, list[dict[str, Any]]] = {}
    for _, e in run.incidents:
        if e.get("kind") == "incident" and e.get("anomaly") == "lost_update":
            by_entity.setdefault(e["entity"], []).append(e)
    missed = [p.entity for p in run.planted if p.entity not in by_entity]
    return by_entity, missed


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    names = Names(uuid.uuid4().hex[:8])
    out_dir = args.json.parent / "soak"
    out_dir.mkdir(parents=True, exist_ok=True)
    with local_engines() as (engines, private):
        kafka, graph_url, dsn = engines.address("kafka"), engines.address("falkordb"), engines.address("postgres")
        await asyncio.to_thread(db.apply_schema, dsn)
        await asyncio.to_thread(engines.capture, [f"public.{t}" for t in TABLES], topic_prefix=names.prefix)
        await create_topics(kafka, dict.fromkeys([names.spans, *names.cdc()], 1))
        port = free_port()
        config = out_dir / "trace-repro.toml"
        config.write_text(config_toml(names, kafka, graph_url, port))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_REPRO_")}
        log_path = out_dir / "daemon.log"
        sample = generate_run(20_000, SPANS_PER_MESSAGE, seed=args.seed)
        spans_per_trace = sample.spans / sample.traces
        telemetry = start_telemetry(kafka, topic=names.spans, environment="soak")
        daemon = start_daemon(config, env, log_path, args.workers)
        run = Run(args, names, daemon.pid, port, args.workers)
        stop_traffic, stop_all = asyncio.Event(), asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        died: int | None = None
        try:
            deadline = time.monotonic() + 90
            while scrape(port) is None or '"partitions.assigned"' not in log_path.read_text(errors="replace"):
                if daemon.poll() is not None:
                    raise RuntimeError(f"the daemon exited with {daemon.returncode} at start; see {log_path}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the daemon did not start within 90 s; see {log_path}")
                await asyncio.sleep(0.2)
            print(f"== soak: {args.minutes:g} min at {args.spans_per_s:,} spans/s, a planted lost update every "
                  f"{args.collision_every_s:g} s, a sample every {args.sample_every_s:g} s "
                  f"(daemon pid {daemon.pid}, /metrics on :{port}, log {log_path})", flush=True)  # fmt: skip
            run.begin = time.monotonic()
            run.sample()
            tasks = [
                asyncio.create_task(traffic(run, kafka, stop_traffic, spans_per_trace)),
                asyncio.create_task(plant(run, dsn, kafka, stop_traffic, telemetry)),
                asyncio.create_task(collect_incidents(run, kafka, stop_all)),
                asyncio.create_task(sampler(run, stop_traffic)),
            ]
            end = run.begin + args.minutes * 60
            while time.monotonic() < end:
                if daemon.poll() is not None:
                    died = daemon.returncode
                    break
                for t in tasks:
                    if t.done():
                        t.result()  # a failing generator or planter ends the soak with its error
                await asyncio.sleep(min(1.0, max(0.0, end - time.monotonic())))
            traffic_s = run.elapsed()
            last = run.sample()
            stop_traffic.set()
            await asyncio.gather(*tasks[:2], tasks[3])
            print(f"== traffic stopped after {traffic_s:.0f}s; draining (up to {args.drain_s:g}s)", flush=True)
            drain_deadline = time.monotonic() + args.drain_s
            while died is None and time.monotonic() < drain_deadline:
                metrics = scrape(port)
                _, missed = _found(run)
                idle = metrics is not None and not metrics["lag"] and not metrics["open_traces"]
                if not missed and idle and metrics is not None and not any(metrics["pinned"].values()):
                    break
                if daemon.poll() is not None:
                    died = daemon.returncode
                await asyncio.sleep(1.0)
            await asyncio.sleep(2.0)  # a duplicate report would arrive now
            drained = run.sample()
        finally:
            stop_traffic.set()
            stop_all.set()
            for t in tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            telemetry.shutdown()
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(daemon.wait, 60)
                except subprocess.TimeoutExpired:
                    daemon.kill()
            if not private and not args.keep:
                await _cleanup(kafka, graph_url, names)
    return report(run, last, drained, traffic_s, died, daemon.returncode, str(log_path), str(config))


async def _cleanup(kafka: str, graph_url: str, names: Names) -> None:
    """Delete this run's topics and graph from shared engines."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        mine = [t for t in await admin.list_topics() if names.tag in t]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()
    host, port = graph_url.removeprefix("redis://").split(":")
    with contextlib.suppress(Exception):
        falkordb.FalkorDB(host=host, port=int(port)).select_graph(names.graph).delete()


def report(run: Run, last: Sample, drained: Sample, traffic_s: float, died: int | None, exit_code: int | None,
           log: str, config: str) -> dict[str, Any]:  # fmt: skip
    args = run.args
    by_entity, missed = _found(run)
    planted = [p.entity for p in run.planted]
    twice = {e: len(by_entity[e]) for e in planted if len(by_entity.get(e, [])) > 1}
    latency = {}
    for p in run.planted:
        records = [ts for ts, e in run.incidents if e.get("entity") == p.entity and e.get("anomaly") == "lost_update"]
        if records:
            latency[p.entity] = round((min(records) - p.round_end_unix_ms) / 1000, 2)
    others = Counter(e.get("anomaly", e.get("kind")) for _, e in run.incidents if e.get("entity") not in planted)
    warmup_s = args.warmup_minutes * 60
    during = [s for s in run.samples if s.t_s <= traffic_s + 1 and s.rss_mb is not None]
    after = [s for s in during if s.t_s >= warmup_s - 1]
    baseline = after[0].rss_mb if after else None
    drift = None
    if baseline and len(after) > 1:
        drift = max(abs(s.rss_mb - baseline) / baseline for s in after[1:] if s.rss_mb is not None)
    rss_ok = drift is not None and drift <= args.rss_tolerance
    first = after[0] if after else (during[0] if during else last)
    growth = {k: (first.state.get(k, 0.0), v) for k, v in sorted(last.state.items()) if v != first.state.get(k, 0.0)}
    passed = died is None and not missed and not twice and (rss_ok or drift is None)
    result: dict[str, Any] = {
        "passed": passed,
        "config": {
            "minutes": args.minutes,
            "spans_per_s": args.spans_per_s,
            "collision_every_s": args.collision_every_s,
            "sample_every_s": args.sample_every_s,
            "warmup_minutes": args.warmup_minutes,
            "rss_tolerance": args.rss_tolerance,
            "workers": args.workers,
            "memory": "VmRSS" if args.workers == 1 else "PSS summed over the daemon's processes",
            "daemon_config": config,
            "daemon_log": log,
        },
        "traffic": {
            "seconds": round(traffic_s, 1),
            "spans_produced": run.spans_produced,
            "messages_produced": run.messages_produced,
            "spans_per_s": round(run.spans_produced / traffic_s, 1) if traffic_s else 0,
            "generator_behind_s_max": round(run.behind_s, 2),
        },
        "collisions": {
            "planted": len(planted),
            "manifested_in_db": sum(p.manifested for p in run.planted),
            "found": len(planted) - len(missed),
            "missed": missed,
            "reported_more_than_once": twice,
            "detection_latency_s": latency,
            "other_incidents": dict(others),
        },
        "rss": {
            "curve_mb": [(s.t_s, round(s.rss_mb, 1)) for s in during if s.rss_mb is not None],
            "post_warmup_baseline_mb": round(baseline, 1) if baseline else None,
            "max_drift": round(drift, 4) if drift is not None else None,
            "within_tolerance": rss_ok if drift is not None else None,
            "component_state_from_baseline_to_end": growth,
        },
        "end_of_traffic": asdict(last),
        "after_drain": asdict(drained),
        "samples": [asdict(s) for s in run.samples],
        "daemon": {"died_with": died, "exit_code": exit_code},
    }
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the traffic runs (default 10)")
    ap.add_argument("--spans-per-s", type=int, default=2_000, help="background spans per second (default 2000)")
    ap.add_argument("--collision-every-s", type=float, default=30.0, help="a planted lost update this often")
    ap.add_argument("--sample-every-s", type=float, default=30.0, help="RSS and /metrics this often")
    ap.add_argument("--warmup-minutes", type=float, default=2.0, help="RSS before this is warm-up (default 2)")
    ap.add_argument("--rss-tolerance", type=float, default=0.10, help="allowed RSS drift after warm-up (0.10)")
    ap.add_argument("--drain-s", type=float, default=90.0, help="time for the last reports after the traffic")
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        help="run --workers N (default 1); with more, memory is the PSS summed over its processes",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the topics and graph on shared engines")
    ap.add_argument("--json", type=Path, default=OUT / "soak.json", help="where to write the results")
    args = ap.parse_args(argv)
    result = asyncio.run(soak(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    c, r, t = result["collisions"], result["rss"], result["traffic"]
    print(f"== {t['spans_produced']:,} spans in {t['seconds']:.0f}s ({t['spans_per_s']:,.0f}/s); "
          f"planted collisions found {c['found']}/{c['planted']} (missed {c['missed'] or 'none'}, "
          f"reported twice {c['reported_more_than_once'] or 'none'}); detection latency "
          f"{sorted(c['detection_latency_s'].values())}")  # fmt: skip
    verdict = "n/a" if r["within_tolerance"] is None else "within" if r["within_tolerance"] else "DRIFTED"
    print(f"== RSS (MB) {r['curve_mb']}; post-warm-up {r['post_warmup_baseline_mb']} MB, max drift "
          f"{r['max_drift']} (tolerance {args.rss_tolerance}): {verdict}")  # fmt: skip
    print(f"== {'PASS' if result['passed'] else 'FAIL'}; results: {args.json}")
    if result["daemon"]["died_with"] is not None:
        return 2
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
