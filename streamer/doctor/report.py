"""The doctor's findings, and how they are shown: a table a person acts on, or JSON for a machine."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum


class Status(StrEnum):
    """How well the sample serves a capability."""

    OK = "ok"
    PARTIAL = "partial"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Finding:
    """One capability of one service or table: its status, what the sample showed, and what to turn on."""

    subject: str  # "service shop" | "table public.orders"
    capability: str  # e.g. "collisions: statement parameters"
    status: Status
    detail: str
    fix: str = ""


@dataclass(slots=True)
class Report:
    """What was read and what was found."""

    topics: dict[str, int] = field(default_factory=dict)  # topic -> messages read
    undecodable: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> decode error reason -> count
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the sample itself (what could not be read)

    @property
    def read(self) -> int:
        return sum(self.topics.values())

    def for_subject(self, subject: str) -> list[Finding]:
        return [f for f in self.findings if f.subject == subject]

    def to_json(self) -> str:
        return json.dumps(
            {
                "topics": self.topics,
                "undecodable": self.undecodable,
                "notes": self.notes,
                "findings": [asdict(f) for f in self.findings],
            },
            indent=2,
        )

    def to_table(self) -> str:
        """One block per subject: a line per capability (status, what was seen) and, unless ok, its fix under it."""
        lines = ["sample: " + (", ".join(f"{t} {n} message(s)" for t, n in self.topics.items()) or "nothing")]
        for topic, reasons in self.undecodable.items():
            lines.append(f"  {topic}: undecodable " + ", ".join(f"{r} x{n}" for r, n in reasons.items()))
        lines += [f"  note: {n}" for n in self.notes]
        width = max((len(f.capability) for f in self.findings), default=0)
        for subject in dict.fromkeys(f.subject for f in self.findings):  # in the order subjects first appear
            lines += ["", subject]
            for f in self.for_subject(subject):
                lines.append(f"  {f.capability:<{width}}  {f.status.value.upper():<7}  {f.detail}")
                if f.fix and f.status is not Status.OK:
                    lines.append(f"  {'':<{width}}  {'':<7}  fix: {f.fix}")
        return "\n".join(lines)
