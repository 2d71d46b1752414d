"""Event-time settings of the stages: windows, lateness, trace assembly, idleness (``[windows]``)."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class WindowConfig(Section):
    """Event-time bounds: windows, lateness, trace assembly."""

    window_s: float = Field(60.0, gt=0, description="length of aggregate windows (CALLS edges, stats)")
    allowed_lateness_s: float = Field(5.0, ge=0, description="watermark = max event time - this")
    trace_gap_s: float = Field(10.0, gt=0, description="a trace closes after this much event-time inactivity")
    max_request_s: float = Field(
        120.0,
        gt=0,
        description="a trace whose spans await an in-process parent (a request still running: its children are "
        "exported before it) stays open up to this long after its start; closing it there is counted "
        "(max_request_duration)",
    )
    max_open_traces: int = Field(200_000, ge=1, description="bound on traces being assembled")
    max_spans_per_trace: int = Field(5_000, ge=1, description="spans kept per trace; the rest are dropped (counted)")
    max_open_trace_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="bytes of spans held by open traces (a span's encoded size, or its text, plus a fixed cost): "
        "past it the least recently fed traces close early, as at max_open_traces (counted max_open_trace_bytes)",
    )
    max_windows: int = Field(1_000, ge=2, description="open windows per aggregate; the oldest is dropped (counted)")
    idle_s: float = Field(5.0, gt=0, description="wall time without input after which event time follows the clock")
    max_future_skew_s: float = Field(
        300.0, gt=0, description="a span or commit further ahead of the wall clock is dropped (counted, dead-lettered)"
    )
    max_span_duration_s: float = Field(
        86_400.0, gt=0, description="a span longer than this (or ending before it starts) is dropped (counted)"
    )
    max_cdc_lag_s: float = Field(
        60.0,
        ge=0,
        description="stage 2: how far Debezium may lag behind the spans and a late row change still be "
        "credited to its writer and judged with its row (a write and its row's history are kept until its change "
        "comes, at most this long); a later one is written uncorrelated and counted (late_past_history)",
    )
    upstream_expiry_s: float = Field(
        60.0, gt=0, description="stage 2: an upstream partition not reported for this long stops holding event time"
    )
