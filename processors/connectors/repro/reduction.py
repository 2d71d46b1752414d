"""The repro worker's reduction and evidence steps: the RED repro reduced, the GREEN run on what is shipped, and the
evidence packet written into the shipped file and beside it.

:func:`reduce_red` runs the delta debugging of :mod:`processors.repro.reduce` (SQL level: statements and seed rows;
application level: seed rows only, since the called code issues its own statements) with the statements the repair
edits kept, within ``[repro]``'s bounds. :func:`ship` decides what is shipped: the reduced repro when the repair's
GREEN holds on it (or there is no GREEN), else the full repro, whose GREEN is then run (and the packet says why).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from processors.api.telemetry import Telemetry
from processors.connectors.repro.config import ReproConfig
from processors.model.outputs import IncidentEvent, RunInfo
from processors.repair import RepairPlan
from processors.repro import GeneratedTest
from processors.repro.evidence import packet, reduction_record, server_version
from processors.repro.reduce import Outcome, Reduced, reduce_repro
from processors.repro.subset import Keep, fixed_steps

log = structlog.get_logger("trace_repro.repro")
FULL_PREFIX = "full_"  # the full repro beside a reduced one: not a name pytest collects (``test_*.py``)


@dataclass(frozen=True, slots=True)
class Shipped:
    """The repro that is shipped (reduced or full), its runs, and its evidence packet."""

    keep: Keep
    outcome: Outcome
    green: RunInfo | None
    evidence: dict[str, Any]
    full: GeneratedTest | None  # the full repro, kept beside a reduced one


def packet_settings(config: ReproConfig, detection: Mapping[str, Any], invariants: list[str]) -> dict[str, Any]:
    """The settings an evidence packet names: detection's (window, settle, skew), the table's invariants, and the
    repro's own that shape a run; whether a schema or a source root is configured, never its path, DSN or secret."""
    repro = {"statement_timeout_ms": config.statement_timeout_ms,
             "schema_sql": "configured" if config.schema_sql else "derived from the rows",
             "source_root": "configured" if config.source_root else "none (SQL level only)"}  # fmt: skip
    return {"collisions": {**detection, "invariants": list(invariants)}, "repro": repro}


def reduce_red(config: ReproConfig, incident: IncidentEvent, full: GeneratedTest, reference: Outcome, *,
               level: str, plan: RepairPlan | None, make: Callable[[Keep], GeneratedTest],
               run: Callable[[GeneratedTest, str], Outcome], telemetry: Telemetry) -> Reduced:  # fmt: skip
    """``full`` reduced within ``config``'s bounds (nothing removed when reduction is off or it is not RED)."""
    fixed = fixed_steps(full.schedule, [e.before for e in plan.edits] if plan is not None else [])
    if not config.reduce:
        return Reduced(Keep(), full, reference, [], [], 0, "", sorted(fixed))
    reduced = reduce_repro(full.schedule, full, reference, make=make, run=run, fixed=fixed, steps=level == "sql",
                           max_runs=config.reduce_max_runs, max_seconds=config.reduce_max_s)  # fmt: skip
    telemetry.count("reduction_runs", reduced.runs)
    if reduced.stopped_by:
        telemetry.count(f"reduction_stopped_{reduced.stopped_by}")
    log.info("repro.reduced", fingerprint=incident.fingerprint, runs=reduced.runs, stopped_by=reduced.stopped_by,
             removed_steps=len(reduced.removed_steps), removed_rows=len(reduced.removed_rows))  # fmt: skip
    return reduced


def ship(config: ReproConfig, incident: IncidentEvent, full: GeneratedTest, reference: Outcome, reduced: Reduced, *,
         level: str, green: Callable[[Keep], RunInfo | None], dsn: str,
         settings: Mapping[str, Any]) -> Shipped:  # fmt: skip
    """The reduced repro with its GREEN run when the repair's GREEN holds on it, else the full one; with the packet."""
    shrunk = bool(reduced.removed_steps or reduced.removed_rows)
    keep, outcome, why = reduced.keep, reduced.outcome, ""
    proof = green(keep)
    if shrunk and proof is not None and proof.status != "passed":
        full_proof = green(Keep())
        if full_proof is not None and full_proof.status == "passed":
            why = "the repair's GREEN run did not pass on the reduced repro; it passes on the full one"
            keep, outcome, proof, shrunk = Keep(), reference, full_proof, False
    if not config.reduce:
        why = "reduction is off ([repro] reduce)"
    elif reference.red.status != "failed":
        why = "the full repro did not fail RED: nothing to reduce"
    bounds = {"max_runs": config.reduce_max_runs, "max_s": config.reduce_max_s}
    record = reduction_record(
        full.schedule, enabled=config.reduce, removed_steps=reduced.removed_steps if shrunk else (),
        removed_rows=reduced.removed_rows if shrunk else (), fixed=reduced.fixed, runs=reduced.runs,
        stopped_by=reduced.stopped_by, shipped="reduced" if shrunk else "full", why=why, bounds=bounds,
        full_test=FULL_PREFIX + full.name if shrunk else "",
    )  # fmt: skip
    evidence = packet(incident, level=level, settings=settings, server=server_version(dsn), reduction=record)
    return Shipped(keep, outcome, proof, evidence, full if shrunk else None)


__all__ = ["FULL_PREFIX", "Shipped", "packet_settings", "reduce_red", "ship"]
