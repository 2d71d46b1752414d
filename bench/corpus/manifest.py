"""The machine-readable manifest of a recorded (or live) scenario run: what each round was and what it must yield.

One manifest per scenario (``<scenario>.manifest.json`` next to ``<scenario>.jsonl``). Per round: its kind
(``bug`` or ``control:<name>``), the rows it is about as trace-repro names entities (``<table>:<key values joined by
|>``), its two requests (function, trace id, status, commit position, rows written), for a bug round the expected
anomaly with the culprit and the victim (function and trace id; the culprit is the request whose write committed
first, as observed in the commit order the round forced), and the row changes Debezium delivered for it, each with
the trace of the request that committed it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RequestRecord:
    role: str  # "leader" | "follower"
    function: str  # code.function.name, "corpus.<scenario>.<function>"
    route: str
    trace_id: str
    status: int
    error: str
    commit: int | None  # 1-based position in the round's commit order; None: it did not commit
    writes: list[str]  # the rows its committed transaction wrote


@dataclass(frozen=True)
class ChangeRecord:
    """One Debezium message of the round and the request that committed it."""

    entity: str
    topic: str
    partition: int
    offset: int
    op: str
    lsn: int
    tx_id: str
    writer: str  # trace id


@dataclass(frozen=True)
class Expected:
    anomaly: str
    culprit: str  # function
    victim: str  # function
    culprit_trace: str
    victim_trace: str


@dataclass(frozen=True)
class RoundRecord:
    number: int
    kind: str
    rows: list[str]
    requests: list[RequestRecord]
    expected: Expected | None
    facts: dict[str, Any] = field(default_factory=dict)
    changes: list[ChangeRecord] = field(default_factory=list)

    @property
    def is_bug(self) -> bool:
        return self.kind == "bug"

    @property
    def traces(self) -> set[str]:
        return {r.trace_id for r in self.requests}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RoundRecord:
        return cls(
            number=doc["number"],
            kind=doc["kind"],
            rows=list(doc["rows"]),
            requests=[RequestRecord(**r) for r in doc["requests"]],
            expected=Expected(**doc["expected"]) if doc.get("expected") else None,
            facts=dict(doc.get("facts", {})),
            changes=[ChangeRecord(**c) for c in doc.get("changes", [])],
        )


@dataclass(frozen=True)
class Manifest:
    scenario: str
    service: str  # resource service.name
    version: str  # resource service.version
    isolation: str
    spans_topic: str
    cdc_topics: list[str]
    tables: dict[str, list[str]]  # table -> primary key columns
    rounds: list[RoundRecord]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        doc = json.loads(text)
        return cls(**{**doc, "rounds": [RoundRecord.from_json(r) for r in doc["rounds"]]})

    @classmethod
    def load(cls, path: Path) -> Manifest:
        return cls.from_json(path.read_text(encoding="utf-8"))
