"""Time units. OTLP carries nanoseconds (``*_ns``), Debezium milliseconds (``*_ms``); config uses seconds."""

from __future__ import annotations

import math

NS = 1_000_000_000  # nanoseconds per second
MS_NS = 1_000_000  # nanoseconds per millisecond


def s_to_ns(seconds: float) -> int:
    return int(seconds * NS)


def ms_to_ns(ms: float) -> int:
    return int(ms * MS_NS)


def ns_to_ms(ns: int) -> float:
    return ns / MS_NS


def ns_to_s(ns: int) -> float:
    return ns / NS


def zero_error_floor(p0: float, alpha: float = 0.05) -> int:
    """Requests without one error needed to show, at level ``alpha``, that a rate-``p0`` defect is gone:
    n >= ln(alpha) / ln(1 - p0) (the zero-error rule)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if p0 <= 0:
        raise ValueError(f"the baseline rate must be > 0, got {p0}")
    if p0 >= 1:
        return 1
    return max(1, math.ceil(math.log(alpha) / math.log1p(-p0) - 1e-9))
