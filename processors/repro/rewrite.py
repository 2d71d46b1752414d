"""Statements replaced by their protected forms: the same incident, replayed with repaired SQL (the GREEN run).

A :class:`SqlRewrite` mirrors the repair planner's SQL edit: the recorded text, the protected text, and the values
of the placeholders the protected text adds (copied from a recorded parameter, or given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from processors.model.outputs import AccessInfo, IncidentEvent
from processors.repro.statements import normalise


@dataclass(frozen=True, slots=True)
class Copy:
    """The value of the recorded statement's ``index``-th parameter."""

    index: int


@dataclass(frozen=True, slots=True)
class SqlRewrite:
    """``before`` → ``after``; ``new_params`` are (position among ``after``'s parameters, value), ascending."""

    before: str
    after: str
    new_params: tuple[tuple[int, Copy | Any], ...] = ()


def _rewrite(access: AccessInfo, rewrites: Sequence[SqlRewrite]) -> AccessInfo:
    for r in rewrites:
        if normalise(access.statement) == normalise(r.before):
            params = list(access.params)
            for position, value in r.new_params if params else ():  # (none recorded: all read off the images)
                params.insert(position, params[value.index] if isinstance(value, Copy) else value)
            return access.model_copy(update={"statement": r.after, "params": params})
    return access


def apply_rewrites(incident: IncidentEvent, rewrites: Sequence[SqlRewrite]) -> IncidentEvent:
    """The incident with every matching statement (accesses, culprit, victim, writers) in its protected form."""
    return incident.model_copy(
        update={
            "culprit": _rewrite(incident.culprit, rewrites),
            "victim": _rewrite(incident.victim, rewrites),
            "writers": [_rewrite(a, rewrites) for a in incident.writers],
            "accesses": [_rewrite(a, rewrites) for a in incident.accesses],
        }
    )
