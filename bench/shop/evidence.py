"""What the database shows after a scenario: did the defect really happen, round by round?"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bench.shop.db import untraced
from bench.shop.service import Outcome


def lost_updates(dsn: str, order_ids: list[int]) -> dict[str, int]:
    """Orders whose 'pending' was left twice (version 2: both writers' UPDATEs applied, one status lost)."""
    with untraced(dsn) as conn:
        rows = conn.execute("SELECT status, version FROM orders WHERE id = ANY(%s)", (order_ids,)).fetchall()
    cancellations = sum(1 for status, version in rows if version >= 2 and status == "paid")
    payments = sum(1 for status, version in rows if version >= 2 and status == "cancelled")
    return {"manifested": cancellations + payments, "lost_cancellations": cancellations, "lost_payments": payments}


def oversold(dsn: str, skus: list[str]) -> dict[str, int]:
    """Skus whose stock went below zero."""
    with untraced(dsn) as conn:
        rows = conn.execute("SELECT stock FROM inventory WHERE sku = ANY(%s) AND stock < 0", (skus,)).fetchall()
    return {"manifested": len(rows), "negative_stock": len(rows), "units_oversold": -sum(r[0] for r in rows)}


def double_charges(dsn: str, order_ids: list[int]) -> dict[str, int]:
    """Orders with more than one charge row."""
    with untraced(dsn) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM charges WHERE order_id = ANY(%s) GROUP BY order_id HAVING count(*) > 1",
            (order_ids,),
        ).fetchall()
    return {"manifested": len(rows), "duplicate_charges": sum(r[0] - 1 for r in rows)}


@dataclass
class ScenarioResult:
    """One scenario's rounds: database evidence and what the requests answered."""

    scenario: str
    clean: bool
    rounds: int
    evidence: dict[str, int]
    outcomes: list[Outcome] = field(repr=False, default_factory=list)
    targets: list[int] | list[str] = field(repr=False, default_factory=list)  # order ids, or skus for oversell

    @property
    def manifested(self) -> int:
        return self.evidence["manifested"]

    @property
    def statuses(self) -> dict[int, int]:
        return dict(sorted(Counter(o.status for o in self.outcomes).items()))

    @property
    def error_traces(self) -> list[str]:
        return [o.trace_id for o in self.outcomes if o.status >= 500]

    def line(self) -> str:
        details = " ".join(f"{k}={v}" for k, v in self.evidence.items() if k != "manifested")
        rate = self.manifested / self.rounds if self.rounds else 0.0
        statuses = " ".join(f"{k}:{v}" for k, v in self.statuses.items())
        variant = "clean" if self.clean else "buggy"
        return (f"{self.scenario:<14} {variant:<6} manifested {self.manifested:>3}/{self.rounds:<3} ({rate:4.0%})  "
                f"{details}  statuses {statuses}")  # fmt: skip


@dataclass
class Summary:
    version: str
    topic: str
    results: list[ScenarioResult]

    def result(self, scenario: str) -> ScenarioResult:
        return next(r for r in self.results if r.scenario == scenario)

    def manifested(self, scenario: str) -> int:
        return self.result(scenario).manifested

    def __str__(self) -> str:
        head = f"shop {self.version} → topic {self.topic}"
        return "\n".join([head, *(r.line() for r in self.results)])
