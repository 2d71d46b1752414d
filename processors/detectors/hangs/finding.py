"""The ``hang`` finding type: its data model, its registration and how a window's hung calls become a finding."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from pydantic import Field

from processors.detectors.hangs.hops import Hop
from processors.model.base import Frozen
from processors.model.finding import ContractRules, FindingEvent, FindingType, Point, Series, Subject, register_type
from processors.model.units import MS_NS

TYPE = "hang"
MAX_EXAMPLES = 20


class HangData(Frozen):
    """A hop's hung calls in one window, with the distribution that made them hung."""

    service: str
    operation: str
    callee: str
    window: str
    calls: int  # calls of the hop in the window
    hung: int  # ended past the threshold without an error
    timeouts: int  # ended at a client timeout, the callee never answering
    timeout_seen: bool  # whether the caller ever timed out on this hop in the window
    threshold_ms: float  # max(factor x baseline p99, floor); 0 when the baseline was not ready
    factor: float
    floor_ms: float
    baseline_samples: int
    baseline_p50_ms: float
    baseline_p95_ms: float
    baseline_p99_ms: float
    hung_ms: list[float] = Field(default_factory=list, max_length=MAX_EXAMPLES)  # durations of hung calls (examples)
    timeout_ms: list[float] = Field(default_factory=list, max_length=MAX_EXAMPLES)  # durations of timed-out calls
    longest_ms: float = 0.0


HANG = FindingType(
    name=TYPE,
    title="Hang: a hop with no timeout",
    description="Calls from an operation to a dependency ended far beyond the hop's recent durations without an "
    "error (no timeout bounded them), or the caller timed out while the callee never answered.",
    data=HangData,
    remedies=("add_timeout", "propagate_deadline"),
    severity="high",
)
register_type(HANG)


def hang_fingerprint(hop: Hop) -> str:
    """The hop, whatever build or window shows it: service, operation and callee, no version. Persisted (issues are
    matched by it), so not :func:`~processors.findings.trace_windows.fingerprint_of`, which joins otherwise."""
    return hashlib.sha256("|".join((*hop, TYPE)).encode()).hexdigest()[:16]


@dataclass(slots=True)
class HopWindow:
    """One hop's calls in one window (of one input partition)."""

    version: str = ""
    calls: int = 0
    durations: list[float] = field(default_factory=list)  # a sample of the non-hung calls, for the distribution
    hung: list[tuple[float, int, str]] = field(default_factory=list)  # (ms, start ns, trace id), examples
    hung_count: int = 0
    timeouts: list[tuple[float, int, str]] = field(default_factory=list)
    timeout_count: int = 0
    timeout_seen: bool = False
    threshold_ms: float = 0.0
    pending: list[tuple[float, int, str]] = field(default_factory=list)  # past the floor before a distribution


@dataclass(frozen=True, slots=True)
class Baseline:
    samples: int
    p50: float
    p95: float
    p99: float


def finding(hop: Hop, w: HopWindow, base: Baseline, window: tuple[str, int], factor: float,
            floor_ms: float) -> FindingEvent:  # fmt: skip
    """The finding of a hop's hung (or unanswered timed-out) calls in one window."""
    service, operation, callee = hop
    window_id, end_ns = window
    fp = hang_fingerprint(hop)
    examples = sorted(w.hung + w.timeouts, key=lambda h: (h[1], h[2]))
    hangs = w.hung_count >= w.timeout_count
    remedy = "add_timeout" if hangs else "propagate_deadline"
    evidence = []
    if w.hung_count:
        evidence.append(
            f"{w.hung_count} of {w.calls} calls from {service} {operation} to {callee} ended after more than "
            f"{w.threshold_ms:.0f} ms (max({factor:g} x the hop's recent p99 {base.p99:.3g} ms, floor "
            f"{floor_ms:.0f} ms)) without an error; the longest took {max(h[0] for h in w.hung):.0f} ms"
        )
        evidence.append(f"recent distribution of the hop: p50 {base.p50:.3g} ms, p95 {base.p95:.3g} ms, p99 "
                        f"{base.p99:.3g} ms over {base.samples} calls")  # fmt: skip
        evidence.append("no client timeout ended these calls: " + ("the caller timed out on others in the window"
                        if w.timeout_seen else "no call of this hop timed out in the window"))  # fmt: skip
    if w.timeout_count:
        evidence.append(f"{w.timeout_count} of {w.calls} calls from {service} {operation} to {callee} ended at a "
                        f"client timeout while {callee} never answered (no server span)")  # fmt: skip
    data = HangData(
        service=service, operation=operation, callee=callee, window=window_id, calls=w.calls, hung=w.hung_count,
        timeouts=w.timeout_count, timeout_seen=w.timeout_seen, threshold_ms=round(w.threshold_ms, 3),
        factor=factor, floor_ms=floor_ms, baseline_samples=base.samples, baseline_p50_ms=round(base.p50, 3),
        baseline_p95_ms=round(base.p95, 3), baseline_p99_ms=round(base.p99, 3),
        hung_ms=[round(h[0], 1) for h in sorted(w.hung)[-MAX_EXAMPLES:]],
        timeout_ms=[round(h[0], 1) for h in sorted(w.timeouts)[-MAX_EXAMPLES:]],
        longest_ms=round(max(h[0] for h in examples), 1),
    )  # fmt: skip
    series = [Series(name=f"{callee} call durations", x_label="call start (Unix ms)", y_label="duration (ms)",
                     points=[Point(x=s / MS_NS, y=round(ms, 1)) for ms, s, _ in examples])]  # fmt: skip
    first = min(s for _, s, _ in examples) / MS_NS
    return FindingEvent(
        fingerprint=fp, occurrence=hashlib.sha256(f"{fp}|{window_id}".encode()).hexdigest()[:16],
        detected_at_unix_ms=end_ns / MS_NS, type=TYPE,
        title=f"Hang: {service} {operation} -> {callee}: {w.hung_count + w.timeout_count} call(s) "
        + ("with no timeout" if hangs else "timed out, never answered"),
        subject=Subject(service=service, operation=operation, entity=callee, version=w.version), severity="high",
        remedy=remedy, evidence=evidence, data=data.model_dump(), series=series,
        traces=list(dict.fromkeys(t for _, _, t in examples))[:20], first_seen_unix_ms=first,
        last_seen_unix_ms=max(s + ms * MS_NS for ms, s, _ in examples) / MS_NS,
        affected=max(1, w.hung_count + w.timeout_count),
        contract=ContractRules(signature=f"finding:{TYPE}:{fp}", service=service, routes=[operation]),
    )  # fmt: skip
