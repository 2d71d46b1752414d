"""The shipped defaults' costs that the bench's 1 s windows do not show: idle CPU and peak RSS (``make bench``).

    .venv/bin/python -m bench.shipped [--spans N] [--idle-s S]   # on the engines of TRACE_REPRO_* or private ones

The daemon as a user runs it (``python -m streamer.cli run``, its default workers), with the shipped ``[windows]``
and ``[proof]`` (60 s windows, a 10 s trace gap, 5 s idleness, 30 s settle), its own group, graph and topics, on a
fresh spans topic:

1. idle, no traffic: the CPU of its processes (``/proc``, all of them summed) over ``idle_s`` once it has been
   assigned the spans partitions and has settled (``SETTLE_S``), as a fraction of one core;
2. the bench's messages produced into the topic while it runs: its peak RSS (``VmHWM`` of each process, summed, as
   in the end-to-end phase) until stage 1 has committed the end of the spans topic (every trace closed, and the
   60 s windows that pinned their input), and the CPU of each second meanwhile (``cpu_series``);
3. idle with open windows: the CPU while it waits for its 60 s windows after the messages' work is done: from when
   every trace has closed (its ``trace_repro_open_traces`` gauge at 0, and no sooner than idleness + trace gap after
   the last message was consumed, ``CLOSED_S`` more) and stage 2 has read its input to the end, until that commit
   (``waiting_cores``); and again over ``idle_s`` after the commit (``idle_after_commit_cores``: what is left open
   is the proof desk's slices and the rows held for late changes).

Targets (issue 37): idle below ``IDLE_TARGET`` of a core in both, peak RSS at most ``RSS_TARGET_MB`` on 300k spans.
Reported, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.metrics import fetch_metrics
from bench.otlp_gen import Generated, generate_run
from bench.procfs import DaemonTree, proc_cpu_s, proc_mb, process_tree, terminate
from bench.readings import assigned_at, delete_graph, free_port
from streamer.runtime.topics import create_topics

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "out"
MB = 1024 * 1024
IDLE_TARGET = 0.02  # of one core, the daemon idle (all its processes)
RSS_TARGET_MB = 300.0  # the daemon's peak (VmHWM summed over its processes) on 300k spans, shipped windows
SETTLE_S = 10.0  # after assignment, before the no-traffic idle measurement (start-up work done)
CLOSED_S = 5.0 + 10.0 + 2.0  # shipped idleness + trace gap, and slack: every trace has closed this long after input


def _metric_sum(text: str, name: str, topic: str) -> float | None:
    values = re.findall(rf'^{name}\{{(?=[^}}]*topic="{re.escape(topic)}")[^}}]*\}} (\S+)$', text, re.M)
    return sum(float(v) for v in values) if values else None


def _progress(port: int, spans_topic: str) -> dict[str, float]:
    """From the daemon's /metrics: spans messages consumed and committed by stage 1, the traces it holds open (or due
    and not yet closed), and stage 2's lag on its input topic (each absent while unknown)."""
    text = fetch_metrics(port, timeout_s=5)
    if text is None:
        return {}
    out = {"consumed": _metric_sum(text, "trace_repro_consumed_messages_total", spans_topic) or 0.0,
           "committed": _metric_sum(text, "trace_repro_committed_offset", spans_topic) or 0.0}  # fmt: skip
    open_traces = re.findall(r"^trace_repro_open_traces(?:\{[^}]*\})? (\S+)$", text, re.M)
    if open_traces:
        out["open_traces"] = sum(float(v) for v in open_traces)
    internal = re.search(r'^trace_repro_consumer_lag_messages\{[^}]*topic="(bench-accesses-[^"]+)"', text, re.M)
    lag = _metric_sum(text, "trace_repro_consumer_lag_messages", internal.group(1)) if internal else None
    if lag is not None:
        out["stage2_lag"] = lag
    return out


def shipped_env(kafka: str, graph_url: str, tag: str, spans_topic: str, port: int) -> dict[str, str]:
    """The bench's daemon environment without its 1 s windows: the shipped ``[windows]`` and ``[proof]``."""
    from bench.run import settings_env

    env = settings_env(kafka, graph_url, tag, spans_topic, port)
    return {k: v for k, v in env.items() if not k.startswith(("TRACE_REPRO_WINDOWS__", "TRACE_REPRO_PROOF__"))}


def graph_name(kafka: str, graph_url: str, tag: str) -> str:
    """The graph the shipped phase's daemon writes (to delete after it)."""
    from streamer import config

    return config.load(None, env=shipped_env(kafka, graph_url, f"shipped{tag}", "x", 0)).graph_name


def _tree_cpu(pid: int) -> float:
    return sum(proc_cpu_s(p) or 0.0 for p in process_tree(pid))


async def _idle(pid: int, seconds: float, spy: Path | None = None) -> tuple[float, list[float]]:
    """The fraction of one core the process tree used over ``seconds`` of wall time (with ``spy``, the stacks
    sampled meanwhile by py-spy go there, collapsed: the sampler's own CPU is not the daemon's)."""
    sampler = None
    if spy is not None:
        py_spy = str(Path(sys.executable).parent / "py-spy")
        argv = ["record", "--pid", str(pid), "--duration", str(int(seconds)), "--format", "raw", "--output",
                str(spy), "--subprocesses", "--idle"]  # fmt: skip
        sampler = await asyncio.create_subprocess_exec(py_spy, *argv, stdout=subprocess.DEVNULL,
                                                       stderr=subprocess.DEVNULL)  # fmt: skip
    before, begin = _tree_cpu(pid), time.monotonic()
    last, series = before, []
    for _ in range(max(1, round(seconds))):
        await asyncio.sleep(seconds / max(1, round(seconds)))
        now = _tree_cpu(pid)
        series.append(round(now - last, 3))
        last = now
    used = (last - before) / (time.monotonic() - begin)
    if sampler is not None:
        await sampler.wait()
    return used, series


async def _produce(kafka: str, topic: str, gen: Generated) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka, max_request_size=16 * MB, linger_ms=5,
                                max_batch_size=1 * MB)  # fmt: skip
    await producer.start()
    try:
        futures = [
            await producer.send(topic, m, partition=p) for m, p in zip(gen.messages, gen.partitions, strict=True)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def measure(
    kafka: str, graph_url: str, gen: Generated, *, idle_s: float = 30.0, tag: str = "", spy: Path | None = None
) -> dict[str, Any]:
    """The three measurements above; the daemon is stopped at the end (its topics and graph are left to the
    caller's clean-up: their names carry ``tag``)."""

    tag = tag or uuid.uuid4().hex[:8]
    spans_topic = f"bench-spans-shipped-{tag}"
    port = free_port()
    env = shipped_env(kafka, graph_url, f"shipped{tag}", spans_topic, port)
    await create_topics(kafka, {spans_topic: max(gen.partitions) + 1})
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_REPRO_")} | env
    OUT.mkdir(exist_ok=True)
    log = OUT / "bench-shipped-daemon.log"
    out: dict[str, Any] = {"spans": gen.spans, "log": str(log), "idle_s": idle_s}
    with log.open("wb") as log_file:
        argv = ["-m", "streamer.cli", "run"]
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv, env=child_env, cwd=REPO, stdout=log_file,
                                                    stderr=subprocess.STDOUT)  # fmt: skip
        tree = DaemonTree(proc.pid)
        try:
            deadline = time.monotonic() + 120
            while assigned_at(log, spans_topic) is None:
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the daemon did not get the spans partitions; see {log}")
                await asyncio.sleep(0.2)
            await asyncio.sleep(SETTLE_S)
            tree.sample()
            out["processes"] = len(process_tree(proc.pid))
            out["rss_before_traffic_mb"] = tree.peak_sum_rss_mb  # started, assigned, nothing read yet
            out["idle_no_traffic_cores"], out["cpu_series_no_traffic"] = await _idle(
                proc.pid, idle_s, spy and spy.with_suffix(".quiet.txt")
            )
            begin = time.monotonic()
            await _produce(kafka, spans_topic, gen)
            deadline = begin + 240 + gen.spans / 1_000
            series, rss, last_cpu, waiting_from = [], [], _tree_cpu(proc.pid), None
            sampling: asyncio.Future[tuple[float, list[float]]] | None = None
            while True:
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the daemon did not commit the end of the spans topic; see {log}")
                tree.sample()
                await asyncio.sleep(1.0)
                now, cpu = time.monotonic() - begin, _tree_cpu(proc.pid)
                series.append(round(cpu - last_cpu, 3))
                rss.append(round(sum(proc_mb(p, "VmRSS") or 0.0 for p in process_tree(proc.pid))))
                last_cpu = cpu
                seen = _progress(port, spans_topic)
                if seen.get("consumed", 0) >= len(gen.messages):
                    out.setdefault("consumed_s", now)
                if (waiting_from is None and "consumed_s" in out and now >= out["consumed_s"] + CLOSED_S
                        and seen.get("open_traces") == 0 and seen.get("stage2_lag") == 0):  # fmt: skip
                    waiting_from = (now, cpu, len(series))
                    if spy is not None:  # what it does while it waits (sampled for idle_s, in the background)
                        sampling = asyncio.ensure_future(_idle(proc.pid, idle_s, spy.with_suffix(".waiting.txt")))
                if seen.get("committed", 0) >= len(gen.messages):
                    out["committed_s"] = now
                    break
            tree.sample()
            out["cpu_series"], out["rss_series_mb"] = series, rss
            out["peak_rss_mb"] = sum(tree.peak_mb.values())
            out["peak_rss_mb_per_process"] = sorted(tree.peak_mb.values(), reverse=True)
            if waiting_from is not None and out["committed_s"] > waiting_from[0]:
                out["waiting_from_s"] = waiting_from[0]
                out["waiting_cores"] = (last_cpu - waiting_from[1]) / (out["committed_s"] - waiting_from[0])
                out["waiting_median_cores"] = statistics.median(series[waiting_from[2] :])
            if sampling is not None:
                await sampling
            out["idle_after_commit_cores"], after = await _idle(proc.pid, idle_s, spy and spy.with_suffix(".open.txt"))
            out["idle_after_commit_median_cores"], out["cpu_series_after_commit"] = statistics.median(after), after
        finally:
            await terminate(proc, 60)
    return out


def targets(shipped: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 37's targets for the shipped defaults, in the shape of ``bench.run.targets``."""
    note = "" if shipped["spans"] >= 300_000 else f"{shipped['spans']:,}-span run; the target is for 300k"

    def target(name: str, value: float | None, limit: float, note: str = "") -> dict[str, Any]:
        met = None if value is None else value <= limit
        return {"name": name, "value": value, "limit": limit, "at_most": True, "met": met, "note": note}

    def mean(key: str) -> str:
        value = shipped.get(key)
        return "" if value is None else f"cores, in the median second; mean {value:.3f} with the work that fell due"

    return [
        target("shipped: idle, no traffic", shipped.get("idle_no_traffic_cores"), IDLE_TARGET, "cores, mean"),
        target("shipped: idle waiting for 60 s",
               shipped.get("waiting_median_cores"), IDLE_TARGET,
               mean("waiting_cores") if "waiting_cores" in shipped else "no wait: the commit came first"),
        target("shipped: idle after the commit", shipped.get("idle_after_commit_median_cores"),
               IDLE_TARGET, mean("idle_after_commit_cores")),
        target("shipped: daemon peak RSS (MB)", shipped.get("peak_rss_mb"), RSS_TARGET_MB, note),
    ]  # fmt: skip


def _cores(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def report(shipped: dict[str, Any]) -> str:
    per = ", ".join(f"{mb:.0f}" for mb in shipped.get("peak_rss_mb_per_process", []))
    return (f"shipped windows ({shipped['spans']:,} spans, {shipped.get('processes', '?')} process(es)), in cores: "
            f"idle {_cores(shipped.get('idle_no_traffic_cores'))} with no traffic; waiting for the 60 s windows "
            f"(from {shipped.get('waiting_from_s', 0):.0f} s to their commit at {shipped['committed_s']:.0f} s) "
            f"median second {_cores(shipped.get('waiting_median_cores'))}, mean "
            f"{_cores(shipped.get('waiting_cores'))}; after the commit median second "
            f"{_cores(shipped.get('idle_after_commit_median_cores'))}, mean "
            f"{_cores(shipped.get('idle_after_commit_cores'))} (target < {IDLE_TARGET}); peak RSS "
            f"{shipped['peak_rss_mb']:.0f} MB ({per}; {shipped.get('rss_before_traffic_mb', 0):.0f} MB before any "
            f"traffic; target <= {RSS_TARGET_MB:.0f}); consumed in {shipped['consumed_s']:.1f} s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.shipped", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--spans", type=int, default=300_000)
    ap.add_argument("--idle-s", type=float, default=30.0, help="seconds of each idle measurement")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--py-spy", type=Path, default=None, help="py-spy's stacks of each idle phase (PATH.*.txt)")
    ap.add_argument("--json", type=Path, default=OUT / "shipped.json")
    args = ap.parse_args(argv)
    from bench.run import delete_topics, engines

    gen = generate_run(args.spans, 300, args.seed, partitions=os.cpu_count() or 1)
    tag = uuid.uuid4().hex[:8]
    with engines() as eng:
        try:
            shipped = asyncio.run(measure(eng.kafka, eng.falkordb, gen, idle_s=args.idle_s, tag=tag, spy=args.py_spy))
        finally:
            if not eng.private:
                asyncio.run(delete_topics(eng.kafka, tag))
                delete_graph(eng.falkordb, graph_name(eng.kafka, eng.falkordb, tag))
    print(report(shipped))
    print("   RSS (MB) each second after the messages were produced:", *shipped["rss_series_mb"])
    for name in ("cpu_series_no_traffic", "cpu_series", "cpu_series_after_commit"):
        print(f"   {name} (CPU s in each second):", " ".join(f"{x:.2f}" for x in shipped[name]))
    for t in targets(shipped):
        verdict = "not measured" if t["met"] is None else "met" if t["met"] else "NOT met"
        print(f"   {t['name']}: {_cores(t['value'])} (target <= {t['limit']:g}): {verdict} {t['note']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(shipped, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
