"""The hidden state of an issue: what later events need after a restart, kept in the issue's description.

The description ends with one line ``<!-- trace-repro:state {...} -->``: the occurrence count, the ids of the
recent occurrences (a replayed occurrence is not counted twice), the FIXED verdicts applied (a replayed verdict
does not close a reopened issue again) and the start of the window that verified the fix (an occurrence from
before it is late, not a recurrence). Its JSON has ``<``, ``>`` and ``&`` escaped, so it cannot end the comment
early. The visible ``**Occurrences:**`` line is rendered from the same state and replaced with it.

One state serves every finding (:class:`~processors.model.finding.Finding`), read through its interface only. An
occurrence's time is its event time (``seen_unix_ms``): the culprit's first conflicting write for an incident, the
start of the statistics window for a regression, the first request of any other finding (the first and last seen
times). Whether an occurrence of a closed issue is a recurrence (:func:`occurred_at`, the finding's ``recurs_unix_ms``,
against the start of the verified fix's window) is judged, for a regression and any finding that says when its
build was first seen, by when its *build* was first seen: a regression of the build
that was fixed, or of any build deployed before the fix (a draining pod, a late window), is late and counted; a
regression of a build deployed after the fix reopens the issue. (An event that does not say when its build was
first seen falls back to its window's start: then only a window wholly after the fix reopens.) The ``kind`` key
is written for every kind but incidents, so incident descriptions stay byte for byte what they were.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from sinks.gitlab.escape import code
from sinks.gitlab.markdown import Filed, iso, kind_of

RECENT_OCCURRENCES = 50
RECENT_VERDICTS = 20
_STATE = re.compile(r"^<!-- trace-repro:state (\{.*\}) -->$", re.MULTILINE)
_OCCURRENCES = re.compile(r"^\*\*Occurrences:\*\* .*$", re.MULTILINE)


def occurred_at(e: Filed) -> float:
    """The time that decides whether an occurrence recurs after a verified fix, in Unix ms (module docstring)."""
    return e.recurs_unix_ms()


def seen_at(e: Filed) -> float:
    """The event time of one occurrence, in Unix ms: the first and last seen times of the issue."""
    return e.seen_unix_ms()


@dataclass(frozen=True, slots=True)
class IssueState:
    """What the sink must remember about an issue across restarts; stored in its description."""

    fingerprint: str
    occurrences: int
    manifest: int  # occurrences whose damage happened (``Finding.manifest_count``; 0 for regressions)
    first_seen_ms: float
    last_seen_ms: float
    last_entity: str  # where the latest occurrence happened (``Finding.where``): a row, a build version
    recent: tuple[str, ...]
    verdicts: tuple[str, ...] = ()
    fixed_after_ms: float | None = None
    kind: str = "incident"  # the published kind: incident | regression | finding
    evidence: tuple[float, ...] | None = None  # ``Finding.rank`` of the occurrence the description shows

    @classmethod
    def first(cls, e: Filed) -> IssueState:
        at = seen_at(e)
        return cls(e.fingerprint, 1, e.manifest_count(), at, at, e.where(), (e.occurrence,), kind=kind_of(e),
                   evidence=e.rank())  # fmt: skip

    def better(self, e: Filed) -> bool:
        """Whether ``e`` is better evidenced than the occurrence the description shows (then it replaces it)."""
        new = e.rank()
        return new is not None and self.evidence is not None and new > self.evidence

    def seen(self, occurrence: str) -> bool:
        return occurrence in self.recent

    def with_occurrence(self, e: Filed) -> IssueState:
        at = seen_at(e)
        latest = at >= self.last_seen_ms
        return replace(
            self,
            occurrences=self.occurrences + 1,
            manifest=self.manifest + e.manifest_count(),
            first_seen_ms=min(self.first_seen_ms, at),
            last_seen_ms=at if latest else self.last_seen_ms,
            last_entity=e.where() if latest else self.last_entity,
            recent=(*self.recent, e.occurrence)[-RECENT_OCCURRENCES:],
        )

    def with_fix(self, verdict: str, after_ms: float) -> IssueState:
        return replace(self, verdicts=(*self.verdicts, verdict)[-RECENT_VERDICTS:], fixed_after_ms=after_ms)

    def comment(self) -> str:
        data: dict[str, Any] = {
            "v": 1,
            "fingerprint": self.fingerprint,
            "occurrences": self.occurrences,
            "manifest": self.manifest,
            "first_seen_ms": self.first_seen_ms,
            "last_seen_ms": self.last_seen_ms,
            "last_entity": self.last_entity,
            "recent": list(self.recent),
            "verdicts": list(self.verdicts),
            "fixed_after_ms": self.fixed_after_ms,
        }
        if self.kind != "incident":
            data["kind"] = self.kind
        if self.evidence is not None:
            data["evidence"] = list(self.evidence)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        return f"<!-- trace-repro:state {text} -->"

    @classmethod
    def parse(cls, description: str | None) -> IssueState | None:
        """The state of a description written by this module, or None (absent, or edited beyond recognition)."""
        found = _STATE.findall(description or "")
        if not found:
            return None
        try:
            d: dict[str, Any] = json.loads(found[-1])
            fixed = d.get("fixed_after_ms")
            return cls(
                fingerprint=str(d["fingerprint"]),
                occurrences=int(d["occurrences"]),
                manifest=int(d.get("manifest", 0)),
                first_seen_ms=float(d["first_seen_ms"]),
                last_seen_ms=float(d["last_seen_ms"]),
                last_entity=str(d.get("last_entity", "")),
                recent=tuple(str(x) for x in d.get("recent", [])),
                verdicts=tuple(str(x) for x in d.get("verdicts", [])),
                fixed_after_ms=None if fixed is None else float(fixed),
                kind=str(d.get("kind", "incident")),
                evidence=tuple(float(x) for x in d["evidence"]) if isinstance(d.get("evidence"), list) else None,
            )
        except (ValueError, KeyError, TypeError):
            return None


# The visible line of each kind that files issues (a lookup, not a branch per class): an incident counts its manifest
# occurrences and names the row, a regression names the build; a finding of any other type names where it was seen
# (:meth:`~processors.model.finding.Finding.where`: its entity, else its build), when it says.
_LINES = {
    "incident": "{n} ({manifest} manifest) · first seen {first} · last seen {last} on {where}",
    "regression": "{n} · first seen {first} · last seen {last} in build {where}",
}
_LINE = "{n} · first seen {first} · last seen {last}{on}"


def occurrences_line(state: IssueState) -> str:
    """The visible count: ``**Occurrences:** 3 (2 manifest) · first seen ... · last seen ... on `row```."""
    where = state.last_entity
    text = _LINES.get(state.kind, _LINE).format(
        n=state.occurrences, manifest=state.manifest, first=iso(state.first_seen_ms), last=iso(state.last_seen_ms),
        where=code(where), on=f" on {code(where)}" if where else "",
    )  # fmt: skip
    return f"**Occurrences:** {text}"


def with_state(description: str, state: IssueState) -> str:
    """``description`` with its occurrences line and hidden state replaced by ``state`` (appended if missing)."""
    line = occurrences_line(state)
    if _OCCURRENCES.search(description):
        text = _OCCURRENCES.sub(lambda _: line, description, count=1)
    else:
        text = description.rstrip("\n") + "\n\n" + line + "\n"
    text = _STATE.sub("", text).rstrip("\n")
    return f"{text}\n\n{state.comment()}\n"


__all__ = [
    "RECENT_OCCURRENCES",
    "RECENT_VERDICTS",
    "IssueState",
    "occurred_at",
    "occurrences_line",
    "seen_at",
    "with_state",
]
