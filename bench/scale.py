"""``python -m bench.scale``: how stage 1 and the daemon scale out, per added core (issue 37's scale-out).

    .venv/bin/python -m bench.scale [--spans N] [--partitions P] [--processes 1,2] [--no-engines]

Over the same generated OTLP messages (``bench.otlp_gen``, bench-shaped, on ``--partitions`` partitions, every
trace on one partition, as the Collector keys them):

1. **stage 1 across processes**, no engines: the partitions dealt out to k forked processes (each partition to
   process ``partition % k``), each running the stage-only ceiling's path (``bench.run.run_stage``: decode,
   assembly, SQL, windows, graph rows, accesses; the clock moved on at the end so that everything closes) over its
   partitions' messages. Timed from a barrier every process passes (warm: they fork from a process that ran the
   stage once) to the last one's end. Reported: spans/s, CPU µs per span over the processes, and the efficiency of
   k processes, ``rate(k) / (k * rate(1))``: 1.0 is linear scaling, what the capacity model assumes.
2. **the daemon end to end** (unless ``--no-engines``), as users scale it out: one process (``--workers 1``);
   ``--workers k`` (a supervisor, k stage-1 worker processes in one consumer group and stage 2 in one more); and k
   replicas of ``--workers 1`` (k daemons in one consumer group, each with both stages, as k pods). Each run has
   a fresh spans topic, consumer group and graph: the daemons start on the empty topic, and once every stage-1
   consumer owns its share of the partitions (the group has settled: no rebalance inside the timed run), the
   messages are produced; the run is timed from the produce until the group has committed every partition's end
   and the graph holds every trace. Reported: spans/s, the speedup over one process of the same round, CPU µs per
   span over every process of the daemons, and the cores Kafka and FalkorDB used (private engines only). The
   engines share the machine's cores with the daemons: on a machine with few cores that caps the speedup; the CPU
   per span says what scaling out costs in work.

Results go to ``out/scale.json``; figures go to ``bench/RESULTS.md`` by hand (date, machine, command).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from bench.otlp_gen import Generated, generate_run
from bench.procfs import DaemonTree, cpu_deltas, proc_cpu_s, terminate
from bench.readings import delete_graph, end_offsets, free_port, group_committed, node_count, rate
from bench.run import (
    OUT,
    REPO,
    Engines,
    bench_produce,
    bench_stage,
    delete_topics,
    engines,
    phase,
    run_stage,
    settings_env,
)
from streamer import config
from streamer.config import Settings
from streamer.runtime import collector
from streamer.runtime.topics import create_topics


def partitions_of(gen: Generated, keep: set[int]) -> Generated:
    """The messages of ``gen`` on the partitions ``keep`` (their order kept), as a run of their own."""
    picked = [i for i, p in enumerate(gen.partitions) if p in keep]
    return replace(
        gen,
        messages=[gen.messages[i] for i in picked],
        span_counts=[gen.span_counts[i] for i in picked],
        partitions=[gen.partitions[i] for i in picked],
        keys=[gen.keys[i] for i in picked] if gen.keys else [],
        spans=sum(gen.span_counts[i] for i in picked),
    )


def dealt(partitions: int, k: int) -> list[set[int]]:
    """Partitions dealt out to ``k`` processes: partition ``p`` to process ``p % k``."""
    return [{p for p in range(partitions) if p % k == i} for i in range(k)]


BARRIER_S = 120  # how long the stage processes and the bench wait for each other to start (a crashed one: no hang)


def _stage_worker(gen: Generated, settings: Settings, barrier: Any, results: Any) -> None:
    barrier.wait(BARRIER_S)
    cpu = time.process_time()
    run_stage(gen, settings, keep=False)
    results.put((time.monotonic(), time.process_time() - cpu, gen.spans))


def stage_across(gen: Generated, settings: Settings, partitions: int, k: int) -> dict[str, Any]:
    """Stage 1 over ``gen``'s partitions dealt out to ``k`` forked processes; see the module docstring."""
    ctx = multiprocessing.get_context("fork")  # (the children inherit the warm stage and the messages)
    barrier, results = ctx.Barrier(k + 1), ctx.Queue()
    shares = [partitions_of(gen, keep) for keep in dealt(partitions, k)]
    procs = [ctx.Process(target=_stage_worker, args=(share, settings, barrier, results)) for share in shares]
    for proc in procs:
        proc.start()
    barrier.wait(BARRIER_S)
    begin = time.monotonic()
    done = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
        if proc.exitcode != 0:
            raise RuntimeError(f"a stage process exited with {proc.exitcode}")
    seconds = max(end for end, _, _ in done) - begin
    spans = sum(n for _, _, n in done)
    cpu_s = sum(c for _, c, _ in done)
    return {
        "processes": k,
        "spans": spans,
        "seconds": seconds,
        "spans_per_s": rate(spans, seconds),
        "cpu_us_per_span": cpu_s / spans * 1e6 if spans else None,
        "slowest_share_cpu_s": max(c for _, c, _ in done),
    }


def assignments(log: Path, topic: str) -> dict[tuple[str, int], list[str]]:
    """Each stage-1 consumer's latest assignment of ``topic``'s partitions, from a daemon's JSON log: by (log, worker).
    (A rebalance revokes everything and assigns anew, so a consumer's latest assignment is what it owns.)"""
    out: dict[tuple[str, int], list[str]] = {}
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if '"partitions.assigned"' not in line or '"ingest"' not in line:
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                event = json.loads(line)
                mine = [p for p in event["partitions"] if p.rsplit("/", 1)[0] == topic]
                out[str(log), int(event.get("worker", 0))] = mine
    return out


def settled(logs: Sequence[Path], topic: str, partitions: int, members: int) -> bool:
    """Whether ``members`` stage-1 consumers have joined and own ``topic``'s partitions, each one exactly once."""
    owned = {k: v for path in logs for k, v in assignments(path, topic).items()}
    every = [p for ps in owned.values() for p in ps]
    return len(owned) == members and len(every) == partitions == len(set(every))


async def daemons_end_to_end(
    eng: Engines, env: dict[str, str], gen: Generated, expected_traces: int, *, replicas: int, workers: int, log: Path
) -> dict[str, Any]:
    """``replicas`` daemons of ``--workers workers`` in one consumer group (each its own HTTP port), started on an
    empty spans topic; once the group has settled, the messages are produced and the run is timed from the produce
    until every message is committed and every trace is in the graph (see the module docstring)."""
    spans_topic, group = env["TRACE_REPRO_KAFKA__SPANS_TOPIC"], env["TRACE_REPRO_KAFKA__GROUP_ID"]
    graph = config.load(None, env=env).graph_name
    partitions, end_offset = max(gen.partitions) + 1, len(gen.messages)
    await create_topics(eng.kafka, {spans_topic: partitions})
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_REPRO_")} | env
    logs = [log.with_suffix(f".{i}.log") for i in range(replicas)]
    admin = AIOKafkaAdminClient(bootstrap_servers=eng.kafka)
    await admin.start()
    procs: list[asyncio.subprocess.Process] = []
    try:
        for path in logs:
            child_env = base | {"TRACE_REPRO_HTTP__PORT": str(free_port())}
            with path.open("wb") as out:
                procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "streamer.cli", "run", "--workers", str(workers), env=child_env, cwd=REPO,
                    stdout=out, stderr=asyncio.subprocess.STDOUT))  # fmt: skip
        trees = [DaemonTree(p.pid) for p in procs]

        def alive() -> None:
            for proc, path in zip(procs, logs, strict=True):
                if proc.returncode is not None:
                    raise RuntimeError(f"a daemon exited with {proc.returncode}; see {path}")

        deadline = time.monotonic() + 120
        while not settled(logs, spans_topic, partitions, replicas * workers):
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the group did not settle: {[assignments(p, spans_topic) for p in logs]}")
            await asyncio.sleep(0.1)
        for tree in trees:
            tree.sample()
        cpu_from = {n: proc_cpu_s(p) for n, p in eng.pids.items()} | {"daemons": sum(t.cpu() for t in trees)}
        begin = time.time()
        await bench_produce(eng, spans_topic, gen)
        deadline = time.monotonic() + 120 + gen.spans / 2_000
        committed = traces = 0
        while True:
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"committed {committed}/{end_offset}, {traces}/{expected_traces} traces; see {log}")
            for tree in trees:
                tree.sample()
            committed = await group_committed(admin, group, spans_topic)
            if committed >= end_offset:
                traces = node_count(eng.falkordb, graph, "Trace")
                if traces >= expected_traces:
                    break
            await asyncio.sleep(0.2)
        done = time.time()
        for tree in trees:
            tree.sample()
        after = {n: proc_cpu_s(p) for n, p in eng.pids.items()} | {"daemons": sum(t.cpu() for t in trees)}
        rebalanced = not settled(logs, spans_topic, partitions, replicas * workers)
    finally:
        for proc in procs:
            await terminate(proc, 30)
        await admin.close()
    cpu_s = (after["daemons"] or 0.0) - (cpu_from["daemons"] or 0.0)
    seconds = done - begin
    return {
        "replicas": replicas,
        "workers": workers,
        "processes": sum(t.processes for t in trees),
        "spans": gen.spans,
        "seconds": seconds,
        "spans_per_s": rate(gen.spans, seconds),
        "cpu_us_per_span": cpu_s / gen.spans * 1e6,
        "cpu_cores": cpu_deltas(cpu_from, after, done - begin),
        "rebalanced_during_run": rebalanced,
        "traces": traces,
        "expected_traces": expected_traces,
    }


async def _end_to_end(gen: Generated, expected: int, ks: Sequence[int], rounds: int, tag: str) -> list[dict[str, Any]]:
    """Every way of running the daemon, ``rounds`` times over, alternated (one round's runs, then the next's)."""
    out: list[dict[str, Any]] = []
    with engines() as eng:
        runs = [(1, 1)] + [(1, k) for k in ks if k > 1] + [(k, 1) for k in ks if k > 1]
        try:
            for i, (replicas, workers) in enumerate(runs * rounds):
                name = "one process" if replicas == workers == 1 else (
                    f"--workers {workers}" if replicas == 1 else f"{replicas} replicas")  # fmt: skip
                phase(f"end to end: {name}")
                env = settings_env(eng.kafka, eng.falkordb, f"{tag}r{i}", f"bench-spans-{tag}r{i}")
                result = await daemons_end_to_end(eng, env, gen, expected, replicas=replicas, workers=workers,
                                                  log=OUT / f"scale-{i}.log")  # fmt: skip
                out.append({"run": name, "round": i // len(runs) + 1, **result})
                print("   " + _line(out[-1], out[i - i % len(runs)]), flush=True)
                if not eng.private:
                    delete_graph(eng.falkordb, config.load(None, env=env).graph_name)
        finally:
            if not eng.private:
                await delete_topics(eng.kafka, tag)
    return out


def _line(r: dict[str, Any], one: dict[str, Any]) -> str:
    """One run's figures; its speedup over ``one``, the one-process run of its round."""
    speedup = r["spans_per_s"] / one["spans_per_s"] if one["spans_per_s"] else 0.0
    cores = ", ".join(f"{n} {c:.2f}" for n, c in r["cpu_cores"].items())
    return (f"{r['run']}: {r['spans_per_s']:,.0f} spans/s ({speedup:.2f}x one process), {r['cpu_us_per_span']:.1f} "
            f"CPU us/span over {r['processes']} processes; cores: {cores}; "
            f"traces {r['traces']}/{r['expected_traces']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--spans", type=int, default=200_000, help="spans to generate (default 200000)")
    ap.add_argument("--partitions", type=int, default=4, help="spans topic partitions (default 4)")
    ap.add_argument("--processes", default="", help="process counts to try, e.g. 1,2 (default: 1 to the cores)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the stage phase, alternated (default 3)")
    ap.add_argument("--e2e-rounds", type=int, default=2, help="rounds of the end-to-end runs, alternated (default 2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-engines", action="store_true", help="only stage 1 across processes")
    ap.add_argument("--json", type=Path, default=OUT / "scale.json", help="where to write the results")
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    ks = sorted(({int(k) for k in args.processes.split(",") if k} or set(range(1, cores + 1))) | {1})  # 1: the base
    collector.tune()
    tag = uuid.uuid4().hex[:8]
    settings = config.load(None, env=settings_env("127.0.0.1:9", "redis://127.0.0.1:9", tag, "bench-spans", 0, ()))
    gen = generate_run(args.spans, 300, args.seed, partitions=args.partitions)
    phase(f"stage 1 once in this process (warm-up; {gen.spans:,} spans, {args.partitions} partitions, {cores} cores)")
    _, figures = bench_stage(gen, settings)
    expected = figures["detailed_traces"]
    stage: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for k in ks:
            phase(f"stage 1 across {k} process(es), round {r + 1}")
            stage.append(stage_across(gen, settings, args.partitions, k) | {"round": r + 1})
    rates = {k: sorted(s["spans_per_s"] for s in stage if s["processes"] == k) for k in ks}
    medians = {k: v[len(v) // 2] for k, v in rates.items()}
    summary = {k: {"spans_per_s": medians[k], "efficiency": medians[k] / (k * medians[1]) if medians[1] else None,
                   "cpu_us_per_span": sorted(s["cpu_us_per_span"] for s in stage if s["processes"] == k)[
                       len(rates[k]) // 2]} for k in ks}  # fmt: skip
    for k, s in summary.items():
        print(f"   stage 1, {k} process(es): {s['spans_per_s']:,.0f} spans/s (median of {args.rounds}), efficiency "
              f"{s['efficiency']:.2f}, {s['cpu_us_per_span']:.1f} CPU us/span", flush=True)  # fmt: skip
    results: dict[str, Any] = {"spans": gen.spans, "partitions": args.partitions, "cores": cores,
                               "stage_runs": stage, "stage": summary}  # fmt: skip
    if not args.no_engines and end_offsets(gen):
        results["end_to_end"] = asyncio.run(
            _end_to_end(gen, expected, [k for k in ks if k <= cores], args.e2e_rounds, tag)
        )
    OUT.mkdir(exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, default=str))
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
