"""The repro worker: for each new defect, prove it (RED), plan its repair, and prove the repair (GREEN).

It consumes ``trace-repro.incidents`` as a consumer group of its own (a sink, fed by ``SinkRunner``), so slow test
runs never hold the detectors back. For the first occurrence of each fingerprint it:

1. compiles a standalone pytest file from the incident (application level when the service's source is configured
   and its functions have call specs, else SQL level) and runs it against a scratch PostgreSQL: it must fail (RED);
2. compares the statements the run executed with production's: the first divergence, if any, means the repro is
   not faithful and proves nothing;
3. plans the repairs of every unprotected writer of the table the graph knows of, applies them to a copy of the
   source, and runs the same test against the copy: it must pass (GREEN);
4. records ``Repro``/``Repair`` nodes (each writer's lock mode before and after), writes the files (test, JUnit XML,
   Code Quality report) and publishes a ``ReproEvent`` on ``trace-repro.repros``.
"""

from __future__ import annotations

import asyncio
import importlib
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from processors.repair import apply, plan_repairs
from processors.repro import CallSpec, GeneratedTest, ReproError, compile_repro, first_divergence, run_repro
from sinks.falkordb_graph import GraphWriter
from sinks.repro_files import write_repro_files
from streamer.config import ReproConfig, Settings
from streamer.schemas import AccessInfo, IncidentEvent, OutputEvent, ReproEvent, RunInfo

log = structlog.get_logger("trace_repro.repro")

KNOWN = "MATCH (r:Repro)-[:PROVES]->(:Incident {fingerprint: $fp}) RETURN r.path LIMIT 1"
SITES = (
    "MATCH (s:Span)-[x:READ|WROTE]->(e:Entity) WHERE e.table = $table AND x.function <> '' "
    "RETURN DISTINCT x.function, x.file, s.statement, x.lock, s.service"
)
UPSERT = """
MERGE (i:Incident {fingerprint: $fp})
MERGE (r:Repro {path: $path})
SET r.status = $status, r.level = $level, r.faithful = $faithful, r.red = $red, r.green = $green
MERGE (r)-[:PROVES]->(i)
WITH i
UNWIND $repairs AS x
MERGE (p:Repair {key: x.key})
SET p.strategy = x.strategy, p.file = x.file, p.function = x.function, p.lock_before = x.lock_before,
    p.lock_after = x.lock_after, p.statement_before = x.statement_before, p.statement_after = x.statement_after
MERGE (p)-[:FIXES]->(i)
"""
GOVERNANCE = (
    "MATCH (p:Repair)-[:FIXES]->(:Incident {fingerprint: $fp}) "
    "RETURN p.function, p.lock_before, p.lock_after ORDER BY p.function"
)

Publish = Callable[[str, bytes, bytes], Awaitable[None]]


def _specs(path: str) -> dict[str, CallSpec]:
    if not path:
        return {}
    module, _, name = path.partition(":")
    specs: dict[str, CallSpec] = getattr(importlib.import_module(module), name or "CALL_SPECS")
    return specs


class ReproWorker:
    """A sink on the incidents topic; see the module docstring."""

    def __init__(self, settings: Settings, writer: GraphWriter, publish: Publish) -> None:
        self.config: ReproConfig = settings.repro
        self.settings = settings
        self.writer = writer
        self.publish = publish
        self.topic = settings.kafka.repros_topic
        self.dsn = self.config.dsn or settings.postgres_dsn
        self.call_specs = _specs(self.config.call_specs)
        self.schema_sql = Path(self.config.schema_sql).read_text() if self.config.schema_sql else None
        self.source_root = Path(self.config.source_root) if self.config.source_root else None
        self.out = Path(self.config.output_dir)
        self._queue: list[IncidentEvent] = []
        self._done: set[str] = set()
        self.proven = 0

    async def add(self, event: OutputEvent) -> None:
        queued = {q.fingerprint for q in self._queue}
        if isinstance(event, IncidentEvent) and event.fingerprint not in self._done | queued:
            self._queue.append(event)

    async def flush(self) -> None:
        while self._queue:
            incident = self._queue[0]
            if not await self.writer.query(KNOWN, {"fp": incident.fingerprint}):
                event = await asyncio.to_thread(self._prove, incident, await self._sites(incident.table))
                if event is not None:
                    await self.publish(self.topic, incident.fingerprint.encode(), event.model_dump_json().encode())
                    await self._record(event)
            self._done.add(incident.fingerprint)
            self._queue.pop(0)

    async def healthcheck(self) -> bool:
        return bool(self.dsn)

    async def close(self) -> None:
        self._queue.clear()

    async def _sites(self, table: str) -> list[AccessInfo]:
        rows = await self.writer.query(SITES, {"table": table})
        return [
            AccessInfo(trace_id="", span_id="", service=service or "", version="", function=function, file=file or "",
                       route="", operation="write", lock=lock or "none", statement=statement or "", params=[],
                       set_values={}, start_unix_ms=0.0, offset_ms=0.0, error=False, exception="", http_status=0)
            for function, file, statement, lock, service in rows
        ]  # fmt: skip

    def _level(self, incident: IncidentEvent) -> str:
        functions = {incident.culprit.function, incident.victim.function}
        if self.source_root is not None and functions <= set(self.call_specs):
            return "app"
        return "sql"

    def _prove(self, incident: IncidentEvent, sites: list[AccessInfo]) -> ReproEvent | None:
        """RED, divergence, plan, GREEN for one incident (blocking: runs in a worker thread)."""
        level = self._level(incident)
        invariants = self.settings.collisions.invariants.get(incident.table)
        root = str(self.source_root) if self.source_root else None
        try:
            test = compile_repro(incident, level=level, schema_sql=self.schema_sql, call_specs=self.call_specs,
                                 source_root=root, invariants=invariants)  # fmt: skip
        except ReproError as exc:
            log.warning("repro.not_compiled", fingerprint=incident.fingerprint, error=str(exc)[:300])
            return None
        work = self.out / "work" / test.fingerprint
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        red, executed = run_repro(test, dsn=self.dsn, workdir=work / "red", source_root=root, label="red")
        divergence = first_divergence(test.production_sequence, executed)
        green: RunInfo | None = None
        patch, repairs, rewrites = "", [], []
        if self.source_root is not None:
            plan = plan_repairs(incident, root=self.source_root, sites=sites,
                                invariants=self.settings.collisions.invariants,
                                source_map=self._source_map())  # fmt: skip
            patch, repairs, rewrites = plan.diff, plan.repairs, plan.sql_rewrites
            if plan.repairs and level == "app":
                green = self._green(test, plan, work)
        proven = divergence.faithful and red.status == "failed" and green is not None and green.status == "passed"
        files = write_repro_files(self.out, incident, test, {"red": red, **({"green": green} if green else {})})
        log.info("repro", fingerprint=incident.fingerprint, level=level, red=red.status,
                 green=green.status if green else None, faithful=divergence.faithful, proven=proven,
                 repairs=[f"{r.function}:{r.strategy}" for r in repairs])  # fmt: skip
        return ReproEvent(
            fingerprint=incident.fingerprint,
            occurrence=incident.occurrence,
            anomaly=incident.anomaly,
            level=level,
            test_path=str(files.test),
            test_source=test.source,
            red=red,
            green=green,
            patch=patch,
            repairs=repairs,
            sql_rewrites=rewrites,
            divergence=divergence,
            proven=proven,
        )

    def _green(self, test: GeneratedTest, plan: Any, work: Path) -> RunInfo:
        """The same test against a patched copy of the source."""
        assert self.source_root is not None
        patched = Path(tempfile.mkdtemp(prefix="repro-green-", dir=work))
        for part in self.config.copy_paths:
            shutil.copytree(self.source_root / part, patched / part,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
        apply(plan, patched)
        green, _ = run_repro(test, dsn=self.dsn, workdir=work / "green", source_root=str(patched), label="green")
        return green

    def _source_map(self) -> Mapping[str, Path]:
        return {prefix: Path(local) for prefix, local in self.config.source_map.items()}

    async def _record(self, event: ReproEvent) -> None:
        status = "proven" if event.proven else ("red" if event.red.status == "failed" else "unproven")
        repairs = [{"key": f"{event.fingerprint}|{r.file}|{r.function}|{r.statement_before}", **r.model_dump()}
                   for r in event.repairs]  # fmt: skip
        await self.writer.query(UPSERT, {"fp": event.fingerprint, "path": event.test_path, "status": status,
                                         "level": event.level, "faithful": event.divergence.faithful,
                                         "red": event.red.status,
                                         "green": event.green.status if event.green else "",
                                         "repairs": repairs})  # fmt: skip
        governance = await self.writer.query(GOVERNANCE, {"fp": event.fingerprint})
        log.info("repro.governance", fingerprint=event.fingerprint,
                 writers=[f"{f}: {before} -> {after}" for f, before, after in governance])  # fmt: skip
        self.proven += event.proven


__all__ = ["ReproWorker"]
