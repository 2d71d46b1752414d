"""The corpus's incidents as repros: each bug scenario's first bug round proven by the daemon's repro worker, and
control rounds compiled the same way, on a real PostgreSQL.

The incident is the one the replay (``tests.corpus.replay``, the daemon's default configuration) reports for the
scenario's first bug round. :func:`prove` hands it to the repro worker (``processors.connectors.repro.worker``) as
the daemon runs it with ``repro.source_root`` at this checkout and no call specs: a SQL-level repro on a scratch
database whose schema is the scenario's own DDL (``Scenario.schema_sql``), RED; the repairs planned from the
repository's code (the corpus apps, ``bench/corpus/apps``; paths recorded in another checkout are mapped onto this
one) with every code site stage 1 saw on the table standing in for the graph's (``TABLE_SITES``); GREEN from the
plan's SQL-level form (statement edits, migrations, isolation levels).

A control round has no incident: :func:`control_incident` builds the one its two requests would make, in the class
of the scenario's bug (``relative_updates``: a lost update, the class two writers of one row look like), from the
replay's accesses and credited row changes; it must not be RED. The write-skew controls cannot be compiled: the
doctor who stays on call is a row no request changed, so no row image seeds it on the scratch database.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path

from bench.corpus.apps import SCENARIOS
from bench.corpus.manifest import RoundRecord
from processors.connectors.repro.config import ReproConfig
from processors.connectors.repro.worker import ReproWorker
from processors.model.events import Access
from processors.model.outputs import AccessInfo, CommitInfo, IncidentEvent, Published, ReproEvent
from processors.repro import GeneratedTest, compile_repro
from tests.corpus.expectations import belongs
from tests.corpus.replay import Fixture, Replayed, recorded_scenarios, replay

REPO = Path(__file__).resolve().parents[2]
BUGS = [name for name in recorded_scenarios() if any(r.is_bug for r in Fixture.load(name).manifest.rounds)]
# The class a control round is compiled in: its scenario's bug's, else the class its writers look like.
CONTROL_CLASS = {"relative_updates": "lost_update"}
# The control kinds that compile (one round each): not the write-skew ones, see the module docstring.
CONTROLS = [("lost_update", "control:for_update"), ("lost_update", "control:atomic_update"),
            ("phantom", "control:unique_on_conflict"), ("read_skew", "control:one_statement"),
            ("invariant_violation", "control:conditional_update"),
            ("relative_updates", "control:two_decrements")]  # fmt: skip


@functools.cache
def fixture(scenario: str) -> Fixture:
    return Fixture.load(scenario)


@functools.cache
def replayed(scenario: str) -> Replayed:
    return replay(fixture(scenario))


def first_bug(scenario: str) -> tuple[RoundRecord, IncidentEvent]:
    """The scenario's first bug round and the one incident the replay reports for it."""
    rnd = next(r for r in fixture(scenario).manifest.rounds if r.is_bug)
    [found] = [i for i in replayed(scenario).incidents if belongs(i, rnd)]
    return rnd, IncidentEvent.model_validate(found)


def recorded_root(scenario: str) -> str:
    """The checkout the fixture was recorded in: the apps' recorded paths minus ``bench/corpus/...``."""
    files = {a.file for a in replayed(scenario).accesses if a.file}
    roots = {f[: f.rindex("/bench/corpus/")] for f in files if "/bench/corpus/" in f}
    if len(roots) != 1:
        raise ValueError(f"{scenario}: cannot tell the recorded checkout from {sorted(files)}")
    return roots.pop()


def rounds(scenario: str, kind: str) -> list[RoundRecord]:
    return [r for r in fixture(scenario).manifest.rounds if r.kind == kind]


# ---- the bug rounds, through the repro worker --------------------------------------------------------------------


def table_sites(scenario: str, table: str) -> list[tuple[str, str, str, str, str]]:
    """The code sites on ``table`` the graph would hold after the fixture (its ``TABLE_SITES``: function, file,
    statement, lock, service), from every access stage 1 produced."""
    return sorted({(a.function, a.file, a.statement, a.lock.value, a.service)
                   for a in replayed(scenario).accesses if a.table == table and a.function})  # fmt: skip


def site_infos(scenario: str, table: str) -> list[AccessInfo]:
    """The same sites as the worker hands them to the planner (no trace, no parameters)."""
    operation = {(a.function, a.statement): a.operation.value for a in replayed(scenario).accesses}
    return [AccessInfo(trace_id="", span_id="", service=service, version="", function=function, file=file, route="",
                       operation=operation[(function, statement)], lock=lock, statement=statement, params=[],
                       set_values={}, start_unix_ms=0.0, offset_ms=0.0, error=False, exception="", http_status=0)
            for function, file, statement, lock, service in table_sites(scenario, table)]  # fmt: skip


class Graph:
    """What the worker asks the graph: nothing is proven yet; the code sites on a table are the fixture's."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario

    async def repro_known(self, fingerprint: str) -> bool:
        return False

    async def table_sites(self, table: str) -> list[tuple[str, str, str, str, str]]:
        return table_sites(self.scenario, table)

    async def record_repro(self, event: Published) -> list[tuple[str, str, str]]:
        return []


def worker_config(scenario: str, out: Path) -> ReproConfig:
    """``[repro]`` as the daemon would run it on the corpus: source root this checkout (recorded paths mapped onto
    it), the scenario's DDL as the scratch databases' schema, no call specs; writes the DDL under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    schema = out / "schema.sql"
    schema.write_text(SCENARIOS[scenario].schema_sql, encoding="utf-8")
    return ReproConfig(enabled=True, source_root=str(REPO), source_map={recorded_root(scenario): str(REPO)},
                       schema_sql=str(schema), output_dir=str(out / "repros"))  # fmt: skip


async def prove(scenario: str, dsn: str, out: Path) -> ReproEvent:
    """The scenario's first bug incident through the repro worker; see the module docstring."""
    _, incident = first_bug(scenario)
    settings = worker_config(scenario, out)
    published: list[Published] = []

    async def publish(event: Published) -> None:
        published.append(event)

    worker = ReproWorker(settings, graph=Graph(scenario), publish=publish,  # type: ignore[arg-type]
                         dsn=dsn, invariants={})  # fmt: skip
    await worker.write(incident)
    await worker.flush()
    [event] = published
    assert isinstance(event, ReproEvent)
    return event


async def prove_all(scenarios: Sequence[str], dsn: str, out: Path) -> dict[str, ReproEvent]:
    """:func:`prove` for each scenario, one after the other, as the worker takes its queue: a worker compiles in a
    thread, and Python 3.11's ``ast`` is not safe to use from two threads at once (``AST constructor recursion depth
    mismatch``)."""
    return {name: await prove(name, dsn, out / name) for name in scenarios}


# ---- the control rounds -------------------------------------------------------------------------------------------


def _info(a: Access, origin_ns: int) -> AccessInfo:
    return AccessInfo(trace_id=a.trace_id, span_id=a.span_id, service=a.service, version=a.version,
                      function=a.function, file=a.file, route=a.route, operation=a.operation.value,
                      lock=a.lock.value, statement=a.statement, params=list(a.params),
                      set_values=dict(a.set_values), start_unix_ms=a.start_ns / 1e6,
                      offset_ms=round((a.start_ns - origin_ns) / 1e6, 3), error=a.error or a.trace_error,
                      exception=a.trace_exception, http_status=a.trace_status, entity=a.entity)  # fmt: skip


def _image(text: str | None) -> dict[str, object] | None:
    return json.loads(text) if text else None


def control_incident(scenario: str, rnd: RoundRecord) -> IncidentEvent:
    """The incident a control round's two requests would make, in ``CONTROL_CLASS``: their accesses, the row
    changes the replay credited to them, the leader as culprit (its last write) and the follower as victim."""
    result = replayed(scenario)
    accesses = sorted((a for a in result.accesses if a.trace_id in rnd.traces), key=lambda a: a.start_ns)
    role = {r.role: r.trace_id for r in rnd.requests}

    def last(trace: str) -> Access:
        mine = [a for a in accesses if a.trace_id == trace]
        return next((a for a in reversed(mine) if a.operation.value != "read"), mine[-1])

    culprit, victim = last(role["leader"]), last(role["follower"])
    origin = culprit.start_ns
    lsns = {c.lsn for c in rnd.changes}
    traces = result.trace_of_span()
    commits = [
        CommitInfo(
            lsn=c["lsn"],
            tx_id=c["tx"],
            commit_unix_ms=int(c["commit_ms"]),
            offset_ms=round(c["commit_ms"] - origin / 1e6, 3),
            op=c["op"],
            before=_image(c["before"]),
            after=_image(c["after"]),
            trace_id=traces.get(c["span"], ""),
            span_id=c["span"] or "",
            correlation=c["strength"],
            skew_ms=c["skew_ms"],
        )
        for c in result.changes
        if c["lsn"] in lsns
    ]
    anomaly = CONTROL_CLASS.get(scenario, scenario)
    rows = list(rnd.rows)
    return IncidentEvent(
        fingerprint=f"control-{scenario}-{rnd.number}",
        occurrence=f"control-{scenario}-{rnd.number}",
        anomaly=anomaly,
        severity="low",
        manifest=False,
        entity=rows[0],
        entities=rows,
        table=culprit.table,
        window_ms=0.0,
        summary=f"control round {rnd.number} ({rnd.kind}) of {scenario}",
        damage="",
        confidence=0.0,
        culprit=_info(culprit, origin),
        victim=_info(victim, origin),
        writers=[_info(a, origin) for a in accesses if a.operation.value != "read"],
        accesses=[_info(a, origin) for a in accesses],
        commits=commits,
        evidence=[],
        detected_at_unix_ms=origin / 1e6,
    )


def compile_control(scenario: str, kind: str) -> tuple[RoundRecord, GeneratedTest]:
    """The first round of a control ``kind``, compiled like a bug incident (SQL level, the scenario's schema)."""
    rnd = rounds(scenario, kind)[0]
    return rnd, compile_repro(control_incident(scenario, rnd), level="sql", schema_sql=SCENARIOS[scenario].schema_sql)
