"""Tumbling-window lookups and the input they retain: the window a trace falls in holds every input that fed it,
whether it is looked up afresh or is the one the previous lookup retained."""

from __future__ import annotations

from processors.api.telemetry import Telemetry
from processors.state.windows import TumblingWindows
from streamer.runtime.pins import PinTracker

SIZE = 100
TP = ("otlp_spans", 0)
OTHER = ("otlp_spans", 1)


def windows(tracker: PinTracker, max_windows: int = 1_000) -> TumblingWindows[list[int]]:
    return TumblingWindows("w", SIZE, 0, lambda _start: [], max_windows=max_windows,
                           telemetry=Telemetry("w"), events=tracker)  # fmt: skip


def test_each_lookup_of_the_same_window_retains_its_input() -> None:
    """Successive traces of one window, from two partitions: the window holds the oldest offset of each (what the
    commit waits for), the same aggregate every time; once closed it releases them, and a lookup is late."""
    t = PinTracker()
    w = windows(t)
    seen = []
    for source in ((TP, 5), (TP, 6), (OTHER, 9), (OTHER, 3), (TP, 2)):
        t.feeding(source)
        seen.append(w.at(150))
    assert all(v is seen[0] for v in seen)
    assert t.held("w", 100) == {(TP, 2), (OTHER, 3)}
    t.feeding(None)
    assert [c.start_ns for c in w.close_until(10_000)] == [100]
    t.release(t.take_released())
    assert t.total() == 0
    t.feeding((TP, 7))
    assert w.at(150) is None and t.total() == 0
    assert w.telemetry.dropped["w_late"] == 1


def test_a_window_looked_up_again_stays_the_most_recent() -> None:
    """Past ``max_windows`` the least recently looked-up window goes: a window looked up twice in a row is the most
    recent one, an older one looked up again moves back to the end."""
    t = PinTracker()
    w = windows(t, max_windows=2)
    t.feeding((TP, 1))
    a = w.at(0)
    w.at(100)
    assert w.at(0) is a and w.at(0) is a
    w.at(200)  # evicts the window at 100, the least recently looked up
    t.release(t.take_released())
    assert t.held("w", 0) == {(TP, 1)} and t.held("w", 100) == frozenset() and len(w) == 2
