"""Reduction and the evidence packet through the repro worker, on the real scratch PostgreSQL: the corpus's read skew
(``tests/corpus/fixtures/read_skew.jsonl``, the daemon's default configuration) padded with irrelevant statements and
seed rows is reduced back to the statements and rows that make it, still RED the same way (the same verdict and
first divergence as the full padded repro, run again beside it), and GREEN with the repair; the reduction's run
bound is honoured and counted; the shipped file and its ``evidence.json`` carry the same packet."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from processors.api.telemetry import Telemetry
from processors.connectors.repro.worker import ReproWorker
from processors.model.outputs import CommitInfo, IncidentEvent, Published, ReproEvent
from processors.repro import first_divergence, run_repro
from processors.repro.compiler import GeneratedTest
from processors.repro.evidence import SIDECAR
from tests.corpus.repros import Graph, first_bug, worker_config

pytestmark = pytest.mark.engines
SCENARIO = "read_skew"
PAD_ROWS = ({"acct": "pad-1", "balance": 7}, {"acct": "pad-2", "balance": 8})


def padded() -> IncidentEvent:
    """The read skew with two padding rows (a snapshot read of each, after the incident's changes) that the writer
    reads just before its first write."""
    _, incident = first_bug(SCENARIO)
    writer = next(a for a in sorted(incident.accesses, key=lambda a: a.start_unix_ms) if a.operation != "read")
    extra = [
        writer.model_copy(update={"statement": "SELECT acct FROM corpus_ledger WHERE acct = %s", "operation": "read",
                                  "params": [row["acct"]], "start_unix_ms": writer.start_unix_ms - 0.5 + n / 10,
                                  "offset_ms": writer.offset_ms - 0.5 + n / 10, "span_id": f"{n:016x}"})
        for n, row in enumerate(PAD_ROWS)
    ]  # fmt: skip
    last = max(incident.commits, key=lambda c: c.lsn)
    rows = [CommitInfo(lsn=last.lsn + 1 + j, tx_id="", commit_unix_ms=last.commit_unix_ms, offset_ms=last.offset_ms,
                       op="r", before=None, after=dict(row), trace_id="", span_id="", correlation="none",
                       skew_ms=None) for j, row in enumerate(PAD_ROWS)]  # fmt: skip
    return incident.model_copy(update={"accesses": [*incident.accesses, *extra], "commits": [*incident.commits, *rows]})


async def prove(incident: IncidentEvent, dsn: str, out: Path, telemetry: Telemetry, **config: Any) -> ReproEvent:
    settings = worker_config(SCENARIO, out).model_copy(update=config)
    published: list[Published] = []

    async def publish(event: Published) -> None:
        published.append(event)

    worker = ReproWorker(settings, graph=Graph(SCENARIO), publish=publish, dsn=dsn,  # type: ignore[arg-type]
                         invariants={}, telemetry=telemetry, detection={"window_s": 2.0, "skew_ms": 5.0})  # fmt: skip
    await worker.write(incident)
    await worker.flush()
    [event] = published
    assert isinstance(event, ReproEvent)
    return event


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _data(source: str) -> dict[str, Any]:
    return {n.target.id: ast.literal_eval(n.value) for n in ast.parse(source).body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None}  # fmt: skip


async def test_a_padded_incident_is_reduced_to_what_makes_it_still_red_the_same_way_and_green(
    postgres_dsn: str, tmp_path: Path
) -> None:
    """The two padding reads and the two padding rows go; what stays is the unpadded incident's schedule; the reduced
    repro fails with the full padded repro's verdict and first divergence (faithful), and the repair makes it pass.
    Its file and ``evidence.json`` hold one packet: versions, the scratch server's version, the recording as it
    was, and the removed statements and rows."""
    incident, telemetry = padded(), Telemetry("repro")
    event = await prove(incident, postgres_dsn, tmp_path, telemetry)
    reduction = event.evidence["reduction"]
    assert reduction["shipped"] == "reduced", reduction
    assert reduction["steps"] == {"full": 8, "kept": 6} and reduction["rows"] == {"full": 4, "kept": 2}
    assert [(s["statement"], s["params"]) for s in reduction["removed_steps"]] == [
        ("SELECT acct FROM corpus_ledger WHERE acct = %s", [row["acct"]]) for row in PAD_ROWS
    ]
    assert reduction["removed_rows"] == list(PAD_ROWS)
    assert reduction["stopped_by"] == "" and 0 < reduction["runs"] <= 24
    assert telemetry.events["reduction_runs"] == reduction["runs"]

    shipped = Path(event.test_path)
    data = _data(_text(shipped))
    _, unpadded = first_bug(SCENARIO)
    assert [(s["session"], s["kind"], s.get("recorded", s["sql"])) for s in data["STEPS"]] == [
        (s["session"], s["kind"], s.get("recorded", s["sql"])) for s in _data(_compiled(unpadded).source)["STEPS"]
    ]
    assert len(data["SEED"]) == 2

    # RED the same way as the full padded repro, run again here beside it; GREEN with the repair.
    full_source = _text(shipped.parent / reduction["full_test"])
    full = _compiled(incident)
    assert _data(full_source)["STEPS"] == _data(full.source)["STEPS"]
    red, executed = run_repro(full, dsn=postgres_dsn, workdir=tmp_path / "full", label="full")
    divergence = first_divergence(full.production_sequence, executed)
    assert (event.red.status, red.status) == ("failed", "failed")
    assert event.red.failure == red.failure
    assert event.divergence == divergence and divergence.faithful
    assert event.green is not None and event.green.status == "passed", event.green
    assert event.proven

    # The packet: in the file, beside it, and (without the recording) on the event.
    packet = json.loads(_text(shipped.parent / SIDECAR))
    assert data["EVIDENCE"] == packet
    with psycopg.connect(postgres_dsn) as conn:
        server = conn.execute("SHOW server_version").fetchone()
    assert server is not None and packet["postgresql"]["repro_server"] == server[0]
    assert packet["recorded"]["accesses"] == [a.model_dump(mode="json") for a in incident.accesses]
    assert packet["recorded"]["commits"] == [c.model_dump(mode="json") for c in incident.commits]
    assert packet["settings"]["collisions"] == {"window_s": 2.0, "skew_ms": 5.0, "invariants": []}
    assert {k: v for k, v in packet.items() if k != "recorded"} == event.evidence


async def test_the_run_bound_is_honoured_and_counted(postgres_dsn: str, tmp_path: Path) -> None:
    """With room for two candidates the search stops there, says so, counts it, and still ships a repro that
    fails RED and goes GREEN."""
    telemetry = Telemetry("repro")
    event = await prove(padded(), postgres_dsn, tmp_path, telemetry, reduce_max_runs=2)
    reduction = event.evidence["reduction"]
    assert (reduction["runs"], reduction["stopped_by"]) == (2, "max_runs")
    assert telemetry.events["reduction_runs"] == 2 and telemetry.events["reduction_stopped_max_runs"] == 1
    assert event.red.status == "failed" and event.green is not None and event.green.status == "passed"


def _compiled(incident: IncidentEvent) -> GeneratedTest:
    from bench.corpus.apps import SCENARIOS
    from processors.repro import compile_repro

    return compile_repro(incident, level="sql", schema_sql=SCENARIOS[SCENARIO].schema_sql)
