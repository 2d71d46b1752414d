"""Graph-driven repair plans: every unprotected writer of the incident's entity, repaired by the anomaly's strategy.

The writers are the incident's own (culprit, victim, writers, accesses) plus every code site the graph knows to
access the table (``sites``), grouped by function. Each writer is repaired by the first strategy of the anomaly's
chain that applies to it; the other strategies that apply to the whole incident are offered as alternatives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from processors.repair.classify import table_of
from processors.repair.locate import SourceIndex, normalise
from processors.repair.patch import FilePatch, Patch, apply_files, revert_files, unified_diff
from processors.repair.strategies import (
    ATOMIC_UPDATE,
    IDEMPOTENCY_GUARD,
    OPTIMISTIC_VERSION,
    ROW_LOCK,
    STRATEGIES,
    STRICTER_ISOLATION,
    Context,
    NotApplicable,
    Writer,
)
from processors.sql_access import SqlAccessExtractor
from streamer.schemas import AccessInfo, IncidentEvent, RepairInfo

# Per writer, the first strategy that applies wins.
PRIMARY: Final[dict[str, tuple[str, ...]]] = {
    "lost_update": (ROW_LOCK, STRICTER_ISOLATION),
    "invariant_violation": (ATOMIC_UPDATE, ROW_LOCK, STRICTER_ISOLATION),
    "duplicate_apply": (IDEMPOTENCY_GUARD, STRICTER_ISOLATION),
    "write_skew": (STRICTER_ISOLATION, ROW_LOCK),
}
ALTERNATIVES: Final[dict[str, tuple[str, ...]]] = {
    "lost_update": (OPTIMISTIC_VERSION, STRICTER_ISOLATION),
    "invariant_violation": (ROW_LOCK, STRICTER_ISOLATION),
    "duplicate_apply": (STRICTER_ISOLATION,),
    "write_skew": (ROW_LOCK,),
}
_WRITES: Final[dict[str, tuple[str, ...]]] = {
    "lost_update": ("write", "delete"),
    "invariant_violation": ("write", "delete"),
    "duplicate_apply": ("insert",),
    "write_skew": ("write", "delete", "insert"),
}
_NEEDS_READ: Final = frozenset({"lost_update", "invariant_violation", "write_skew"})


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """The repairs of one incident: per writer, the unified diff, the SQL-level equivalent and the alternatives."""

    anomaly: str
    strategy: str
    repairs: list[RepairInfo]
    diff: str
    sql_rewrites: list[dict[str, str]]
    files: list[FilePatch]
    notes: list[str] = field(default_factory=list)  # writers left out, strategies that did not apply, and why
    alternatives: list[RepairPlan] = field(default_factory=list)


def plan_repairs(
    incident: IncidentEvent,
    *,
    root: Path,
    sites: Sequence[AccessInfo] = (),
    invariants: Mapping[str, list[str]] | None = None,
    source_map: Mapping[str, Path] | None = None,
    extractor: SqlAccessExtractor | None = None,
    version_columns: Sequence[str] = ("version",),
    idempotency_column: str = "idempotency_key",
    line_length: int = 120,
) -> RepairPlan:
    """Plan the repair of every unprotected writer of the incident's table (files are read, never written)."""
    chain = PRIMARY.get(incident.anomaly)
    if chain is None:
        raise ValueError(f"no repair strategy for anomaly {incident.anomaly!r}")
    ctx = Context(
        index=SourceIndex(root),
        invariants=tuple(_invariants(invariants or {}, incident.table)),
        version_columns=tuple(version_columns),
        idempotency_column=idempotency_column,
        extractor=extractor,
    )
    writers, notes = _writers(incident, sites, root, source_map or {})
    primary = _plan(ctx, incident.anomaly, writers, chain, notes, line_length)
    alternatives: list[RepairPlan] = []
    for strategy in ALTERNATIVES[incident.anomaly]:
        alt = _plan(ctx, incident.anomaly, writers, (strategy,), [], line_length)
        if alt.repairs and alt.diff and all(alt.diff != p.diff for p in [primary, *alternatives]):
            alternatives.append(alt)
    return replace(primary, alternatives=alternatives)


def apply(plan: RepairPlan, root: Path) -> None:
    """Write the plan's repaired files under ``root`` (refused when a file changed since the plan was made)."""
    apply_files(plan.files, root)


def revert(plan: RepairPlan, root: Path) -> None:
    """Restore, byte for byte, the files ``apply`` changed."""
    revert_files(plan.files, root)


def _invariants(config: Mapping[str, list[str]], table: str) -> list[str]:
    bare = table.rsplit(".", 1)[-1]
    return [*config.get(table, []), *(config.get(bare, []) if bare != table else [])]


def local_path(recorded: str, root: Path, source_map: Mapping[str, Path]) -> Path:
    """The local file for a path the app recorded: the longest matching ``source_map`` prefix, else as is."""
    for prefix in sorted(source_map, key=len, reverse=True):
        stripped = prefix.rstrip("/")
        if recorded == stripped or recorded.startswith(stripped + "/"):
            return source_map[prefix] / recorded[len(stripped) :].lstrip("/")
    path = Path(recorded)
    return path if path.is_absolute() else root / path


def _writers(
    incident: IncidentEvent, sites: Sequence[AccessInfo], root: Path, source_map: Mapping[str, Path]
) -> tuple[list[Writer], list[str]]:
    """The incident's and the graph's code paths on the table, grouped by function, unprotected writers only."""
    table = incident.table.rsplit(".", 1)[-1]
    own = [incident.culprit, incident.victim, *incident.writers, *incident.accesses]
    pool = own + [s for s in sites if table_of(s.statement) == table]
    unique: dict[tuple[str, str, str, str, str], AccessInfo] = {}
    for a in pool:
        unique.setdefault((a.function, a.file, a.operation, a.lock, normalise(a.statement)), a)
    groups: dict[tuple[str, str], list[AccessInfo]] = {}
    for a in unique.values():
        groups.setdefault((a.function, a.file), []).append(a)
    writers: list[Writer] = []
    notes: list[str] = []
    anomaly = incident.anomaly
    any_table = anomaly == "write_skew"
    for (function, file), accesses in groups.items():
        writes = tuple(a for a in accesses if a.operation in _WRITES[anomaly] and a.lock == "none")
        reads = tuple(
            a
            for a in accesses
            if a.operation == "read" and a.lock == "none" and (any_table or table_of(a.statement) == table)
        )
        if not writes:
            continue
        name = function or "(unknown function)"
        if anomaly in _NEEDS_READ and not reads:
            notes.append(f"{name}: writes {table} without reading it first (blind write): not a party to {anomaly}")
            continue
        if not function or not file:
            notes.append(f"{name}: no code location recorded")
            continue
        path = local_path(file, root, source_map)
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            notes.append(f"{name}: {file} is not under the root {root}")
            continue
        if not path.is_file():
            notes.append(f"{name}: {file} not found (as {path})")
            continue
        writers.append(Writer(function, file, path, rel, writes, reads))
    return writers, notes


def _plan(
    ctx: Context, anomaly: str, writers: Sequence[Writer], chain: Sequence[str], notes: list[str], line_length: int
) -> RepairPlan:
    patch = Patch(ctx.index, line_length=line_length)
    repairs: list[RepairInfo] = []
    sql: list[dict[str, str]] = []
    notes = list(notes)
    for w in writers:
        for strategy in chain:
            try:
                outcome = STRATEGIES[strategy](ctx, w)
            except NotApplicable as exc:
                notes.append(f"{w.function}: {strategy} does not apply: {exc}")
                continue
            for op in outcome.ops:
                op(patch)
            repairs += [r for r in outcome.repairs if r not in repairs]
            sql += [s for s in outcome.sql if s not in sql]
            break
        else:
            notes.append(f"{w.function}: left unrepaired")
    files = [FilePatch(_rel(ctx, path), before, after) for path, before, after in patch.render()]
    return RepairPlan(anomaly, chain[0], repairs, unified_diff(files), sql, files, notes)


def _rel(ctx: Context, path: Path) -> str:
    return path.resolve().relative_to(ctx.index.root).as_posix()
