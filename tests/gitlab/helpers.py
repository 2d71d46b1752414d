"""Shared helpers of the GitLab sink tests: realistic events from the fixtures, a recording sleep, the token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamer.schemas import IncidentEvent, ReproEvent, VerdictEvent

FIXTURES = Path(__file__).parent / "fixtures"
TOKEN = "glpat-TEST-s3cr3t-9f8e7d6c5b4a"
PROJECT = "trace-repro/shop"


def incident(name: str = "lost_update", **changes: Any) -> IncidentEvent:
    """A realistic incident from ``fixtures/incident_<name>.json``, with top-level fields replaced."""
    event = IncidentEvent.model_validate_json((FIXTURES / f"incident_{name}.json").read_text())
    return event.model_copy(update=changes)


def occurrence(base: IncidentEvent, n: int, *, at_ms: float | None = None) -> IncidentEvent:
    """Occurrence number ``n`` of ``base``'s defect: another occurrence id, entity and (optionally) time."""
    culprit = base.culprit.model_copy(update={"start_unix_ms": at_ms}) if at_ms is not None else base.culprit
    return base.model_copy(
        update={"occurrence": f"{base.occurrence[:8]}{n:08x}", "entity": f"orders:{4711 + n}", "culprit": culprit}
    )


def repro() -> ReproEvent:
    return ReproEvent.model_validate_json((FIXTURES / "repro_lost_update.json").read_text())


def verdict(**changes: Any) -> VerdictEvent:
    event = VerdictEvent.model_validate_json((FIXTURES / "verdict_lost_update_fixed.json").read_text())
    return event.model_copy(update=changes)


class RecordingSleep:
    """An async sleep that returns at once and remembers how long it was asked to wait."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
