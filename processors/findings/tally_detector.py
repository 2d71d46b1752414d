"""The shape every per-trace tally detector shares (N+1, serialized fan-out, retry storm): its windows, its
factory, and the parts of its findings that do not depend on what it found.

A detector subclasses :class:`TallyDetector` (``name``: its component, ``finding_type``: its registered type),
tallies in ``on_trace`` and builds each fingerprint's finding in ``finding`` with :func:`tally_finding`; its
factory is :func:`tally_factory`. Windows, revocation and emission are here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import Field

from processors.api.component import Context, Emit, Factory, Processor, Section
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.findings.trace_windows import Shapes, Tally, TallyWindows, WindowFindings, emit_closed, occurrence_of
from processors.model.finding import (
    ContractRules,
    FindingEvent,
    FindingType,
    Series,
    Severity,
    Subject,
    register_type,
)
from processors.model.units import MS_NS, s_to_ns
from processors.state.config import WindowConfig


class TallySection(Section):
    """The bounds of a tally detector's per-window state, in its section (the detector adds its thresholds)."""

    max_fingerprints: int = Field(
        1_000, ge=1, description="findings tallied per window and input partition; more are dropped (counted)"
    )
    max_operations: int = Field(
        10_000, ge=1, description="(service, route) request counters per window and input partition (counted)"
    )
    max_points: int = Field(200, ge=1, le=500, description="chart points (affected requests) kept per finding")
    shape_cache: int = Field(4_096, ge=1, description="statement shapes remembered by statement text (counted)")


class TallyDetector(Processor):
    """Tallies per fingerprint and event-time window (:class:`TallyWindows`), one finding per fingerprint when its
    window closes; subclasses implement ``on_trace`` and :meth:`finding`."""

    name: str = "tally"
    finding_type: ClassVar[str] = ""

    def __init__(self, config: TallySection, window_ns: int, grace_ns: int, *, max_windows: int = 1_000,
                 telemetry: Telemetry | None = None, events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self.telemetry = telemetry or Telemetry(self.name)
        self.windows = TallyWindows(self.name, self.finding_type, window_ns, grace_ns,
                                    max_fingerprints=config.max_fingerprints,
                                    max_operations=config.max_operations, max_points=config.max_points,
                                    max_windows=max_windows, telemetry=self.telemetry, events=events)  # fmt: skip
        self.shapes = Shapes(config.shape_cache, self.telemetry)

    def finding(self, window: WindowFindings, fingerprint: str, tally: Tally) -> FindingEvent | None:
        """The finding of one fingerprint's tally in a closed window (None: below the detector's thresholds)."""
        raise NotImplementedError

    def on_revoke(self, part: str) -> None:
        self.windows.forget_part(part)

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        emitted = emit_closed(self.windows, watermark_ns, open_since_ns, out, self.finding)
        self.telemetry.count("findings", emitted)
        self.telemetry.gauge("open_windows", len(self.windows))


def tally_finding(window: WindowFindings, fingerprint: str, tally: Tally, *, finding_type: str, title: str,
                  severity: Severity, remedy: str, evidence: list[str], data: dict[str, Any],
                  series: Sequence[Series]) -> FindingEvent:  # fmt: skip
    """A tally's finding: what it found (title, severity, remedy, evidence, data, charts) and what every tally
    finding says alike: its occurrence in the window, its subject, example traces, the requests it hit (the
    proof judge's count) and its contract (``finding:<type>:<fingerprint>`` on the route, at the rate it hit the
    route's requests in the window)."""
    seen = window.requests.get((tally.service, tally.operation), 0)
    return FindingEvent(
        fingerprint=fingerprint, occurrence=occurrence_of(fingerprint, window),
        detected_at_unix_ms=window.end_ns / MS_NS, type=finding_type, title=title,
        subject=Subject(service=tally.service, operation=tally.operation, entity=tally.entity, version=tally.version),
        severity=severity, remedy=remedy, evidence=evidence, data=data, series=list(series), traces=tally.traces,
        first_seen_unix_ms=tally.first_ns / MS_NS, last_seen_unix_ms=tally.last_ns / MS_NS,
        affected=max(1, tally.requests),
        contract=ContractRules(signature=f"finding:{finding_type}:{fingerprint}", service=tally.service,
                               routes=[tally.operation],
                               baseline_rate=round(tally.requests / seen, 6) if seen else None),
    )  # fmt: skip


C = TypeVar("C", bound=TallySection)
D = TypeVar("D", bound=TallyDetector)


def tally_factory(detector: type[D], config: type[C], finding_type: FindingType) -> Factory[C, D]:
    """The factory of a tally detector: stage 1 (``ingest``), configured by its section (``detector.name``) and
    ``[windows]`` (the window size; the trace gap as the grace before a window closes); its type registered."""
    register_type(finding_type)

    def create(section: C, ctx: Context) -> D:
        windows = ctx.section("windows", WindowConfig)
        return detector(section, s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s),
                        max_windows=windows.max_windows, telemetry=ctx.telemetry(detector.name),
                        events=ctx.state_events)  # fmt: skip

    def enabled(section: C) -> bool:
        return bool(getattr(section, "enabled", True))  # every tally section has one (its own description)

    return Factory(kind="detector", name=detector.name, config=config, create=create, stage="ingest",
                   events=(FindingEvent,), enabled=enabled)  # fmt: skip


__all__ = ["TallyDetector", "TallySection", "tally_factory", "tally_finding"]
