"""The bench's stage and FalkorDB-write phases on a small generated run against the real FalkorDB: the graph holds
exactly the Trace nodes and the Span nodes the stage's rows promise, so the bench's correctness checks pass."""

from __future__ import annotations

import uuid

import pytest

from bench.otlp_gen import generate_run
from bench.readings import delete_graph
from bench.run import Engines, bench_stage, bench_write, checks, settings_env
from streamer import config

pytestmark = pytest.mark.engines


async def test_the_written_graph_holds_the_stage_rows_traces_and_kept_spans(
    kafka_bootstrap: str, falkordb_url: str
) -> None:
    gen = generate_run(6_000, 300, 3, partitions=2)
    tag = uuid.uuid4().hex[:8]
    settings = config.load(None, env=settings_env(kafka_bootstrap, falkordb_url, tag, f"bench-spans-{tag}"))
    batches, stage = bench_stage(gen, settings)
    assert 0 < stage["detailed_traces"] < stage["span_nodes"] < gen.spans  # paths: some spans kept, not all
    graph = f"bench_test_{tag}"
    eng = Engines(kafka_bootstrap, falkordb_url, private=False)
    try:
        write = await bench_write(eng, graph, batches, gen.spans, settings, stage["detailed_traces"],
                                  stage["span_nodes"])  # fmt: skip
    finally:
        delete_graph(falkordb_url, graph)
    results = {"phases": {"stage": stage, "falkordb_write": write}}
    found = {c["check"].split(":")[1].strip(): c for c in checks(results)}
    assert set(found) == {"Trace nodes in the graph = the stage-only phase's traces",
                          "Span nodes in the graph = the kept spans of the stage-only phase's rows",
                          "no detector finding on the benign traffic"}  # fmt: skip
    assert all(c["ok"] for c in found.values()), found
    assert write["span_nodes"] == stage["span_nodes"]
