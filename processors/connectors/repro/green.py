"""A repair plan at SQL level: the incident as the repaired code would run it, for the GREEN run of a SQL-level repro.

Each statement edit of the plan replaces its recorded statement (a placeholder it adds is bound to a copy of a
recorded parameter); the plan's schema migrations run on the scratch database after its seed rows; a transaction
the plan runs at a stricter isolation level runs so in the repro's session of that function. An edit that binds a
value the recording does not carry (the request's idempotency key, the version the code read), or a repair that
edits no recorded statement at all (an ORM's atomic update: the statement it sends binds the amount), has no
SQL-level form: then there is none (``None``, :func:`unavailable` says why), and only an application-level repro can
prove the repair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processors.model.outputs import IncidentEvent
from processors.repair import RepairPlan
from processors.repair.sql_edit import CopyParam
from processors.repro import Copy, SqlRewrite, apply_rewrites


@dataclass(frozen=True, slots=True)
class SqlGreen:
    """The repaired incident and what ``compile_repro`` needs besides it."""

    incident: IncidentEvent
    session_isolation: dict[str, str] = field(default_factory=dict)
    migrations: list[str] = field(default_factory=list)


def unavailable(plan: RepairPlan) -> str:
    """Why ``plan`` has no SQL-level form ("" when it has one)."""
    if plan.no_sql_form:
        return (f"GREEN not available at SQL level: the repair of {', '.join(plan.no_sql_form)} changes no recorded"
                " statement (the statement it sends binds a value no span carries); only an application-level repro"
                " can prove it")  # fmt: skip
    for edit in plan.edits:
        if any(not isinstance(source, CopyParam) for _, source in edit.new_params):
            return (
                "GREEN not available at SQL level: a repaired statement binds a value that was not recorded"
                f" ({' '.join(edit.canonical.split())[:120]}); only an application-level repro can prove it"
            )
    return ""


def sql_green(incident: IncidentEvent, plan: RepairPlan) -> SqlGreen | None:
    """``incident`` with ``plan`` applied at SQL level; None when it has none (:func:`unavailable` says why)."""
    if unavailable(plan):
        return None
    rewrites = []
    for edit in plan.edits:
        added: list[tuple[int, Copy]] = []
        for position, source in edit.new_params:
            assert isinstance(source, CopyParam)  # (unavailable() refused any other)
            added.append((position, Copy(source.index)))
        rewrites.append(SqlRewrite(edit.before, edit.after, tuple(added)))
    return SqlGreen(apply_rewrites(incident, rewrites), dict(plan.isolation), list(plan.migrations))


__all__ = ["SqlGreen", "sql_green", "unavailable"]
