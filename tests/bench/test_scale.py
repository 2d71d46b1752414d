"""The scale-out bench: partitions dealt out to processes cover every message once, shares of a run assemble the
same traces as the whole run (a trace lives on one partition), the stage across processes sees every span, and
two daemon replicas in one consumer group bring every trace to the graph."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from bench import scale
from bench.otlp_gen import Generated, generate_run
from bench.run import Engines, run_stage, settings_env
from streamer import config


def _settings() -> config.Settings:
    return config.load(None, env=settings_env("127.0.0.1:9", "redis://127.0.0.1:9", "t", "bench-spans", 0, ()))


@pytest.mark.parametrize(("partitions", "k"), [(4, 1), (4, 2), (4, 3), (3, 2)])
def test_partitions_are_dealt_out_once_each(partitions: int, k: int) -> None:
    shares = scale.dealt(partitions, k)
    assert len(shares) == k and sorted(p for share in shares for p in share) == list(range(partitions))
    gen = generate_run(3_000, 300, 3, partitions=partitions)
    parts = [scale.partitions_of(gen, share) for share in shares]
    assert sum(len(p.messages) for p in parts) == len(gen.messages)
    assert sum(p.spans for p in parts) == gen.spans == sum(sum(p.span_counts) for p in parts)
    assert all(set(p.partitions) <= share for p, share in zip(parts, shares, strict=True))


@pytest.mark.parametrize("shape", ["bench", "collector"])
def test_shares_assemble_the_traces_of_the_whole_run(shape: str) -> None:
    gen = generate_run(6_000, 300, 5, partitions=4, shape=shape)
    settings = _settings()

    def traces(run: Generated) -> list[str]:
        batches, _ = run_stage(run, settings, keep=True)
        return [row["id"] for batch in batches for row in batch.traces]

    whole = traces(gen)
    shares = [traces(scale.partitions_of(gen, share)) for share in scale.dealt(4, 2)]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(whole) and whole


def test_the_stage_across_processes_sees_every_span() -> None:
    gen = generate_run(6_000, 300, 9, partitions=4)
    result = scale.stage_across(gen, _settings(), 4, 2)
    assert result["processes"] == 2 and result["spans"] == gen.spans and result["spans_per_s"] > 0


@pytest.mark.engines
async def test_two_replicas_in_one_group_bring_every_trace_to_the_graph(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    gen = generate_run(6_000, 300, 11, partitions=4)
    settings = _settings()
    batches, _ = run_stage(gen, settings, keep=True)
    expected = len({row["id"] for batch in batches for row in batch.traces})
    eng = Engines(kafka_bootstrap, falkordb_url, private=False)
    tag = uuid.uuid4().hex[:8]
    env = settings_env(kafka_bootstrap, falkordb_url, tag, f"spans-scale-{tag}")
    result = await scale.daemons_end_to_end(eng, env, gen, expected, replicas=2, workers=1, log=tmp_path / "d.log")
    assert result["traces"] == expected and result["processes"] == 2 and result["spans_per_s"] > 0
    assert not result["rebalanced_during_run"]  # the group settled before the produce and stayed so


def test_the_group_has_settled_when_each_consumer_owns_its_share_once(tmp_path: Path) -> None:
    """Read from the daemons' logs: each stage-1 consumer's latest assignment (a rebalance assigns anew)."""

    def assigned(stage: str, partitions: list[str], worker: int | None = None) -> str:
        event = {"stage": stage, "partitions": partitions, "event": "partitions.assigned", "level": "info"}
        return json.dumps(event | ({} if worker is None else {"worker": worker, "role": stage}))

    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("\n".join([assigned("ingest", ["s/0", "s/1", "s/2", "s/3", "other/0"]),
                            assigned("entities", ["acc/0", "acc/1"]), "not json"]) + "\n")  # fmt: skip
    assert scale.settled([a], "s", 4, 1) and not scale.settled([a, b], "s", 4, 2)
    b.write_text(assigned("ingest", ["s/1", "s/3"]) + "\n")  # b joined; a not yet rebalanced: s/1, s/3 twice
    assert not scale.settled([a, b], "s", 4, 2)
    with a.open("a") as f:
        f.write(assigned("ingest", ["s/0", "s/2"]) + "\n")
    assert scale.settled([a, b], "s", 4, 2) and not scale.settled([a, b], "s", 5, 2)
    workers = tmp_path / "w.log"  # one log, two workers of one supervisor
    workers.write_text(assigned("ingest", ["s/0", "s/2"], 0) + "\n" + assigned("ingest", ["s/1", "s/3"], 1) + "\n")
    assert scale.settled([workers], "s", 4, 2) and not scale.settled([workers], "s", 4, 3)
