"""Application-level repros: which function to call for a recorded trace, and with which arguments.

Telemetry names the function (``code.function.name``) and its statements' parameters, not its arguments, so the
caller supplies a :class:`CallSpec` per function: the import path, and how each argument derives from the recorded
statements. Arguments are resolved here, at compile time, into plain values (emitted as literals).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from processors.repro.schedule import Schedule, SessionInfo
from processors.repro.statements import ReproError


@dataclass(frozen=True, slots=True)
class Param:
    """The ``index``-th recorded parameter of the session's ``statement``-th statement on the entity."""

    statement: int = 0
    index: int = 0


@dataclass(frozen=True, slots=True)
class Const:
    """A fixed value."""

    value: Any


@dataclass(frozen=True, slots=True)
class PerSession:
    """``base`` + the session number: a value each session needs its own of (e.g. the id of a row it creates)."""

    base: int


@dataclass(frozen=True, slots=True)
class Format:
    """``template.format(*fields)`` (the template is the caller's, the fields are resolved values)."""

    template: str
    fields: tuple[Param | Const | PerSession, ...] = ()


Arg = Param | Const | PerSession | Format


@dataclass(frozen=True, slots=True)
class CallSpec:
    """How to call one recorded function: ``target`` is ``package.module:function``; it receives a psycopg
    connection first, then ``args`` and ``kwargs``."""

    target: str
    args: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = ()
    autocommit: bool = True

    @property
    def module_path(self) -> str:
        """The target's module as a path relative to the source root (``bench/shop/handlers.py``)."""
        return self.target.partition(":")[0].replace(".", "/") + ".py"


def _resolve(arg: Arg, session: int, params: Sequence[Sequence[Any] | None]) -> Any:
    if isinstance(arg, Const):
        return arg.value
    if isinstance(arg, PerSession):
        return arg.base + session
    if isinstance(arg, Format):
        return arg.template.format(*(_resolve(f, session, params) for f in arg.fields))
    if arg.statement >= len(params):
        raise ReproError(f"session {session} has no statement #{arg.statement} to take an argument from")
    recorded = params[arg.statement] or []
    if arg.index >= len(recorded):
        raise ReproError(f"statement #{arg.statement} of session {session} has no parameter #{arg.index}")
    return recorded[arg.index]


def spec_for(session: SessionInfo, specs: Mapping[str, CallSpec]) -> CallSpec:
    """The session's CallSpec, by recorded function name, else by route."""
    spec = specs.get(session.function) or specs.get(session.route)
    if spec is None:
        raise ReproError(f"no CallSpec for {session.function or session.route!r}")
    return spec


def calls(schedule: Schedule, specs: Mapping[str, CallSpec]) -> dict[int, dict[str, Any]]:
    """Session number → {target, args, kwargs, autocommit} with resolved values."""
    out: dict[int, dict[str, Any]] = {}
    for s in schedule.sessions:
        spec = spec_for(s, specs)
        params = [step.params for step in schedule.steps if step.session == s.number and step.kind != "commit"]
        out[s.number] = {
            "target": spec.target,
            "args": [_resolve(a, s.number, params) for a in spec.args],
            "kwargs": {k: _resolve(a, s.number, params) for k, a in spec.kwargs},
            "autocommit": spec.autocommit,
        }
    return out


def recorded_root(schedule: Schedule, specs: Mapping[str, CallSpec]) -> str:
    """The source root the functions were recorded under: their file path minus the module's relative path."""
    for s in schedule.sessions:
        relative = spec_for(s, specs).module_path
        if s.file.replace("\\", "/").endswith("/" + relative):
            return s.file[: -len(relative) - 1]
    raise ReproError("the recorded file paths do not end with the CallSpec modules: pass source_root=")
