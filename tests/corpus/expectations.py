"""What detection must report for a corpus round, shared by the replay tests and the live test.

An incident *belongs* to a round when it is on one of the round's rows (its ``entity``, or any of its ``entities``),
or when its culprit or victim is one of the round's requests (a predicate-level anomaly such as a phantom may be
reported on the predicate rather than on a row). A bug round must own exactly one incident, of the expected class,
whose culprit and victim are the expected requests (function and trace); a control round must own none; and no
incident may belong to no bug round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.corpus.manifest import RoundRecord


def belongs(incident: dict[str, Any], rnd: RoundRecord) -> bool:
    rows = {incident["entity"], *incident.get("entities", ())}  # (``entities``: every row, when the event lists them)
    parties = {incident["culprit"]["trace_id"], incident["victim"]["trace_id"]}
    return bool(rows & set(rnd.rows)) or bool(parties & rnd.traces)


def describe(incident: dict[str, Any]) -> str:
    c, v = incident["culprit"], incident["victim"]
    return (f"{incident['anomaly']} on {incident['entity']} (culprit {c['function']} {c['trace_id'][:8]}, "
            f"victim {v['function']} {v['trace_id'][:8]})")  # fmt: skip


def judge_round(rnd: RoundRecord, incidents: Sequence[dict[str, Any]]) -> list[str]:
    """What is wrong with ``incidents`` for round ``rnd`` (empty when nothing is)."""
    mine = [i for i in incidents if belongs(i, rnd)]
    if rnd.expected is None:
        return [f"control round {rnd.number} ({rnd.kind}) got {describe(i)}" for i in mine]
    want = rnd.expected
    if len(mine) != 1:
        found = "; ".join(describe(i) for i in mine) or "nothing"
        return [f"bug round {rnd.number} on {rnd.rows}: expected one {want.anomaly} incident, found {found}"]
    [incident] = mine
    problems = []
    got = (incident["anomaly"], incident["culprit"]["function"], incident["victim"]["function"])
    if got != (want.anomaly, want.culprit, want.victim):
        problems.append(f"bug round {rnd.number}: expected {want.anomaly} culprit {want.culprit} victim {want.victim}, "
                        f"got {describe(incident)}")  # fmt: skip
    traces = (incident["culprit"]["trace_id"], incident["victim"]["trace_id"])
    if traces != (want.culprit_trace, want.victim_trace):
        problems.append(f"bug round {rnd.number}: culprit/victim traces {traces}, expected the first committer "
                        f"{want.culprit_trace} as culprit and {want.victim_trace} as victim")  # fmt: skip
    return problems


def stray_incidents(rounds: Sequence[RoundRecord], incidents: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Incidents that belong to no bug round."""
    bugs = [r for r in rounds if r.is_bug]
    return [i for i in incidents if not any(belongs(i, r) for r in bugs)]
