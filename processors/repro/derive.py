"""Call specs derived from the spans: how to call each recorded function, without a hand-written :class:`CallSpec`.

A trace's statements carry their function (``code.function.name``) and file (``code.file.path``); its request may
carry an idempotency key. For each session of the incident's schedule, the function is looked up *statically* (the
file is parsed with :mod:`ast`, nothing of the service is imported here):

- the file is the recorded path mapped onto the source root (``source_map``, longest prefix, as the planner maps
  it); resolved, it must lie under the root, and its path relative to the root must be a module path (identifiers,
  ``.py``; not a standard-library name, which the import would shadow or be shadowed by);
- the function is the recorded name's end in that file, in the shapes :mod:`processors.repro.derive_code` knows: a
  module-level ``def`` or ``async def``, a method (on the class, or on an instance built with no arguments or with
  the connection), a Flask view with an app factory (requested through its test client); another route handler or
  decorated function is refused with what a call would need;
- its first positional parameter (after ``self``/``cls``; none for a method whose instance holds the connection)
  receives the connection; every other parameter takes a recorded value by name:
  the column its name equals (``item`` ← ``WHERE item = %s``, ``guest`` ← ``INSERT ... (guest) VALUES (%s)``), or
  the table's ``id`` column as ``<table in the singular>_id`` (``order_id`` ← ``orders.id``), in the session's
  statements on the incident's rows (the ones :class:`~processors.repro.app_level.Param` counts), the first
  statement that binds it; a parameter named for an idempotency key takes the key the request carried; a parameter
  with a default that nothing binds keeps its default; ``*args``/``**kwargs`` get nothing. A required parameter
  that nothing binds makes the function underivable, and the reason says which;
- the connection is given in autocommit mode unless the function commits it itself (``conn.commit()``), like the
  spec writers do for functions that open ``conn.transaction()``.

Every session running one function must derive the same spec (the same statement shape), else it is underivable.
"""

from __future__ import annotations

import ast
import keyword
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import sqlglot
from sqlglot import exp

from processors.model.outputs import IncidentEvent
from processors.repair.planner import local_path
from processors.repro.app_level import Arg, CallSpec, Param, RequestKey, counted_steps
from processors.repro.derive_code import Underivable, callee, parse
from processors.repro.schedule import Schedule, SessionInfo, build
from processors.repro.statements import ReproError
from processors.sql import number_qmarks, psycopg_to_qmark
from processors.sql.syntax import DIALECT, Pos, comparison, name_of, ref_of, table_of

_KEY_NAMES: Final = ("idempotency_key", "idempotencykey", "request_key")


@dataclass(frozen=True, slots=True)
class Derived:
    """The specs derived for an incident's functions, and why the others have none."""

    specs: dict[str, CallSpec] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # function -> why no spec


def derive_call_specs(incident: IncidentEvent, *, source_root: Path, source_map: Mapping[str, Path] | None = None,
                      invariants: Sequence[str] | None = None) -> Derived:  # fmt: skip
    """The CallSpec of each function of ``incident``'s sessions that can be called from ``source_root``."""
    try:
        schedule = build(incident, invariants)
    except ReproError as exc:
        return Derived(reasons={"": f"no schedule: {exc}"})
    keys = {a.trace_id for a in incident.accesses if a.idempotency_key}
    found: dict[str, CallSpec] = {}
    reasons: dict[str, str] = {}
    for s in schedule.sessions:
        name = s.function or s.route
        if name in reasons:
            continue
        try:
            spec = _derive(schedule, s, source_root, source_map or {}, s.trace_id in keys)
        except Underivable as why:
            reasons[name] = str(why)
            found.pop(name, None)
            continue
        if found.setdefault(name, spec) != spec:
            reasons[name] = "its sessions' statements bind its parameters differently"
            del found[name]
    return Derived(found, reasons)


def _derive(schedule: Schedule, s: SessionInfo, root: Path, source_map: Mapping[str, Path], keyed: bool) -> CallSpec:
    if (not s.function or not s.file) and s.candidates:
        raise Underivable(f"code not located to one function ({s.located_by}: {len(s.candidates)} candidates: "
                          f"{', '.join(s.candidates)})")  # fmt: skip
    if not s.function or not s.file:
        raise Underivable("no code.function.name / code.file.path recorded, nor located in the source checkout")
    module, path = _module(s.file, root, source_map)
    if not all(p.isidentifier() and not keyword.iskeyword(p) for p in s.function.split(".")[-2:]):
        raise Underivable(f"{s.function!r} does not end with a function name")
    found = callee(parse(path), s.function, path.name)
    fn, name = found.fn, found.qualname
    bound = _bound(schedule, s.number)
    args: list[Arg] = []
    kwargs: list[tuple[str, Arg]] = []
    positional = [*fn.args.posonlyargs, *fn.args.args]
    offset = len(positional) - len(found.params)
    required = len(positional) - len(fn.args.defaults)
    gap = False  # a positional-only parameter left to its default: later ones cannot be passed either
    for i, param in enumerate(found.params):
        arg = _argument(param.arg, bound, keyed)
        if arg is None and offset + i < required:
            raise Underivable(_missing(name, param.arg, keyed, keyword_only=False))
        if i >= found.positional_only:
            kwargs += [(param.arg, arg)] if arg is not None else []
        elif arg is None or gap:
            gap = True
        else:
            args.append(arg)
    for param, default in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
        arg = _argument(param.arg, bound, keyed)
        if arg is None and default is None:
            raise Underivable(_missing(name, param.arg, keyed, keyword_only=True))
        if arg is not None:
            kwargs.append((param.arg, arg))
    if found.route is not None:  # a Flask view, requested through the test client of the app its factory builds
        method, rule, factory, takes = found.route
        return CallSpec(
            f"{module}:{name}", (), tuple(kwargs), http=(method, rule), factory=(f"{module}:{factory}", takes)
        )
    return CallSpec(f"{module}:{name}", tuple(args), tuple(kwargs), autocommit=not _commits(fn, found.connection),
                    receiver=found.receiver, coroutine=found.coroutine)  # fmt: skip


def _missing(function: str, param: str, keyed: bool, *, keyword_only: bool) -> str:
    """What is missing for ``param`` of ``function``, and what would supply it."""
    what = "keyword parameter" if keyword_only else "parameter"
    if param.lower() in _KEY_NAMES and not keyed:
        return (f"{function}(): its {what} {param!r} is the request's idempotency key, which its statements' spans "
                "do not carry (record it on them: [decode] idempotency_key_attribute)")  # fmt: skip
    return (f"{function}(): no recorded value for its {what} {param!r} (no statement of the session on the "
            "incident's rows compares or stores a column of that name, nor <table>.id as <table>_id; a call spec "
            "in [repro] call_specs can supply it)")  # fmt: skip


def _module(recorded: str, root: Path, source_map: Mapping[str, Path]) -> tuple[str, Path]:
    """The dotted module name of a recorded file under the root, and the local file."""
    path = local_path(recorded, root, source_map)
    try:
        resolved = path.resolve()
        relative = resolved.relative_to(root.resolve())
    except (OSError, ValueError):
        raise Underivable(f"{recorded} is not under the source root {root}") from None
    parts = list(relative.parts)
    if not parts or not parts[-1].endswith(".py"):
        raise Underivable(f"{recorded} is not a Python module")
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise Underivable(f"{relative.as_posix()} is not importable as a module path")
    if parts[0] in sys.stdlib_module_names:
        raise Underivable(f"{relative.as_posix()}: {parts[0]!r} is a standard library module's name")
    if not resolved.is_file():
        raise Underivable(f"{recorded} not found (as {path})")
    return ".".join(parts), resolved


def _bound(schedule: Schedule, session: int) -> list[tuple[str, str, Param]]:
    """(table, column, parameter) for each recorded parameter a column takes, in statement then parameter order."""
    out: list[tuple[str, str, Param]] = []
    for number, step in enumerate(counted_steps(schedule, session)):
        count = len(step.params or [])
        for position, (table, column) in sorted(_columns(step.sql).items()):
            if position < count:
                out.append((table, column, Param(number, position)))
    return out


def _columns(sql: str) -> dict[int, tuple[str, str]]:
    """Parameter position -> (table, column) it is compared with (``=``) or stored in, in one statement."""
    try:
        tree = sqlglot.parse_one(number_qmarks(psycopg_to_qmark(sql), DIALECT), dialect=DIALECT)
    except sqlglot.errors.SqlglotError:
        return {}
    found = table_of(tree.args.get("this")) if isinstance(tree, exp.Insert | exp.Update) else None
    table = found[0] if found else ""
    if not table and (first := tree.find(exp.Table)) is not None:
        table = name_of(first.this)
    out: dict[int, tuple[str, str]] = {}
    if isinstance(tree, exp.Insert) and isinstance(tree.this, exp.Schema):
        columns = [name_of(c.this) if isinstance(c, exp.Column) else name_of(c) for c in tree.this.expressions]
        values = tree.expression
        rows = values.expressions if isinstance(values, exp.Values) else []
        for row in rows[:1]:
            for column, value in zip(columns, row.expressions if isinstance(row, exp.Tuple) else [row], strict=False):
                ref = ref_of(value)
                if isinstance(ref, Pos):
                    out.setdefault(ref.index, (table, column))
    for node in tree.walk():
        compared = comparison(node) if isinstance(node, exp.EQ) else None
        if compared is not None and isinstance(compared[2], Pos):
            out.setdefault(compared[2].index, (table, compared[0]))
    return out


def _argument(param: str, bound: Sequence[tuple[str, str, Param]], keyed: bool) -> Arg | None:
    """Where ``param`` comes from, or None."""
    lowered = param.lower()
    if keyed and lowered in _KEY_NAMES:
        return RequestKey()
    for _, column, arg in bound:
        if column == lowered:
            return arg
    for table, column, arg in bound:
        if column == "id" and lowered in {f"{t}_id" for t in _singular(table)}:
            return arg
    return None


def _singular(table: str) -> set[str]:
    """The table's name and its plausible singulars (``orders`` -> order, ``categories`` -> category)."""
    names = {table}
    if table.endswith("ies"):
        names.add(table[:-3] + "y")
    if table.endswith("es"):
        names.add(table[:-2])
    if table.endswith("s"):
        names.add(table[:-1])
    return names


def _commits(fn: ast.FunctionDef | ast.AsyncFunctionDef, connection: str) -> bool:
    """Whether the function calls ``<connection>.commit()`` (or ``self.<connection>.commit()``) itself."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "commit"
        and (_named(n.func.value, connection) or (isinstance(n.func.value, ast.Attribute)
                                                  and n.func.value.attr == connection
                                                  and _named(n.func.value.value, "self")))
        for n in ast.walk(fn)
    )  # fmt: skip


def _named(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


__all__ = ["Derived", "derive_call_specs"]
