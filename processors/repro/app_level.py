"""Application-level repros: which function to call for a recorded trace, and with which arguments.

Telemetry names the function (``code.function.name``) and its statements' parameters, not its arguments, so a
:class:`CallSpec` per function says how to call it: the import path, and how each argument derives from the recorded
statements (or from the request, :class:`RequestKey`). The specs are derived from the spans where the source allows
(:mod:`processors.repro.derive`), or written by hand (an override). Arguments are resolved here, at compile time, into
plain values (emitted as literals). The statements counted are the session's statements on the incident's rows: for the
classes over two rows, a lookup that found none of them (a phantom's "is there one already?") is not counted, so that a
spec written for the INSERT of a duplicate apply fits the INSERT of a phantom.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from processors.repro.schedule import Schedule, SessionInfo, Step
from processors.repro.statements import ReproError


@dataclass(frozen=True, slots=True)
class Param:
    """The ``index``-th recorded parameter of the session's ``statement``-th statement on the entity (negative
    numbers count from the end: ``Param(-1, 0)`` is the first parameter of the session's last statement, whether a
    predicate read came before it or not)."""

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


@dataclass(frozen=True, slots=True)
class RequestKey:
    """The idempotency key the session's request carried (the span attribute the daemon is configured to read)."""


Arg = Param | Const | PerSession | Format | RequestKey


@dataclass(frozen=True, slots=True)
class CallSpec:
    """How to call one recorded function: ``target`` is ``package.module:function`` (or ``:Class.method``); it
    receives a psycopg connection first, then ``args`` and ``kwargs``. A method with a ``receiver`` is called on an
    instance the test builds: ``Class()`` ("new"), or ``Class(conn)`` ("connection": the method then gets no
    connection of its own). A ``coroutine`` function's result is run to completion (``asyncio.run``). A web view
    (``http``) is requested through the test client of the app ``factory`` builds on the scratch database."""

    target: str
    args: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = ()
    autocommit: bool = True
    receiver: str = ""  # "" | "new" | "connection"
    coroutine: bool = False
    http: tuple[str, ...] = ()  # a web view: (method, rule), requested with ``kwargs`` as the rule's variables
    factory: tuple[str, ...] = ()  # its app: ("module:create_app", "engine" | "dsn"), given the scratch database

    @property
    def module_path(self) -> str:
        """The target's module as a path relative to the source root (``bench/shop/handlers.py``)."""
        return self.target.partition(":")[0].replace(".", "/") + ".py"


def _resolve(arg: Arg, session: int, params: Sequence[Sequence[Any] | None], key: str = "") -> Any:
    if isinstance(arg, Const):
        return arg.value
    if isinstance(arg, PerSession):
        return arg.base + session
    if isinstance(arg, RequestKey):
        if not key:
            raise ReproError(f"the request of session {session} carried no idempotency key")
        return key
    if isinstance(arg, Format):
        return arg.template.format(*(_resolve(f, session, params, key) for f in arg.fields))
    if not -len(params) <= arg.statement < len(params):
        raise ReproError(f"session {session} has no statement #{arg.statement} to take an argument from")
    recorded = params[arg.statement] or []
    if not -len(recorded) <= arg.index < len(recorded):
        raise ReproError(f"statement #{arg.statement} of session {session} has no parameter #{arg.index}")
    return recorded[arg.index]


def spec_for(session: SessionInfo, specs: Mapping[str, CallSpec]) -> CallSpec:
    """The session's CallSpec, by recorded function name, else by route."""
    spec = specs.get(session.function) or specs.get(session.route)
    if spec is None:
        raise ReproError(f"no CallSpec for {session.function or session.route!r}")
    return spec


def counted_steps(schedule: Schedule, session: int) -> list[Step]:
    """The session's statements a :class:`Param` counts: not its commits, not a lookup that found none of the rows."""
    return [step for step in schedule.steps if step.session == session and step.kind != "commit" and step.on_rows]


def calls(schedule: Schedule, specs: Mapping[str, CallSpec],
          keys: Mapping[str, str] | None = None) -> dict[int, dict[str, Any]]:  # fmt: skip
    """Session number → {target, args, kwargs, autocommit[, receiver, coroutine, http, factory]} with resolved
    values (``keys``: trace id → the idempotency key its request carried)."""
    out: dict[int, dict[str, Any]] = {}
    for s in schedule.sessions:
        spec = spec_for(s, specs)
        params = [step.params for step in counted_steps(schedule, s.number)]
        key = (keys or {}).get(s.trace_id, "")
        out[s.number] = {
            "target": spec.target,
            "args": [_resolve(a, s.number, params, key) for a in spec.args],
            "kwargs": {k: _resolve(a, s.number, params, key) for k, a in spec.kwargs},
            "autocommit": spec.autocommit,
            **({"receiver": spec.receiver} if spec.receiver else {}),
            **({"coroutine": True} if spec.coroutine else {}),
            **({"http": list(spec.http), "factory": list(spec.factory)} if spec.http else {}),
        }
    return out


def recorded_root(schedule: Schedule, specs: Mapping[str, CallSpec]) -> str:
    """The source root the functions were recorded under: their file path minus the module's relative path."""
    for s in schedule.sessions:
        relative = spec_for(s, specs).module_path
        if s.file.replace("\\", "/").endswith("/" + relative):
            return s.file[: -len(relative) - 1]
    raise ReproError("the recorded file paths do not end with the CallSpec modules: pass source_root=")
