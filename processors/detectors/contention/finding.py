"""The ``contention`` finding type: its data model, its registration and how a fit becomes a finding."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from processors.detectors.contention.fit import TEST, Fit
from processors.model.base import Frozen
from processors.model.finding import ContractRules, FindingEvent, FindingType, Point, Series, Subject, register_type
from processors.model.units import MS_NS

TYPE = "contention"
Operation = tuple[str, str]  # (service, operation)


class ContentionData(Frozen):
    """An operation's latency against its in-flight concurrency at start, the test and the fitted slope."""

    service: str
    operation: str
    window: str
    pairs: int
    windows: int
    test: str
    rho: float
    p_value: float
    alpha: float
    slope_ms_per_request: float  # Theil-Sen
    slope_low: float  # its 95 % interval
    slope_high: float
    intercept_ms: float
    concurrency_p10: float
    concurrency_p90: float
    latency_at_p10_ms: float  # fitted
    latency_at_p90_ms: float
    ratio: float


CONTENTION = FindingType(
    name=TYPE,
    title="Contention: latency rises with in-flight concurrency",
    description="An operation's latency rises with how many of its own requests are in flight when it starts, "
    "across windows: its requests wait for each other (a lock, a pool).",
    data=ContentionData,
    remedies=("reduce_lock_scope", "size_pool"),
    severity="medium",
)
register_type(CONTENTION)


def contention_fingerprint(op: Operation) -> str:
    """The operation, whatever build or window shows it: service and operation, no version. Persisted (issues are
    matched by it), so not :func:`~processors.findings.trace_windows.fingerprint_of`, which joins otherwise."""
    return hashlib.sha256("|".join((*op, TYPE)).encode()).hexdigest()[:16]


def finding(op: Operation, f: Fit, pairs: Sequence[tuple[int, int, float]], window: tuple[str, int, int],
            version: str, alpha: float, traces: list[str]) -> FindingEvent:  # fmt: skip
    """The finding of one operation's fit at the close of one window."""
    service, operation = op
    window_id, start_ns, end_ns = window
    fp = contention_fingerprint(op)
    levels: dict[int, list[float]] = {}
    for _, c, ms in pairs:
        levels.setdefault(c, []).append(ms)
    medians = [Point(x=c, y=round(sorted(v)[len(v) // 2], 3)) for c, v in sorted(levels.items())][:500]
    line = [Point(x=c, y=round(f.intercept + f.slope * c, 3)) for c in (f.c_low, f.c_high)]
    data = ContentionData(
        service=service, operation=operation, window=window_id, pairs=f.pairs, windows=f.windows, test=TEST,
        rho=round(f.rho, 4), p_value=f.p_value, alpha=alpha, slope_ms_per_request=round(f.slope, 4),
        slope_low=round(f.slope_low, 4), slope_high=round(f.slope_high, 4), intercept_ms=round(f.intercept, 3),
        concurrency_p10=f.c_low, concurrency_p90=f.c_high, latency_at_p10_ms=round(f.at_low_ms, 3),
        latency_at_p90_ms=round(f.at_high_ms, 3), ratio=round(f.ratio, 3),
    )  # fmt: skip
    evidence = [
        f"{operation} on {service}: latency rises with its own requests in flight at start over {f.pairs} requests "
        f"in {f.windows} windows: {TEST} rho = {f.rho:.3f}, p = {f.p_value:.3g} (alpha {alpha:g})",
        f"Theil-Sen slope {f.slope:.3g} ms per request in flight (95 % interval {f.slope_low:.3g} to "
        f"{f.slope_high:.3g}): fitted {f.at_low_ms:.3g} ms at {f.c_low:g} in flight (p10), {f.at_high_ms:.3g} ms at "
        f"{f.c_high:g} (p90), {f.ratio:.2f}x",
    ]
    return FindingEvent(
        fingerprint=fp, occurrence=hashlib.sha256(f"{fp}|{window_id}".encode()).hexdigest()[:16],
        detected_at_unix_ms=end_ns / MS_NS, type=TYPE,
        title=f"Contention: {service} {operation} slows {f.ratio:.1f}x as its requests pile up",
        subject=Subject(service=service, operation=operation, version=version), severity="medium",
        remedy="reduce_lock_scope", evidence=evidence, data=data.model_dump(),
        series=[Series(name="median latency by requests in flight", x_label="requests in flight at start",
                       y_label="latency (ms)", points=medians),
                Series(name="Theil-Sen fit", x_label="requests in flight at start", y_label="latency (ms)",
                       points=line)],
        traces=traces[:20], first_seen_unix_ms=start_ns / MS_NS, last_seen_unix_ms=end_ns / MS_NS,
        contract=ContractRules(signature=f"finding:{TYPE}:{fp}", service=service, routes=[operation]),
    )  # fmt: skip
