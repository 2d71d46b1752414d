"""The first-divergence check: where the repro stopped doing what production did.

Both sides are sequences of :class:`ExecutedStatement` (production's from the incident's schedule, the repro's from
the trace the generated test writes). Only statements on the entity count: the repro's statements that were not
a scheduled step are ignored unless production ran the same statement (then they are extra). The first position
where the two differ is classified:

``ordering``         both statements happen, in another order
``missing``          production's statement never ran in the repro
``extra``            the repro ran a statement production did not (there)
``different_rows``   same statement, other rows affected / returned, or other returned values
``different_outcome`` same statement, it failed (or stayed blocked) on one side only

A repro is faithful when there is no divergence at all; only a faithful RED is proof.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processors.model.outputs import DivergenceInfo
from processors.repro.literals import plain
from processors.repro.statements import normalise


@dataclass(frozen=True, slots=True)
class ExecutedStatement:
    """One statement (or COMMIT) one session ran, and what came of it."""

    session: int
    statement: str  # normalised
    params: list[Any] | None
    rows: int | None
    outcome: str  # ok | error | blocked
    values: list[Any] | None = None
    step: int | None = None  # the schedule step it was (None: not on the schedule)
    waited_on: int | None = None  # the session whose lock it waited for (0: another backend)
    error: str = ""

    @property
    def identity(self) -> tuple[int, str, str]:
        return self.session, self.statement, json.dumps(self.params, sort_keys=True, default=str)

    def describe(self) -> str:
        shown = f"session {self.session}: {self.statement}"
        if self.params:
            shown += f" {self.params}"
        rows = "?" if self.rows is None else str(self.rows)
        return f"{shown} → {self.outcome}, {rows} rows" + (f" {self.values}" if self.values is not None else "")


def load_trace(path: Path) -> list[ExecutedStatement]:
    """The statements a generated test recorded (``REPRO_TRACE_OUT``); [] when it wrote none."""
    if not path.exists():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for r in data.get("statements", []):
        out.append(
            ExecutedStatement(
                session=int(r["session"]),
                statement=normalise(str(r["statement"])),
                params=r.get("params"),
                rows=r.get("rows"),
                outcome=str(r.get("outcome", "ok")),
                values=r.get("values"),
                step=r.get("step"),
                waited_on=r.get("waited_on"),
                error=str(r.get("error", "")),
            )
        )
    return out


def lock_waits(actual: Sequence[ExecutedStatement]) -> list[str]:
    """ "session 2 waited on a lock held by session 1" lines, in the order the waits happened."""
    out = []
    for s in actual:
        if s.waited_on is not None:
            holder = f"session {s.waited_on}" if s.waited_on else "another backend"
            out.append(f"session {s.session} waited on a lock held by {holder}: {s.statement}")
    return out


def _relevant(expected: Sequence[ExecutedStatement], actual: Sequence[ExecutedStatement]) -> list[ExecutedStatement]:
    known = {(e.session, e.statement) for e in expected}
    return [a for a in actual if a.step is not None or (a.session, a.statement) in known]


def _info(
    index: int, kind: str, expected: ExecutedStatement | None, actual: ExecutedStatement | None
) -> DivergenceInfo:
    return DivergenceInfo(
        faithful=False,
        index=index,
        expected=None if expected is None else expected.describe(),
        actual=None if actual is None else actual.describe(),
        mismatch=kind,
    )


def first_divergence(expected: Sequence[ExecutedStatement], actual: Sequence[ExecutedStatement]) -> DivergenceInfo:
    """The first mismatch between production's statements and the repro's (see the module docstring)."""
    acts = _relevant(expected, actual)
    for i in range(max(len(expected), len(acts))):
        ex = expected[i] if i < len(expected) else None
        ac = acts[i] if i < len(acts) else None
        if ex is None:
            return _info(i, "extra", None, ac)
        if ac is None:
            return _info(i, "missing", ex, None)
        if ex.identity == ac.identity:
            if ex.outcome != ac.outcome:
                return _info(i, "different_outcome", ex, ac)
            if ex.rows is not None and ac.rows is not None and ex.rows != ac.rows:
                return _info(i, "different_rows", ex, ac)
            if ex.values is not None and ac.values is not None and plain(ex.values) != plain(ac.values):
                return _info(i, "different_rows", ex, ac)
            continue
        later_actual = {a.identity for a in acts[i + 1 :]}
        later_expected = {e.identity for e in expected[i + 1 :]}
        if ex.identity in later_actual and ac.identity in later_expected:
            return _info(i, "ordering", ex, ac)
        if ex.identity not in later_actual:
            return _info(i, "missing", ex, ac)
        return _info(i, "extra", ex, ac)
    return DivergenceInfo(faithful=True, index=None, expected=None, actual=None, mismatch=None)
