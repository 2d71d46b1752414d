"""Watermarks: per-partition event time, minimum over active partitions, idleness driven by an injected clock."""

from __future__ import annotations

from processors.state.watermarks import UpstreamWatermarks, Watermarks
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


def test_all_idle_catches_up_with_the_clock_from_the_newest_event() -> None:
    """When every partition is idle, event time is the newest event plus the wall time since the last input:
    idle time and lateness do not stack on top of each other."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 40 * S)
    wm.observe(P1, T + 100 * S)
    clock.advance(29)
    assert wm.current() == T + 35 * S  # still active: the minimum minus the lateness
    clock.advance(1)  # both idle now, for exactly the timeout
    assert wm.current() == T + 130 * S
    clock.advance(12)
    assert wm.current() == T + 142 * S


def test_all_idle_counts_from_the_most_recently_seen_partition() -> None:
    """The catch-up starts once the last partition to speak has been idle for idle_s, from that moment on."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 100 * S)
    clock.advance(10)
    wm.observe(P1, T + 40 * S)
    clock.advance(20)  # P0 idle, P1 active
    assert wm.current() == T + 35 * S
    clock.advance(10)  # both idle, P1 for exactly 30 s
    assert wm.current() == T + 130 * S
    clock.advance(5)
    assert wm.current() == T + 135 * S


def test_a_silent_partition_with_a_backlog_is_not_idle() -> None:
    """Once the runtime reports progress, only a partition read to its end can be idle: one that is silent because
    its backlog waits (behind another partition, a rebalance, a broker outage) keeps holding the others back."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 100 * S)
    wm.observe(P1, T + 40 * S)
    wm.progress({P0})  # P1 has more to deliver
    clock.advance(31)
    wm.observe(P0, T + 131 * S)
    assert wm.current() == T + 35 * S  # silent for 31 s, but behind: still the minimum
    wm.progress({P0, P1})  # P1 read to its end: silence now is idleness
    assert wm.current() == T + 126 * S


def test_nothing_caught_up_never_follows_the_clock() -> None:
    """Every partition silent and none read to its end (a broker outage, a stalled rebalance): event time stays
    where the data left it instead of following the wall clock past what is still to come."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 100 * S)
    wm.observe(P1, T + 90 * S)
    wm.progress(())
    clock.advance(120)
    assert wm.current() == T + 85 * S
    assert wm.observe(P1, T + 91 * S) is False  # what the outage held back is on time when it comes
    wm.progress({P0, P1})
    assert wm.current() == T + 86 * S  # P1 just spoke: active
    clock.advance(30)
    assert wm.current() == T + 130 * S  # caught up and silent: the catch-up resumes from P1's last input


def test_a_partition_assigned_and_never_fetched_holds_back() -> None:
    """A newly assigned partition whose first fetch has not come back holds event time at zero however long it
    takes (its committed offset may be far behind); once read to its end and silent it stops."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 100 * S)
    wm.assign(P1)
    wm.progress({P0})
    clock.advance(60)
    wm.observe(P0, T + 160 * S)
    assert wm.current() == 0
    wm.progress({P0, P1})
    assert wm.current() == T + 155 * S


def test_input_behind_an_idle_catch_up_is_late() -> None:
    """Events older than where the idle catch-up took event time are late when they arrive."""
    clock = FakeClock()
    wm = Watermarks(LATE, IDLE, clock)
    wm.observe(P0, T + 100 * S)
    clock.advance(40)
    assert wm.current() == T + 140 * S
    assert wm.observe(P0, T + 120 * S) is True
    assert wm.observe(P0, T + 150 * S) is False


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


def test_upstream_is_the_minimum_over_upstream_partitions_and_expires_stale_ones() -> None:
    """A downstream stage follows the slowest upstream input partition, never backwards; stale ones stop counting."""
    clock = FakeClock()
    up = UpstreamWatermarks(60 * S, clock)
    assert up.current() == 0  # no upstream: no event time
    up.update("otlp_spans/0", T + 10 * S)
    up.update("otlp_spans/1", T + 4 * S)
    assert up.current() == T + 4 * S
    up.update("otlp_spans/1", T + 2 * S)  # an older report changes nothing
    assert up.current() == T + 4 * S
    clock.advance(59)
    up.update("otlp_spans/0", T + 20 * S)
    assert up.current() == T + 4 * S
    clock.advance(1)  # otlp_spans/1 not refreshed for 60 s: nobody owns it any more
    assert up.current() == T + 20 * S
    up.update("otlp_spans/1", T + 6 * S)  # its new owner starts behind: event time does not move back
    assert up.current() == T + 20 * S


def test_seen_once_a_partition_delivered() -> None:
    """Owned partitions are known from assignment; seen only once one of them delivered an event."""
    wm = Watermarks(LATE, IDLE, FakeClock())
    wm.assign(P1)
    assert wm.owns(P1) and not wm.owns(P0) and not wm.seen()
    wm.observe(P0, T)
    assert wm.seen() and wm.owns(P0)
