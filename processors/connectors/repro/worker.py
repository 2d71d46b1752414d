"""The repro worker: for each new defect, prove it (RED), plan its repair, and prove the repair (GREEN).

It consumes ``trace-repro.incidents`` as a consumer group of its own (a sink, fed by ``SinkRunner``), so slow test
runs never hold the detectors back. For the first occurrence of each fingerprint it:

1. compiles a standalone pytest file from the incident (application level when the service's source is configured
   and each of its two functions has a call spec: derived from the spans and the source
   (:mod:`processors.repro.derive`) or written by hand in ``call_specs``, which overrides; else, or when that cannot
   be compiled, SQL level, with the reason logged) and runs it against a scratch PostgreSQL: it must fail (RED);
2. compares the statements the run executed with production's: the first divergence, if any, means the repro is
   not faithful and proves nothing;
3. plans the repairs of every unprotected writer of the table the graph knows of; at application level, applies
   them to a copy of the source and runs the same test against the copy (with the plan's schema migrations on the
   scratch database); at SQL level, runs the same incident with the repaired statements, the plan's isolation
   levels and migrations (when every repaired statement's values were recorded): it must pass (GREEN);
   before GREEN, a RED repro is reduced to the fewest statements and seed rows that still fail the same way
   (``[repro] reduce``, :mod:`processors.connectors.repro.reduction`): the reduced repro is shipped when the repair's
   GREEN holds on it, the full one kept beside it; the shipped file ends with its evidence packet, also written
   beside it as ``evidence.json`` (:mod:`processors.repro.evidence`);
4. records ``Repro``/``Repair`` nodes (each writer's lock mode before and after), writes the files (test, JUnit XML,
   Code Quality report) and publishes a ``ReproEvent`` on ``trace-repro.repros``.

Each run's scratch database and role are dropped whatever ends it (``processors.repro.runner``); before its first
repro the worker also drops those a killed daemon's runs left behind (``sweep_scratch``: older than a run can last).

An incident whose repro could not be compiled is tried again on a later occurrence of its fingerprint, up to
``max_attempts`` attempts in all; the attempts are remembered for at most ``max_tracked`` fingerprints (least
recently seen forgotten first, counted ``dropped_total{reason="max_tracked_fingerprints"}``), and an occurrence past
the bound is counted ``max_attempts``. The fingerprint names directories, so it is checked first (16 lowercase hex
digits, as the collision detector makes it: else dropped, ``invalid_fingerprint``), and every directory the worker
writes or deletes is resolved under ``output_dir`` (else refused, ``unsafe_path``, nothing written or deleted).
"""

from __future__ import annotations

import asyncio
import importlib
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from processors.api.component import GraphQueries, Publish
from processors.api.sink import Sink
from processors.api.telemetry import Telemetry
from processors.connectors.repro.config import ReproConfig
from processors.connectors.repro.green import sql_green, unavailable
from processors.connectors.repro.reduction import FULL_PREFIX, Shipped, packet_settings, reduce_red, ship
from processors.lib.invariants import compile_invariants
from processors.model.outputs import AccessInfo, IncidentEvent, Published, ReproEvent, RunInfo
from processors.redaction import redacted
from processors.repair import RepairPlan, apply, plan_repairs
from processors.repro import CallSpec, GeneratedTest, ReproError, compile_repro, first_divergence, run_repro
from processors.repro.ci_files import write_repro_files
from processors.repro.compiler import safe_name
from processors.repro.derive import derive_call_specs
from processors.repro.evidence import summary, write_sidecar
from processors.repro.paths import UnsafePath, under, valid_fingerprint
from processors.repro.reduce import Outcome
from processors.repro.runner import sweep_scratch
from processors.repro.subset import Keep
from processors.state import CountedLRU

log = structlog.get_logger("trace_repro.repro")
_OPERATIONS = {"select": "read", "insert": "insert", "update": "write", "delete": "delete"}
MAX_ATTEMPTS = 3  # attempts per fingerprint (the first occurrence's and later ones') while none compiles
MAX_TRACKED = 10_000  # fingerprints whose attempts are remembered
_FINAL = -1  # attempts of a fingerprint that is settled (a repro published, known, or refused): never tried again


def _specs(path: str) -> dict[str, CallSpec]:
    if not path:
        return {}
    module, _, name = path.partition(":")
    specs: dict[str, CallSpec] = getattr(importlib.import_module(module), name or "CALL_SPECS")
    return specs


class ReproWorker(Sink):
    """A sink-shaped connector on the incidents topic that publishes repros; see the module docstring."""

    name = "repro"

    def __init__(self, config: ReproConfig, *, graph: GraphQueries, publish: Publish, dsn: str,
                 invariants: Mapping[str, list[str]], telemetry: Telemetry | None = None,
                 max_attempts: int = MAX_ATTEMPTS, max_tracked: int = MAX_TRACKED,
                 detection: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.config = config
        self.graph = graph
        self.publish = publish
        self.invariants = dict(invariants)
        self.detection = dict(detection or {})  # the detection settings an evidence packet names (non-secret)
        compile_invariants(self.invariants)  # validated with [collisions]; fail early here too
        self.telemetry = (telemetry or Telemetry("repro")).declare("invalid_fingerprint", "unsafe_path", "max_attempts")
        self.dsn = config.dsn or dsn
        self.call_specs = _specs(self.config.call_specs)
        self.schema_sql = Path(self.config.schema_sql).read_text() if self.config.schema_sql else None
        self.source_root = Path(self.config.source_root) if self.config.source_root else None
        self.out = Path(self.config.output_dir)
        self.max_attempts = max_attempts
        self._queue: list[IncidentEvent] = []
        self._attempts: CountedLRU[str, int] = CountedLRU(max_tracked, self.telemetry, "max_tracked_fingerprints")
        self.proven = 0
        self._swept = False

    async def write(self, event: Published) -> None:
        if not isinstance(event, IncidentEvent):
            return
        if not valid_fingerprint(event.fingerprint):
            self.telemetry.drop("invalid_fingerprint")
            log.warning("repro.refused", reason="invalid_fingerprint", fingerprint=repr(event.fingerprint)[:80],
                        occurrence=repr(event.occurrence)[:80])  # fmt: skip
            return
        if any(q.fingerprint == event.fingerprint for q in self._queue):
            return
        attempts = self._attempts.peek(event.fingerprint) or 0
        if attempts == _FINAL:
            return
        if attempts >= self.max_attempts:
            self.telemetry.drop("max_attempts")
            return
        self._queue.append(event)

    async def flush(self) -> None:
        while self._queue:
            await self._attempt(self._queue[0])
            self._queue.pop(0)

    def attempts(self, fingerprint: str) -> int | None:
        """The attempts made for ``fingerprint`` (-1 once it is settled; None when not remembered)."""
        return self._attempts.peek(fingerprint)

    async def _attempt(self, incident: IncidentEvent) -> None:
        """One attempt at ``incident``'s repro, unless its fingerprint has one already."""
        fingerprint = incident.fingerprint
        if await self.graph.repro_known(fingerprint):
            self._attempts.put(fingerprint, _FINAL)
            return
        made = (self._attempts.get(fingerprint) or 0) + 1
        self._attempts.put(fingerprint, made)
        if not self._swept and self.dsn:  # scratch databases and roles a killed daemon's runs left behind
            self._swept = True
            await asyncio.to_thread(sweep_scratch, self.dsn)
        try:
            event = await asyncio.to_thread(self._prove, incident, await self._sites(incident.table))
        except UnsafePath as exc:
            self._attempts.put(fingerprint, _FINAL)
            self.telemetry.drop("unsafe_path")
            log.warning("repro.refused", reason="unsafe_path", fingerprint=fingerprint, error=str(exc)[:300])
            return
        if event is not None:
            await self.publish(event)
            await self._record(event)
            self._attempts.put(fingerprint, _FINAL)  # (a publish that failed leaves it at the head of the queue)
            self.telemetry.count("repros")
            return
        self.telemetry.count("not_compiled")
        if made < self.max_attempts:
            log.info("repro.retry_later", fingerprint=fingerprint, attempt=made, max_attempts=self.max_attempts)
        else:
            log.warning("repro.given_up", fingerprint=fingerprint, attempts=made)

    async def healthcheck(self) -> bool:
        return bool(self.dsn)

    async def close(self) -> None:
        self._queue.clear()

    async def _sites(self, table: str) -> list[AccessInfo]:
        rows = await self.graph.table_sites(table)
        return [
            AccessInfo(trace_id="", span_id="", service=service or "", version="", function=function, file=file or "",
                       route="", operation=_operation(statement or ""), lock=lock or "none",
                       statement=statement or "", params=[], set_values={}, start_unix_ms=0.0, offset_ms=0.0,
                       error=False, exception="", http_status=0)
            for function, file, statement, lock, service in rows
        ]  # fmt: skip

    def _level(self, incident: IncidentEvent) -> tuple[str, dict[str, CallSpec]]:
        """("app", the specs of its functions) when both can be called from the source root, else ("sql", {})."""
        functions = {a.function or a.route for a in (incident.culprit, incident.victim)}
        if self.source_root is None:
            return "sql", {}
        derived = derive_call_specs(incident, source_root=self.source_root, source_map=self._source_map(),
                                    invariants=self.invariants.get(incident.table))  # fmt: skip
        specs = {**derived.specs, **self.call_specs}  # a hand-written spec overrides the derived one
        if functions <= set(specs):
            return "app", {f: specs[f] for f in functions}
        default = derived.reasons.get("", "no call spec")
        reasons = {f: derived.reasons.get(f, default) for f in sorted(functions - set(specs))}
        log.info("repro.sql_level", fingerprint=incident.fingerprint, reasons=reasons)
        return "sql", {}

    def _compile(self, incident: IncidentEvent, level: str, specs: Mapping[str, CallSpec],
                 migrations: list[str] | None = None, keep: Keep | None = None,
                 evidence: Mapping[str, Any] | None = None) -> GeneratedTest:  # fmt: skip
        root = str(self.source_root) if self.source_root else None
        return compile_repro(incident, level=level, schema_sql=self.schema_sql, call_specs=specs, source_root=root,
                             invariants=self.invariants.get(incident.table), migrations=migrations or (), keep=keep,
                             evidence=evidence)  # fmt: skip

    def _prove(self, incident: IncidentEvent, sites: list[AccessInfo]) -> ReproEvent | None:
        """RED, divergence, plan, GREEN for one incident (blocking: runs in a worker thread); raises UnsafePath,
        before anything is written or deleted, when its directories would resolve outside the output directory."""
        work = under(self.out, "work", incident.fingerprint)
        under(self.out, "repros", safe_name(incident.fingerprint))
        level, specs = self._level(incident)
        root = str(self.source_root) if self.source_root else None
        try:
            test = self._compile(incident, level, specs)
        except ReproError as exc:
            if level == "sql":
                log.warning("repro.not_compiled", fingerprint=incident.fingerprint, error=str(exc)[:300])
                return None
            log.warning("repro.app_level_not_compiled", fingerprint=incident.fingerprint, error=str(exc)[:300])
            level = "sql"
            try:
                test = self._compile(incident, level, specs)
            except ReproError as again:
                log.warning("repro.not_compiled", fingerprint=incident.fingerprint, error=str(again)[:300])
                return None
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        red, executed = run_repro(
            test,
            dsn=self.dsn,
            workdir=work / "red",
            source_root=root,
            label="red",
            statement_timeout_ms=self.config.statement_timeout_ms,
        )
        divergence = first_divergence(test.production_sequence, executed)
        patch, repairs, rewrites = "", [], []
        plan: RepairPlan | None = None
        if self.source_root is not None:
            plan = plan_repairs(incident, root=self.source_root, sites=sites,
                                invariants=self.invariants,
                                source_map=self._source_map())  # fmt: skip
            patch, repairs, rewrites = plan.diff, plan.repairs, plan.sql_rewrites
        shipped = self._reduce_and_green(incident, level, specs, test, Outcome(red, divergence), plan, work)
        red, divergence, green = shipped.outcome.red, shipped.outcome.divergence, shipped.green
        full = shipped.full
        test = self._compile(incident, level, specs, keep=shipped.keep, evidence=shipped.evidence)
        proven = divergence.faithful and red.status == "failed" and green is not None and green.status == "passed"
        files = write_repro_files(self.out, incident, test, {"red": red, **({"green": green} if green else {})})
        write_sidecar(self.out, files.directory, shipped.evidence, full.source if full else None,
                      FULL_PREFIX + full.name if full else "")  # fmt: skip
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
            redacted=redacted(incident),
            evidence=summary(shipped.evidence),
        )

    def _green(self, incident: IncidentEvent, test: GeneratedTest, plan: RepairPlan, work: Path,
               specs: Mapping[str, CallSpec], keep: Keep | None = None) -> RunInfo:  # fmt: skip
        """The same test against a patched copy of the source (and the plan's schema migrations): ``copy_paths``, or
        else the top-level packages (or modules) the called functions are imported from."""
        assert self.source_root is not None
        patched = Path(tempfile.mkdtemp(prefix="repro-green-", dir=work))
        if keep is not None:
            test = self._compile(incident, "app", specs, keep=keep)
        called = {spec.module_path.split("/", 1)[0] for spec in specs.values()}
        for part in self.config.copy_paths or sorted(called):
            source = self.source_root / part
            if source.is_dir():
                shutil.copytree(source, patched / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(source, patched / part)
        # A file the plan creates (a migration) stays out: its schema change runs as SQL, and its directory may not
        # be in the copy.
        apply(replace(plan, files=[f for f in plan.files if f.before is not None]), patched)
        if plan.migrations:  # the same test, on a scratch database with the repair's schema change
            test = self._compile(incident, "app", specs, plan.migrations, keep=keep)
        green, _ = run_repro(
            test,
            dsn=self.dsn,
            workdir=work / "green",
            source_root=str(patched),
            label="green",
            statement_timeout_ms=self.config.statement_timeout_ms,
        )
        return green

    def _sql_green(self, incident: IncidentEvent, plan: RepairPlan, work: Path,
                   keep: Keep | None = None) -> RunInfo | None:  # fmt: skip
        """The incident replayed with the repaired statements, isolation levels and migrations (None: the plan has
        no SQL-level form)."""
        repaired = sql_green(incident, plan)
        if repaired is None:
            log.warning("repro.no_sql_green", fingerprint=incident.fingerprint, strategy=plan.strategy,
                        reason=unavailable(plan))  # fmt: skip
            return None
        try:
            test = compile_repro(repaired.incident, level="sql", schema_sql=self.schema_sql,
                                 invariants=self.invariants.get(incident.table),
                                 session_isolation=repaired.session_isolation,
                                 migrations=repaired.migrations, keep=keep)  # fmt: skip
        except ReproError as exc:
            log.warning("repro.green_not_compiled", fingerprint=incident.fingerprint, error=str(exc)[:300])
            return None
        green, _ = run_repro(
            test,
            dsn=self.dsn,
            workdir=work / "green",
            label="green",
            statement_timeout_ms=self.config.statement_timeout_ms,
        )
        return green

    def _reduce_and_green(
        self,
        incident: IncidentEvent,
        level: str,
        specs: Mapping[str, CallSpec],
        full: GeneratedTest,
        reference: Outcome,
        plan: RepairPlan | None,
        work: Path,
    ) -> Shipped:
        """The RED repro reduced (:func:`~processors.connectors.repro.reduction.reduce_red`), the GREEN run of
        what is shipped, and its evidence packet (:func:`~processors.connectors.repro.reduction.ship`)."""
        root = str(self.source_root) if self.source_root else None

        def run(test: GeneratedTest, label: str) -> Outcome:
            info, executed = run_repro(test, dsn=self.dsn, workdir=work / label, source_root=root, label=label,
                                       statement_timeout_ms=self.config.statement_timeout_ms)  # fmt: skip
            return Outcome(info, first_divergence(test.production_sequence, executed))

        def green(keep: Keep) -> RunInfo | None:
            if plan is None or not plan.repairs:
                return None
            where = work if keep == Keep() else work / "reduced"  # (each leaves ``green/`` and its repaired copy)
            where.mkdir(parents=True, exist_ok=True)
            if level == "app":
                return self._green(incident, full, plan, where, specs, keep)
            return self._sql_green(incident, plan, where, keep)

        reduced = reduce_red(self.config, incident, full, reference, level=level, plan=plan, telemetry=self.telemetry,
                             make=lambda keep: self._compile(incident, level, specs, keep=keep), run=run)  # fmt: skip
        settings = packet_settings(self.config, self.detection, self.invariants.get(incident.table, []))
        return ship(
            self.config, incident, full, reference, reduced, level=level, green=green, dsn=self.dsn, settings=settings
        )

    def _source_map(self) -> Mapping[str, Path]:
        return {prefix: Path(local) for prefix, local in self.config.source_map.items()}

    async def _record(self, event: ReproEvent) -> None:
        governance = await self.graph.record_repro(event)
        log.info("repro.governance", fingerprint=event.fingerprint,
                 writers=[f"{f}: {before} -> {after}" for f, before, after in governance])  # fmt: skip
        self.proven += event.proven


def _operation(statement: str) -> str:
    """What a statement the graph knows does, by its first keyword (``write`` when it cannot be told)."""
    words = statement.lstrip(" \t\r\n(").split(None, 1)
    return _OPERATIONS.get(words[0].lower() if words else "", "write")


__all__ = ["ReproWorker"]
