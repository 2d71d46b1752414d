"""Template: the serial orders, and whether one of them explains what took effect in the interleaving.

Inlined by the compiler after ``template_driver``. The same driver runs the two *serial* orders (every step of one
session, then every step of the other, each on a fresh scratch database). ``stale_effects`` compares them with the
interleaving: a session is stale under an order when one of its statements returned something else (other rows read,
another row count written, another outcome) than in that serial run, and that staleness took effect when it
committed after it, with a later write that changed rows (or, reading only, with what it read, when another session
committed a change it had not seen). The interleaving is judged non-serializable, the defect reproduced, when every
serial order has a stale session whose staleness took effect.
"""

from __future__ import annotations

from typing import Any

from processors.repro.template_common import SESSIONS, STEPS, who
from processors.repro.template_driver import WRITES, Driver, n_rows, ran_after


def serial_orders() -> list[list[int]]:
    """Every serial order of the sessions (session numbers, the first to run first)."""
    numbers = sorted(SESSIONS)
    return [numbers, list(reversed(numbers))] if len(numbers) == 2 else [numbers]


def serial_steps(order: list[int]) -> list[int]:
    """The steps of a serial order: all of one session's, then all of the other's."""
    return [i for n in order for i, step in enumerate(STEPS) if step["session"] == n]


def stale_effects(ran: Driver, serial: list[tuple[list[int], Driver]]) -> list[str]:
    """Why no serial order explains what took effect in the interleaving; [] when one does (see the module)."""
    mine = {r["step"]: r for r in ran.records if r["step"] is not None}
    explained: list[str] = []
    for order, run in serial:
        theirs = {r["step"]: r for r in run.records if r["step"] is not None}
        found = []
        for number in sorted(SESSIONS):
            mine_steps = [i for i, step in enumerate(STEPS) if step["session"] == number]
            stale = _difference(mine_steps, mine, theirs)
            if stale is None:
                continue
            index, why = stale
            effect = _effect(ran, number, mine[index], reached=index in theirs)
            if effect:
                found.append(f"{who(number)} {why}, {effect}")
        if not found:
            return []  # this serial order explains everything that took effect
        shown = " then ".join(f"session {n}" for n in order)
        explained.append(f"against the serial order {shown}: " + "; ".join(found))
    return ["stale read took effect, no serial order explains the outcome: " + " | ".join(explained)]


def _difference(steps: list[int], mine: dict[int, dict[str, Any]],
                theirs: dict[int, dict[str, Any]]) -> tuple[int, str] | None:  # fmt: skip
    """The session's first step whose result differs from the serial run's, and how; None when none does."""
    for index in steps:
        a, b = mine.get(index), theirs.get(index)
        if a is None:
            return None  # the session went no further in the interleaving
        if a["kind"] == "commit":
            continue
        shown = f"{a['statement']} {a['params'] or ''}".rstrip()
        if b is None:
            return index, f"ran `{shown}`, which the serial run never reached"
        if a["outcome"] != b["outcome"]:
            return index, f"`{shown}` ended {a['outcome']} where the serial run's ended {b['outcome']}"
        if a["kind"] == "read" and a["result"] != b["result"]:
            return index, f"read {a['result']} with `{shown}` where the serial run read {b['result']}"
        if a["kind"] != "read" and a["rows"] != b["rows"]:
            ours, serial = n_rows(a["rows"]), n_rows(b["rows"])
            return index, f"changed {ours} with `{shown}` where the serial run changed {serial}"
    return None


def _effect(ran: Driver, number: int, stale: dict[str, Any], *, reached: bool = True) -> str:
    """How a session's stale step took effect: its transaction committed a later write that changed rows, or,
    writing nothing after it, committed what it read (a read the serial run never reached only when another session
    had committed a change it did not see). A transaction that rolled back (or failed to commit: a retry
    that commits later is another transaction) took no effect."""
    records = sorted((r for r in ran.records if r["session"] == number), key=lambda r: r["issued"])
    ends = [r for r in records if r["kind"] in ("commit", "rollback") and r["issued"] > stale["issued"]]
    end = ends[0] if ends else None
    if end is None or end["kind"] != "commit" or end["outcome"] != "ok":
        return ""
    later = [r for r in records if stale["issued"] <= r["issued"] < end["issued"] and r["kind"] in WRITES
             and r["on_table"]]  # fmt: skip
    if not later:
        if not reached and not _missed(ran, number, stale, end):
            return ""  # another path to a current value (an idempotent insert's answer): nothing stale took effect
        return "and committed what it read"
    done = next((r for r in later if r["outcome"] == "ok" and (r["rows"] or 0) > 0), None)
    if done is None:
        return ""
    return f"then `{done['statement']}` changed {n_rows(done['rows'])} and committed"


def _missed(ran: Driver, number: int, read: dict[str, Any], end: dict[str, Any]) -> bool:
    """Whether another session committed a change of the table, before this session committed, that ``read`` did
    not see: only then was what it read stale when it took effect (a read of what the others had already committed,
    like the existing row an idempotent insert answers with, is current, whatever path led to it)."""
    for r in ran.records:
        if r["session"] == number or r["kind"] != "commit" or r["outcome"] != "ok" or r["done"] is None:
            continue
        if end["done"] is None or r["done"] > end["done"] or ran_after(read, r):
            continue
        wrote = [w for w in ran.records if w["session"] == r["session"] and w["kind"] in WRITES and w["on_table"]
                 and w["outcome"] == "ok" and (w["rows"] or 0) > 0 and w["issued"] < r["issued"]]  # fmt: skip
        if wrote:
            return True
    return False
