"""FalkorDB's CPU per span on the bench's graph writes, per upsert kind, with statement variants A/B in one run.

``python -m bench.graph_cpu --spans 300000 --rounds 2``: generates the bench's traffic (``bench.otlp_gen``), runs it
through a real ingest stage (``bench.run.run_stage``) keeping its GraphBatches, starts a private FalkorDB, then
replays the batches with ``GraphWriter.write`` into a fresh graph per variant and round (variants alternate). For
each it reads the server's CPU from ``/proc`` (all of it, and around each statement per upsert kind) and FalkorDB's
own execution time, and checks that every variant leaves the same graph (every node and edge with its properties).

A variant is a set of statements in place of the writer's (``before``: the trace upserts that merge every span, as
before issue 37; ``after``: the schema's, each span looked up in the statement; ``fresh``: the writer's own, which
asks the graph which of the traces and their access spans are there and creates the rest with ``traces.FRESH``;
``merged``: ``fresh`` with every Trace MERGEd, as before a new one was CREATEd; ``full``: ``merged`` with a span's
empty details stored as ``""`` and ``0``, as before they were sent as null; ``allids``: ``fresh`` with the read of
present spans naming every span, as before it named only the access spans; ``noend``: ``fresh`` without the
``Span.end`` index; ``parents``: ``fresh`` with each new span's parent not in its row looked up in the statement, as
before 2026-12-07, not left to ``ADOPT``), and its rows per statement (``fresh@4000``), and how many of the stage's
batches it writes as one (``fresh*4``: the statements of a runtime that wrote four polls' rows at once; its graph
may differ, as windowed rows of several polls then share a statement).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import falkordb

from bench.otlp_gen import generate_run
from bench.procfs import proc_cpu_s
from bench.run import OUT, run_stage, settings_env
from processors.model.graph import GraphBatch
from sinks.graph import GraphWriter
from sinks.graph.schema import traces
from streamer import config
from streamer.engines import Layout, LocalEngines
from streamer.runtime import collector

# The statements a variant writes in place of the writer's, by upsert kind: ``before`` as they were before issue 37.
VARIANTS: dict[str, dict[str, str]] = {"before": dict(traces.MERGING), "after": {}, "fresh": {}, "merged": {},
                                       "full": {}, "noend": {}, "allids": {}, "parents": {}}  # fmt: skip
# The statements of new spans (FRESH, CREATED) as they were before 2026-12-07 (``parents``): every span with a
# parent is looked up again, its parent by its place in the row or (not there) by its id, and each edge or wait set
# in a FOREACH.
_NEW_TAIL = ", awaiting_parent: p[1]})-[:OF]->(t) "
_OLD_TAIL = (
    "})-[:OF]->(t) WITH r[10] AS row, collect(s) AS made, collect([p[1], p[16]]) AS ps "
    "UNWIND range(0, size(made) - 1) AS i WITH made, made[i] AS s, ps[i] AS k "
    "WHERE k[0] IS NOT NULL OR k[1] >= 0 OPTIONAL MATCH (g:Span {id: k[0]}) "
    "WITH s, k[0] AS parent, CASE WHEN k[1] >= 0 THEN made[k[1]] ELSE g END AS q "
    "FOREACH (_ IN CASE WHEN q IS NULL THEN [1] ELSE [] END | SET s.awaiting_parent = parent) "
    "FOREACH (_ IN CASE WHEN q IS NOT NULL THEN [1] ELSE [] END | CREATE (s)-[:CHILD_OF]->(q))"
)


def _parents_looked_up(statement: str) -> str:
    """A FRESH or CREATED statement as it was before 2026-12-07 (``parents``)."""
    head, tail, _ = statement.partition(_NEW_TAIL)
    if not tail:
        raise ValueError("not a statement of new spans as the schema writes it now")
    return head + _OLD_TAIL


REPLACED = {"parents": {s: _parents_looked_up(s) for s in (traces.CREATED, *traces.FRESH.values())}}
# Variants whose graph lacks one of the schema's indexes (dropped after the bootstrap): ``noend``, no ``Span.end``.
DROPPED = {"noend": (("Span", "end"),)}
# Variants whose rows store a span's empty details ("" and 0) as properties, as before they were sent as null: their
# graphs are compared with each other, the others' with each other (the two forms hold the same values otherwise).
FULL = {"before", "after", "full"}


class _Timed(GraphWriter):
    """A writer that notes, per upsert kind, statements, rows, wall time, the server's CPU and execution time."""

    def __init__(self, *args: Any, pid: int, statements: dict[str, str], replaced: dict[str, str],
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.pid = pid
        self.statements = statements
        self.replaced = replaced  # statements the writer runs itself (trace_writes), by their text
        self.kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    async def write_rows(self, name: str, statement: str, rows: Any, dead: Any = None, results: Any = None) -> int:
        return await super().write_rows(name, self.statements.get(name, statement), rows, dead, results)

    async def _statement(self, name: str, statement: str, rows: list[Any], results: Any, *, shrinkable: bool) -> None:
        statement = self.replaced.get(statement, statement)
        graph = self._graph
        cpu0, wall0 = proc_cpu_s(self.pid) or 0.0, time.perf_counter()
        run_ms: list[float] = []
        if graph is not None:
            query = graph.query

            async def timed(*a: Any, **k: Any) -> Any:
                result = await query(*a, **k)
                run_ms.append(float(result.run_time_ms))
                return result

            graph.query = timed
        try:
            await super()._statement(name, statement, rows, results, shrinkable=shrinkable)
        finally:
            if graph is not None:
                del graph.query
        k = self.kinds[name]
        k["statements"] += 1
        k["rows"] += len(rows)
        k["wall_s"] += time.perf_counter() - wall0
        k["server_cpu_s"] += (proc_cpu_s(self.pid) or 0.0) - cpu0
        k["run_ms"] += sum(run_ms)


def _client(url: str) -> Any:
    host, port = url.removeprefix("redis://").rsplit(":", 1)
    return falkordb.FalkorDB(host=host, port=int(port))


_KEY = "coalesce({n}.id, {n}.key, {n}.name, {n}.fingerprint, {n}.path, {n}.signature)"


def fingerprint(url: str, graph: str) -> dict[str, Any]:
    """A digest of every node (labels, properties) and edge (its ends' keys, type, properties), and the counts."""
    g = _client(url).select_graph(graph)
    nodes = g.query("MATCH (n) RETURN labels(n), properties(n)").result_set
    edges = g.query(
        f"MATCH (n)-[x]->(m) RETURN {_KEY.format(n='n')}, type(x), properties(x), {_KEY.format(n='m')}"
    ).result_set
    digest = hashlib.sha256()
    for part in (nodes, edges):
        for line in sorted(json.dumps(row, sort_keys=True, default=str) for row in part):
            digest.update(line.encode())
    return {"nodes": len(nodes), "edges": len(edges), "sha256": digest.hexdigest()[:16]}


async def replay(url: str, pid: int, graph: str, batches: list[GraphBatch], variant: str, rows: int) -> dict[str, Any]:
    writer = _Timed(url, graph, batch_rows=rows, pid=pid, statements=VARIANTS[variant],
                    replaced=REPLACED.get(variant, {}))  # fmt: skip
    writer.create_fresh = variant in ("fresh", "full", "merged", "noend", "allids", "parents")
    writer.create_traces = variant in ("fresh", "noend", "allids", "parents")
    writer.present_every_span = variant in ("before", "after", "full", "merged", "allids")
    writer.empty_details = variant in FULL
    await writer.bootstrap()
    for label, prop in DROPPED.get(variant, ()):
        await writer.query(f"DROP INDEX FOR (n:{label}) ON (n.{prop})")
    cpu0, wall0 = proc_cpu_s(pid) or 0.0, time.perf_counter()
    for batch in batches:
        await writer.write(batch)
    seconds = time.perf_counter() - wall0
    cpu = (proc_cpu_s(pid) or 0.0) - cpu0
    await writer.close()
    return {"variant": variant, "batch_rows": rows, "seconds": seconds, "server_cpu_s": cpu,
            "kinds": {k: dict(v) for k, v in writer.kinds.items()}}  # fmt: skip


def _merged(batches: list[GraphBatch], n: int) -> list[GraphBatch]:
    """Every ``n`` consecutive batches as one."""
    out = []
    for start in range(0, len(batches), n):
        merged = GraphBatch()
        for batch in batches[start : start + n]:
            merged.extend(batch)
        out.append(merged)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.graph_cpu", description=__doc__)
    ap.add_argument("--spans", type=int, default=300_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variants", default="before,after,fresh",
                    help="before, after, fresh, merged, full, noend, allids, parents, fresh@ROWS")  # fmt: skip
    ap.add_argument("--no-check", action="store_true", help="skip the comparison of the graphs' content")
    ap.add_argument("--json", type=Path, default=OUT / "graph_cpu.json")
    args = ap.parse_args(argv)
    collector.tune()
    tag = uuid.uuid4().hex[:8]
    gen = generate_run(args.spans, 300, args.seed, partitions=2)
    settings = config.load(None, env=settings_env("127.0.0.1:9", "redis://127.0.0.1:9", tag, f"bench-spans-{tag}"))
    batches, _ = run_stage(gen, settings, keep=True)
    print(f"{gen.spans:,} spans, {sum(len(b) for b in batches):,} graph rows in {len(batches)} batches", flush=True)
    default = Layout.default()
    run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-graphcpu-"))
    local = LocalEngines(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir))
    runs: list[dict[str, Any]] = []
    try:
        state = local.up(["falkordb"])["falkordb"]
        url = local.address("falkordb")
        for rnd in range(args.rounds):
            for spec in args.variants.split(","):
                spec_rows, _, merged = spec.partition("*")
                variant, _, rows = spec_rows.partition("@")
                graph = f"graphcpu_{variant}_{rnd}"
                run = asyncio.run(replay(url, state.pid, graph, _merged(batches, int(merged or 1)), variant,
                                         int(rows or settings.falkordb.batch_rows)))  # fmt: skip
                if not args.no_check:
                    run["graph"] = fingerprint(url, graph)
                _client(url).select_graph(graph).delete()
                run["server_cpu_us_per_span"] = 1e6 * run["server_cpu_s"] / gen.spans
                runs.append(run)
                print(f"round {rnd} {spec}: server {run['server_cpu_us_per_span']:.1f} CPU µs/span, "
                      f"{run['seconds']:.1f} s, graph {run.get('graph')}", flush=True)  # fmt: skip
                for kind, k in sorted(run["kinds"].items(), key=lambda kv: -kv[1]["server_cpu_s"]):
                    print(f"   {kind:12} {int(k['statements']):5} stmts {int(k['rows']):7} rows  "
                          f"cpu {1e6 * k['server_cpu_s'] / gen.spans:6.2f} µs/span  "
                          f"exec {1e3 * k['run_ms'] / gen.spans:6.2f} µs/span", flush=True)  # fmt: skip
    finally:
        local.down()
    args.json.parent.mkdir(exist_ok=True)
    args.json.write_text(json.dumps({"spans": gen.spans, "runs": runs}, indent=2) + "\n")
    failed = 0
    for form in (True, False):  # the same graph from every variant (and round) of one stored form
        digests = {r["graph"]["sha256"] for r in runs if "graph" in r and (r["variant"] in FULL) == form}
        if len(digests) > 1:
            print(f"graphs DIFFER between variants ({'empty details stored' if form else 'null'}): {digests}")
            failed = 1
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
