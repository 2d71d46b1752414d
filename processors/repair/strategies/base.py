"""What every repair strategy shares: the writer it repairs, the planning context, and its outcome.

A strategy checks everything first and raises :class:`NotApplicable` with the reason when it cannot repair the
writer; otherwise it returns an :class:`Outcome` whose edits are operations on a
:class:`~processors.repair.patch.Patch` (:data:`Op`), so a plan never holds half a repair. A statement edit goes
into the code at every call site that runs the statement, with the expressions bound to its new placeholders
(:func:`param_values`: a copy of an existing parameter, or a variable in scope such as the version read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import libcst as cst

from processors.model.outputs import AccessInfo, RepairInfo
from processors.repair.classify import lock_of
from processors.repair.locate import CallSite, call_sites
from processors.repair.patch import Patch
from processors.repair.source import SourceError, SourceIndex
from processors.repair.sql_edit import CopyParam, RewriteError, SqlEdit, VarParam
from processors.sql import SqlAccessExtractor

ROW_LOCK: Final = "row_lock"
SHARE_LOCK: Final = "share_lock"
ATOMIC_UPDATE: Final = "atomic_update"
OPTIMISTIC_VERSION: Final = "optimistic_version"
STRICTER_ISOLATION: Final = "stricter_isolation"
REPEATABLE_READ: Final = "repeatable_read"
IDEMPOTENCY_GUARD: Final = "idempotency_guard"
UNIQUE_INSERT: Final = "unique_insert"

Op = Callable[[Patch], None]
T = TypeVar("T")


class NotApplicable(Exception):
    """The strategy cannot repair this writer (the message says why)."""


class NotThisShape(NotApplicable):
    """The writer's code is not written in this shape at all (an ORM's form on code that does not use the ORM): its
    reason is left out of the notes when another shape has one."""


@dataclass(frozen=True, slots=True)
class Writer:
    """One code path that writes the entity unprotected, with the unlocked reads it does before."""

    function: str
    file: str  # as the app recorded it
    path: Path  # the local file
    rel: str  # relative to the root, for diffs and RepairInfo
    writes: tuple[AccessInfo, ...]
    reads: tuple[AccessInfo, ...]

    @property
    def located_by(self) -> str:
        """How its code was found (``code_attributes`` ... ``statement``; "" when its accesses do not say)."""
        return next((a.located_by for a in (*self.writes, *self.reads) if a.located_by), "")


@dataclass(frozen=True, slots=True)
class Context:
    """What every strategy needs: the parsed sources and the configuration of the planning."""

    index: SourceIndex
    invariants: tuple[str, ...] = ()
    version_columns: tuple[str, ...] = ("version",)
    idempotency_column: str = "idempotency_key"
    extractor: SqlAccessExtractor | None = None

    def lock(self, statement: str) -> str:
        return lock_of(statement, self.extractor, self.version_columns)

    def sites(self, w: Writer, statement: str) -> list[CallSite]:
        try:
            found = call_sites(self.index, w.path, w.function, statement)
        except SourceError as exc:
            raise NotApplicable(str(exc)) from exc
        if not found:
            raise NotApplicable(f"statement {statement!r} not found in {w.function} ({w.rel})")
        return found

    def info(self, strategy: str, w: Writer, before: str, after: str) -> RepairInfo:
        return RepairInfo(
            strategy=strategy,
            file=w.rel,
            function=w.function,
            statement_before=before,
            statement_after=after,
            lock_before=self.lock(before),
            lock_after=self.lock(after),
            located_by=w.located_by,
        )


@dataclass(slots=True)
class Outcome:
    """One writer repaired: the RepairInfos, the patch operations, the SQL-level rewrites (as rendered, and as the
    edits themselves), the schema migrations it needs, the isolation level it runs its transaction at (by recorded
    function), and notes for the developer."""

    repairs: list[RepairInfo] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    sql: list[dict[str, str]] = field(default_factory=list)
    edits: list[SqlEdit] = field(default_factory=list)
    migrations: list[str] = field(default_factory=list)
    isolation: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def rewrote(self, edit: SqlEdit) -> None:
        """Record a statement edit at SQL level (rendered, and the edit)."""
        self.sql.append({"before": edit.before, "after": edit.canonical})
        self.edits.append(edit)


def rewrite(edit: Callable[[], T]) -> T:
    """The statement edit (or what a rewrite derives), a refusal turned into :class:`NotApplicable`."""
    try:
        return edit()
    except RewriteError as exc:
        raise NotApplicable(str(exc)) from exc


def sql_op(site: CallSite, recorded: str, edit: SqlEdit, values: Sequence[tuple[int, cst.BaseExpression]]) -> Op:
    """The patch operation that writes ``edit`` and its new parameters into the code at ``site``."""

    def op(patch: Patch) -> None:
        patch.sql(site, recorded, edit.insertions)
        patch.params(site, values)

    return op


def param_values(site: CallSite, edit: SqlEdit, roles: dict[str, str]) -> list[tuple[int, cst.BaseExpression]]:
    """The expressions to bind to the edit's new placeholders at ``site`` (checked to be editable)."""
    if not edit.new_params:
        return []
    func = site.call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "executemany":
        raise NotApplicable("executemany: cannot add a parameter to every row")
    params = site.params
    if not isinstance(params, cst.Tuple | cst.List):
        raise NotApplicable("the statement's parameters are not a tuple or list literal")
    values: list[tuple[int, cst.BaseExpression]] = []
    for index, source in edit.new_params:
        if isinstance(source, CopyParam):
            if source.index >= len(params.elements):
                raise NotApplicable("a placeholder has no parameter in the tuple")
            values.append((index, params.elements[source.index].value))
        elif isinstance(source, VarParam):
            values.append((index, cst.Name(roles[source.role])))
    return values
