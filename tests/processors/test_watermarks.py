"""Watermarks: per-partition event time, minimum over active partitions, idleness driven by an injected clock."""

from __future__ import annotations

from processors.watermarks import Watermarks
from tests.fake_clock import FakeClock

S = 1_000_000_000
LATE = 5 * S
IDLE = 30 * S
P0 = ("otlp_spans", 0)
P1 = ("otlp_spans", 1)
P2 = ("shop.public.orders", 0)
T = 1_700_000_000 * S  # event times


def test_zero_before_any_event() -> None:
    """With no partition seen the watermark is 0 and nothing is late."""
    wm = Watermarks(LATE, IDLE, FakeClock())
    assert wm.current() == 0
    assert wm.observe(P0, T) is False
    assert wm.late_events == 0


def test_single_partition_is_max_event_minus_lateness() -> None:
    """One partition: the watermark is its largest event time minus the allowed lateness, never moving back."""
    wm = Watermarks(LATE, IDLE, FakeClock())
    wm.observe(P0, T + 10 * S)
    assert wm.current() == T + 5 * S
    wm.observe(P0, T + 8 * S)  # an older event does not move it back
    assert wm.current() == T + 5 * S
    wm.observe(P0, T + 20 * S)
    assert wm.current() == T + 15 * S


def test_minimum_over_active_partitions() -> None:
    """Several active partitions: the slowest one sets the watermark."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 100 * S)
    wm.observe(P1, T + 40 * S)
    wm.observe(P2, T + 70 * S)
    assert wm.current() == T + 35 * S
    wm.observe(P1, T + 90 * S)
    assert wm.current() == T + 65 * S


def test_idle_partition_stops_holding_back() -> None:
    """A partition silent for idle_s of wall time no longer holds back the active ones."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 40 * S)
    wm.observe(P1, T + 100 * S)
    clock.advance(29)
    wm.observe(P1, T + 110 * S)
    assert wm.current() == T + 35 * S  # P0 silent for 29 s: still active
    clock.advance(1)
    assert wm.current() == T + 105 * S  # P0 silent for 30 s: idle
    assert wm.observe(P0, T + 50 * S) is True  # when it speaks again, its old event time is late


def test_all_idle_advances_with_the_clock_after_the_idle_timeout() -> None:
    """When every partition is idle, event time follows the wall clock from the newest event on."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 40 * S)
    wm.observe(P1, T + 100 * S)
    clock.advance(30)  # both idle now, for exactly the timeout
    assert wm.current() == T + 95 * S  # the newest partition's watermark, not the minimum
    clock.advance(12)
    assert wm.current() == T + 107 * S
    clock.advance(100)
    assert wm.current() == T + 207 * S


def test_all_idle_counts_from_the_most_recently_seen_partition() -> None:
    """The clock-driven advance starts only once the last partition to speak has been idle for idle_s."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 100 * S)
    clock.advance(10)
    wm.observe(P1, T + 40 * S)
    clock.advance(20)  # P0 idle, P1 active
    assert wm.current() == T + 35 * S
    clock.advance(10)  # both idle, P1 for exactly 30 s
    assert wm.current() == T + 95 * S
    clock.advance(5)
    assert wm.current() == T + 100 * S


def test_late_detection() -> None:
    """An event behind the current watermark is late (and counted); one at or ahead of it is not."""
    wm = Watermarks(LATE, IDLE, FakeClock())
    assert wm.observe(P0, T + 100 * S) is False
    assert wm.observe(P0, T + 95 * S) is False  # exactly at the watermark
    assert wm.observe(P0, T + 95 * S - 1) is True
    assert wm.observe(P0, T + 10 * S) is True
    assert wm.late_events == 2
    assert wm.current() == T + 95 * S  # late events do not move the watermark


def test_late_against_other_partitions() -> None:
    """An event is late relative to the stage watermark, which another partition may hold."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 100 * S)
    wm.observe(P1, T + 200 * S)
    assert wm.current() == T + 95 * S
    assert wm.observe(P1, T + 96 * S) is False
    assert wm.observe(P1, T + 94 * S) is True
    assert wm.late_events == 1


def test_forget_removes_a_partition() -> None:
    """A revoked partition no longer holds the watermark back."""
    wm = Watermarks(LATE, IDLE, FakeClock())
    wm.observe(P0, T + 40 * S)
    wm.observe(P1, T + 100 * S)
    wm.forget(P0)
    assert wm.current() == T + 95 * S
    wm.forget(P1)
    assert wm.current() == 0
