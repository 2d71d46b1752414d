"""Graph-driven repair plans: every unprotected writer of the incident's entity, repaired by the anomaly's strategy.

The writers are the incident's own (culprit, victim, writers, accesses) plus every code site the graph knows to
access the table (``sites``), grouped by function. Each writer is repaired by the first strategy of the anomaly's
chain that applies to it; the other strategies that apply to the whole incident are offered as alternatives.

By class: a lost update locks the read (``FOR UPDATE``), else SERIALIZABLE; an invariant violation guards the
UPDATE (the invariant, or the one its decrement implies), else locks, else SERIALIZABLE; a duplicate apply guards
the INSERT with the request's idempotency key. A write skew locks the rows its check reads (``FOR UPDATE``, through
a locking subquery for an aggregate) when the rows the other request changed were among them, else SERIALIZABLE;
a phantom (the predicate double insert) takes the idempotency key when the code has one, else a unique index on
what the read looked up with ``ON CONFLICT ... DO NOTHING`` (the plan carries the migration), else SERIALIZABLE;
a read skew repairs the *reader*: ``FOR SHARE`` on its reads before its last one, or REPEATABLE READ. Besides the
diff, a plan carries its SQL-level form (``edits``, ``migrations``, ``isolation`` by recorded function), which is
what a SQL-level repro replays for GREEN.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from processors.model.anomaly import Anomaly
from processors.model.outputs import AccessInfo, IncidentEvent, RepairInfo
from processors.repair import shapes
from processors.repair.classify import relative_only, selects, table_of
from processors.repair.file_patch import FilePatch, apply_files, revert_files, unified_diff
from processors.repair.locate import normalise
from processors.repair.patch import Patch
from processors.repair.source import SourceIndex
from processors.repair.sql_edit import RewriteError, SqlEdit
from processors.repair.sql_inserts import equality_columns
from processors.repair.strategies import (
    ATOMIC_UPDATE,
    IDEMPOTENCY_GUARD,
    OPTIMISTIC_VERSION,
    REPEATABLE_READ,
    ROW_LOCK,
    SHARE_LOCK,
    STRICTER_ISOLATION,
    UNIQUE_INSERT,
    Context,
    NotApplicable,
    Writer,
    runs_serializable,
)
from processors.sql import SqlAccessExtractor

# Per writer, the first strategy that applies wins.
PRIMARY: Final[dict[str, tuple[str, ...]]] = {
    Anomaly.LOST_UPDATE: (ROW_LOCK, STRICTER_ISOLATION),
    Anomaly.INVARIANT_VIOLATION: (ATOMIC_UPDATE, ROW_LOCK, STRICTER_ISOLATION),
    Anomaly.DUPLICATE_APPLY: (IDEMPOTENCY_GUARD, STRICTER_ISOLATION),
    Anomaly.WRITE_SKEW: (ROW_LOCK, STRICTER_ISOLATION),
    Anomaly.PHANTOM: (IDEMPOTENCY_GUARD, UNIQUE_INSERT, STRICTER_ISOLATION),
    Anomaly.READ_SKEW: (SHARE_LOCK, REPEATABLE_READ),
}
ALTERNATIVES: Final[dict[str, tuple[str, ...]]] = {
    Anomaly.LOST_UPDATE: (OPTIMISTIC_VERSION, STRICTER_ISOLATION),
    Anomaly.INVARIANT_VIOLATION: (ROW_LOCK, STRICTER_ISOLATION),
    Anomaly.DUPLICATE_APPLY: (STRICTER_ISOLATION,),
    Anomaly.WRITE_SKEW: (STRICTER_ISOLATION,),
    Anomaly.PHANTOM: (UNIQUE_INSERT, STRICTER_ISOLATION),
    Anomaly.READ_SKEW: (REPEATABLE_READ,),
}
_WRITES: Final[dict[str, tuple[str, ...]]] = {
    Anomaly.LOST_UPDATE: ("write", "delete"),
    Anomaly.INVARIANT_VIOLATION: ("write", "delete"),
    Anomaly.DUPLICATE_APPLY: ("insert",),
    Anomaly.WRITE_SKEW: ("write", "delete", "insert"),
    Anomaly.PHANTOM: ("insert",),
}
_NEEDS_READ: Final = frozenset({Anomaly.LOST_UPDATE, Anomaly.INVARIANT_VIOLATION, Anomaly.WRITE_SKEW, Anomaly.PHANTOM})


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
    edits: list[SqlEdit] = field(default_factory=list)  # the statement edits (recorded text → repaired text)
    migrations: list[str] = field(default_factory=list)  # schema changes the repaired statements need
    isolation: dict[str, str] = field(default_factory=dict)  # recorded function → the level its transaction runs at
    # "function (strategy)" of each repair that edits no recorded statement and sets no isolation level (an ORM's
    # atomic update or version check: the statement it sends binds a value no span carries): no SQL-level form
    no_sql_form: list[str] = field(default_factory=list)


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
    if incident.anomaly == Anomaly.READ_SKEW:
        writers, notes = _readers(incident, root, source_map or {})
    else:
        writers, notes = _writers(incident, sites, root, source_map or {}, ctx.index)
    offered = ALTERNATIVES[incident.anomaly]
    if incident.anomaly == Anomaly.WRITE_SKEW and ROW_LOCK in chain:
        why = _unlockable(incident)
        if why:
            notes.append(f"{ROW_LOCK} does not apply: {why}")
            chain = tuple(c for c in chain if c != ROW_LOCK)
            offered = tuple(c for c in offered if c != ROW_LOCK)
    primary = _plan(ctx, incident.anomaly, writers, chain, notes, line_length)
    alternatives: list[RepairPlan] = []
    for strategy in offered:
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


def unlocated(accesses: Sequence[AccessInfo]) -> str:
    """Why a code path has no location: none recorded, or the code locator's candidates (never one of them)."""
    candidates = sorted({c for a in accesses for c in a.candidates})
    if candidates:
        how = next((a.located_by for a in accesses if a.candidates), "")
        return f"code not located to one function ({how}: {len(candidates)} candidates: {', '.join(candidates)})"
    return "no code location recorded"


def _writers(
    incident: IncidentEvent,
    sites: Sequence[AccessInfo],
    root: Path,
    source_map: Mapping[str, Path],
    index: SourceIndex,
) -> tuple[list[Writer], list[str]]:
    """The incident's and the graph's code paths on the table, grouped by function, unprotected writers only: not
    a path whose function runs SERIALIZABLE, nor, for a lost update, one whose writes are all relative."""
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
    any_table = anomaly == Anomaly.WRITE_SKEW
    for (function, file), accesses in groups.items():
        writes = tuple(a for a in accesses if a.operation in _WRITES[anomaly] and a.lock == "none")
        reads = tuple(
            a
            for a in accesses
            if a.operation == "read" and a.lock == "none" and (any_table or table_of(a.statement) == table)
        )
        name = function or "(unknown function)"
        if anomaly == Anomaly.LOST_UPDATE and writes and all(relative_only(a.statement) for a in writes):
            notes.append(f"{name}: its writes of {table} are relative ({writes[0].statement}): each keeps a "
                         f"concurrent change, not a party to {anomaly}")  # fmt: skip
            continue
        if not writes:
            continue
        if anomaly == Anomaly.WRITE_SKEW and reads and _checks_locked(accesses, reads, table):
            notes.append(f"{name}: reads {table} under a lock before it writes (its other reads are by key): "
                         "already protected")  # fmt: skip
            continue
        if anomaly in _NEEDS_READ and not reads:
            locked = next((a.lock for a in accesses if a.operation == "read" and a.lock != "none"
                           and (any_table or table_of(a.statement) == table)), None)  # fmt: skip
            if locked is not None:
                notes.append(f"{name}: reads {table} under a lock ({locked}) before it writes: already protected")
            else:
                notes.append(f"{name}: writes {table} without reading it first (blind write): not a party to {anomaly}")
            continue
        if not function or not file:
            notes.append(f"{name}: {unlocated(accesses)}")
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
        if runs_serializable(index, path, function):
            notes.append(f"{name}: runs its transaction at SERIALIZABLE: already protected")
            continue
        writers.append(Writer(function, file, path, rel, writes, reads))
    return writers, notes


def _checks_locked(accesses: Sequence[AccessInfo], reads: Sequence[AccessInfo], table: str) -> bool:
    """Whether a write skew's party reads the table under a lock (its check) and its unlocked reads each fetch one
    row by one key column (the row it then changes, as ``session.get`` reads it), which no check is."""
    if not any(a.operation == "read" and a.lock != "none" and table_of(a.statement) == table for a in accesses):
        return False
    return all(len(pinned_columns(r.statement)) == 1 for r in reads)


def pinned_columns(statement: str) -> list[str]:
    """The columns a SELECT pins to one value each (none when its WHERE is anything else)."""
    try:
        return equality_columns(statement)
    except RewriteError:
        return []


def _readers(incident: IncidentEvent, root: Path, source_map: Mapping[str, Path]) -> tuple[list[Writer], list[str]]:
    """The reader of a read skew (the victim's code path), with the reads to protect: every unlocked read it made
    before its last one (a statement it also ran earlier stays protected)."""
    victim = incident.victim
    own = sorted((a for a in incident.accesses if a.trace_id == victim.trace_id), key=lambda a: a.start_unix_ms)
    reads = [a for a in own if a.operation == "read" and a.lock == "none"]
    if not reads or any(a.operation != "read" for a in own):
        return [], [f"{victim.function or '(unknown function)'}: not a reader of {incident.table}"]
    last = normalise(reads[-1].statement)
    earlier = {normalise(a.statement) for a in reads[:-1]}
    chosen = list({normalise(a.statement): a for a in reads if normalise(a.statement) != last or last in earlier}
                  .values())  # fmt: skip
    if not chosen:
        return [], [f"{victim.function}: reads once: nothing to protect"]
    function, file = victim.function, victim.file
    if not function or not file:
        return [], [f"{function or '(unknown function)'}: {unlocated([victim])}"]
    path = local_path(file, root, source_map)
    try:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return [], [f"{function}: {file} is not under the root {root}"]
    if not path.is_file():
        return [], [f"{function}: {file} not found (as {path})"]
    return [Writer(function, file, path, rel, (), tuple(chosen))], []


def _unlockable(incident: IncidentEvent) -> str:
    """Why ``FOR UPDATE`` on the reads cannot prevent this write skew ("" when it can): each row one request changed
    must have existed, and been selected by a read of the other, when that read ran. A read whose selection cannot
    be told (its parameters were not recorded, as no stock instrumentation records them) is taken to select it."""
    reads: dict[str, list[AccessInfo]] = {}
    for a in incident.accesses:
        if a.operation == "read" and a.lock == "none":
            reads.setdefault(a.trace_id, []).append(a)
    for c in incident.commits:
        if c.before is None:
            return f"lsn {c.lsn} inserted its row: a lock cannot cover a row that does not exist yet"
        others = [r for trace, rs in reads.items() if trace != c.trace_id for r in rs]
        if all(selects(r.statement, r.params, c.before) is False for r in others):
            return f"lsn {c.lsn} changed a row the other request's read did not select when it ran"
    return ""


def _plan(
    ctx: Context, anomaly: str, writers: Sequence[Writer], chain: Sequence[str], notes: list[str], line_length: int
) -> RepairPlan:
    patch = Patch(ctx.index, line_length=line_length)
    repairs: list[RepairInfo] = []
    sql: list[dict[str, str]] = []
    edits: list[SqlEdit] = []
    migrations: list[str] = []
    isolation: dict[str, str] = {}
    no_sql_form: list[str] = []
    notes = list(notes)
    for w in writers:
        for strategy in chain:
            try:
                outcome = shapes.repair(ctx, strategy, w)
            except NotApplicable as exc:
                notes.append(f"{w.function}: {strategy} does not apply: {exc}")
                continue
            for op in outcome.ops:
                op(patch)
            repairs += [r for r in outcome.repairs if r not in repairs]
            sql += [s for s in outcome.sql if s not in sql]
            edits += [e for e in outcome.edits if e not in edits]
            migrations += [m for m in outcome.migrations if m not in migrations]
            isolation.update(outcome.isolation)
            if not outcome.edits and not outcome.isolation:
                no_sql_form += [f"{r.function} ({r.strategy})" for r in outcome.repairs]
            notes += [n for n in outcome.notes if n not in notes]
            break
        else:
            notes.append(f"{w.function}: left unrepaired")
    files = [FilePatch(_rel(ctx, path), before, after) for path, before, after in patch.render()]
    strategy = repairs[0].strategy if repairs else chain[0]  # the strategy that repaired (the first writer)
    return RepairPlan(anomaly, strategy, repairs, unified_diff(files), sql, files, notes, edits=edits,
                      migrations=migrations, isolation=isolation, no_sql_form=no_sql_form)  # fmt: skip


def _rel(ctx: Context, path: Path) -> str:
    return path.resolve().relative_to(ctx.index.root).as_posix()
