"""Part of a repro's schedule: which recorded steps and seed rows a reduced repro keeps (the reducer's candidates).

A candidate is always a valid schedule of the same two sessions: every COMMIT is kept, and the remaining steps keep
their recorded order, so each session still runs its statements in order and commits where production committed.
Some steps are never removed (:func:`fixed_steps`): a commit, a statement that failed in production (the recorded
failure), and a statement the repair edits (the GREEN run needs it to repair). Kept steps are renumbered, since the
generated test refers to its steps by their position.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from processors.repro.schedule import Schedule
from processors.repro.statements import normalise

STEP = "step"
ROW = "row"
Unit = tuple[str, int]  # (STEP, index in the full schedule's steps) | (ROW, index in its seed rows)


@dataclass(frozen=True, slots=True)
class Keep:
    """The removable steps and the seed rows a repro keeps, by their position in the full schedule; ``None``: all."""

    steps: frozenset[int] | None = None
    rows: frozenset[int] | None = None

    @classmethod
    def of(cls, units: Collection[Unit], fixed: Collection[int]) -> Keep:
        """The Keep of ``units`` (plus the fixed steps): the steps of ``units`` and the rows of ``units``."""
        steps = {i for kind, i in units if kind == STEP} | set(fixed)
        rows = {i for kind, i in units if kind == ROW}
        return cls(frozenset(steps), frozenset(rows))


def fixed_steps(schedule: Schedule, repaired: Collection[str] = ()) -> set[int]:
    """The steps no reduction removes: commits, statements that failed in production, and the statements whose
    recorded text ``repaired`` names (the statements the repair edits)."""
    edited = {normalise(s) for s in repaired}
    return {
        s.index
        for s in schedule.steps
        if s.kind == "commit" or s.outcome == "error" or normalise(s.statement) in edited
    }


def removable(schedule: Schedule, fixed: Collection[int], *, steps: bool = True) -> list[Unit]:
    """What a reduction may remove: the steps that are not fixed (when ``steps``) and every seed row."""
    units: list[Unit] = [(STEP, s.index) for s in schedule.steps if steps and s.index not in fixed]
    return units + [(ROW, j) for j in range(len(schedule.seed))]


def subset(schedule: Schedule, keep: Keep) -> Schedule:
    """``schedule`` with only the kept steps (renumbered, in their recorded order) and seed rows."""
    kept = [s for s in schedule.steps if keep.steps is None or s.index in keep.steps or s.kind == "commit"]
    rows = [r for j, r in enumerate(schedule.seed) if keep.rows is None or j in keep.rows]
    return replace(schedule, steps=[replace(s, index=i) for i, s in enumerate(kept)], seed=rows)


__all__ = ["ROW", "STEP", "Keep", "Unit", "fixed_steps", "removable", "subset"]
