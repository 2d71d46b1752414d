"""The regression tests in stage 2 on every stage-1 instance's share of a window (``--workers N``).

Two stage-1 halves (``Regressions``) each count the spans partition they own and relay their shares; the entities
stage (with the default components, so the judge is the one the daemon builds) merges them through the internal
topic's codec and tests each window once its upstream event time has passed the window's end plus the trace gap.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest

from processors.api.component import Emit
from processors.detectors.regressions import RegressionConfig, RegressionDetector, Regressions
from processors.detectors.regressions.detector import DetectorSettings
from processors.detectors.regressions.shares import KEY
from processors.model.events import Relay
from processors.model.regression import RegressionEvent
from processors.model.trace import ClosedTrace
from processors.state.config import WindowConfig
from streamer import config
from streamer.components import default
from streamer.decode import internal as wire
from streamer.runtime.context import stage_processors
from streamer.runtime.entities import EntityStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import Record, StageOutput
from tests.fake_clock import FakeClock
from tests.regressions.builders import MS, T0, S, request

WINDOWS = WindowConfig()  # the shipped event time: 60 s windows, closed a 10 s trace gap after their end
SIZE = int(WINDOWS.window_s * S)
GAP = int(WINDOWS.trace_gap_s * S)
TOPIC = "trace-repro.accesses"
SIG = "error:POST /split/even:RoundingError"
PARTS = ("otlp_spans/0", "otlp_spans/1")


def traffic(window: int, version: str, n: int, errors: int) -> list[ClosedTrace]:
    """``n`` requests of ``version`` over window ``window``, dealt alternately to the two spans partitions; the
    first ``errors`` fail (half of them on each partition)."""
    base = T0 + window * SIZE
    out = []
    for i in range(n):
        trace = request(base + i * (SIZE // (n + 1)), version, dur_ms=10.0 + i % 7,
                        exception="RoundingError" if i < errors else "")  # fmt: skip
        out.append(replace(trace, part=PARTS[i % 2]))
    return out


def halves(*batches: list[ClosedTrace]) -> list[list[Relay]]:
    """Each spans partition's stage-1 instance: its share of every closed window, relayed; per instance."""
    windows = WINDOWS
    out = []
    for part in PARTS:
        stage1 = Regressions(RegressionConfig(), windows)
        relays: list[Relay] = []
        for i, batch in enumerate(batches):
            for trace in batch:
                if trace.part == part:
                    stage1.on_trace(trace, ())
            emit = Emit()
            stage1.on_watermark(T0 + (i + 1) * SIZE + GAP, None, emit)
            assert not emit.events  # stage 1 tests nothing itself
            relays += emit.relays
        out.append(relays)
    return out


class Stage2:
    """The entities stage with the daemon's components, fed relay and watermark records on internal partition 0."""

    def __init__(self) -> None:
        self.settings = config.load(None, env={})
        assert self.settings.windows == WINDOWS
        self.clock = FakeClock(T0 + 3600 * S)
        self.metrics = Metrics()
        self.tracker = PinTracker()
        processors = stage_processors(self.settings, self.metrics, self.clock, "entities", self.tracker,
                                      default().factories)  # fmt: skip
        self.stage = EntityStage(self.settings, self.metrics, self.clock, tracker=self.tracker, processors=processors)
        self.offsets = itertools.count()
        self.events: list[RegressionEvent] = []

    def feed(self, values: Sequence[tuple[bytes | None, bytes]], partition: int = 0) -> StageOutput:
        records = [Record(TOPIC, partition, next(self.offsets), key, value) for key, value in values]
        out = self.stage.process(records)
        self.events += [e for e in out.events if isinstance(e, RegressionEvent)]
        return out

    def relay(self, *relays: Relay) -> StageOutput:
        return self.feed([(r.key.encode(), wire.encode_relay(r)) for r in relays])

    def upstream(self, at_ns: int, partition: int = 0) -> StageOutput:
        """Both spans partitions promised up to ``at_ns`` (read in internal partition ``partition``)."""
        return self.feed([(None, wire.encode_watermark(wire.Watermark(at_ns, PARTS)))], partition)

    def dropped(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value("trace_repro_dropped_total",
                                                       {"component": "regressions", "reason": reason})  # fmt: skip
        return value or 0.0


def test_two_instances_shares_are_tested_together_where_neither_alone_could_be() -> None:
    """0.9 serves 40 clean requests, then 1.0 fails 12 of 40, split over two instances (20 a side each). Alone, each
    has fewer than min_requests (30) a side: insufficient, no regression. The judge tests all 40 against 40:
    conditional binomial p = 0.5**12, one regression, its evidence counting both instances."""
    batches = [traffic(0, "0.9", 40, 0), traffic(1, "1.0", 40, 12)]
    alone = []
    for part in PARTS:
        detector = RegressionDetector(DetectorSettings())
        stage1 = Regressions(RegressionConfig(), WINDOWS)
        for i, batch in enumerate(batches):
            for trace in batch:
                if trace.part == part:
                    stage1.on_trace(trace, ())
            for window in stage1.stats.close_until(T0 + (i + 1) * SIZE + GAP):
                findings = detector.on_window(window)
                alone += findings.regressions
                assert i == 0 or {i.reason.split(";")[0] for i in findings.insufficient} == {
                    "20 requests now and 20 in the version"
                }
    assert alone == []

    a, b = halves(*batches)
    assert a and b and {r.key for r in a + b} == {KEY}
    s2 = Stage2()
    s2.relay(*a[:1], *b[:1])  # window 0's shares
    s2.upstream(T0 + SIZE + GAP - 1)
    assert s2.events == []  # not yet past end + gap: another instance's share may be on its way
    s2.upstream(T0 + SIZE + GAP)
    s2.relay(*a[1:], *b[1:])
    s2.upstream(T0 + 2 * SIZE + GAP)
    [event] = s2.events
    assert (event.version, event.previous_version, event.signature) == ("1.0", "0.9", SIG)
    [evidence] = [e for e in event.evidence if e.comparison == "version"]
    assert (evidence.before_requests, evidence.after_requests, evidence.after_errors) == (40, 40, 12)
    assert evidence.p_value == pytest.approx(0.5**12)
    assert event.window == f"{(T0 + SIZE) // MS}-{(T0 + 2 * SIZE) // MS}"


def test_a_share_relayed_again_counts_once_and_a_partial_replay_does_not_shrink_it() -> None:
    """A stage-1 instance replaying uncommitted input relays its shares again (the same, or from the middle of the
    window: fewer requests). The window counts each (partition, operation, version) once, the fuller share."""
    batches = [traffic(0, "0.9", 40, 0), traffic(1, "1.0", 40, 12)]
    a, b = halves(*batches)
    partial, _ = halves(traffic(0, "0.9", 40, 0), traffic(1, "1.0", 20, 12))
    s2 = Stage2()
    s2.relay(*a[:1], *b[:1], *a[:1])
    s2.upstream(T0 + SIZE + GAP)
    s2.relay(*a[1:], *b[1:], *partial[1:], *b[1:])
    s2.upstream(T0 + 2 * SIZE + GAP)
    [event] = s2.events
    [evidence] = [e for e in event.evidence if e.comparison == "version"]
    assert (evidence.before_requests, evidence.after_requests, evidence.after_errors) == (40, 40, 12)
    assert s2.dropped("shares_replayed") == 3


def test_a_share_for_a_tested_window_is_late_and_a_bad_one_is_dead_lettered() -> None:
    """A share arriving after its window was tested is counted late and left out; a share that does not validate
    goes to the dead-letter topic with its reason, and the stage goes on."""
    a, b = halves(traffic(0, "0.9", 80, 0), traffic(1, "1.0", 40, 12))
    s2 = Stage2()
    s2.relay(*a[:1])
    s2.upstream(T0 + SIZE + GAP)
    s2.relay(*b[:1])
    assert s2.dropped("judge_late") == 1
    at, good = a[1].at_ns, a[1].body
    bad = [dict(good, requests=-1), dict(good, bins=[1, 2]), dict(good, start_ns=good["start_ns"] + 1),
           dict(good, end_ns=at + SIZE, start_ns=at)]  # fmt: skip
    out = s2.relay(*[Relay("regressions", KEY, at, body) for body in bad])
    future = Relay("regressions", KEY, s2.clock.now + 3600 * S, dict(a[1].body))  # beyond the clock: never closes
    out.produce += s2.relay(future).produce
    assert [dict(m.headers)["reason"] for m in out.produce if m.topic == s2.settings.kafka.dlq_topic] == [
        b"internal_invalid"] * 4 + [b"clock_skew"]  # fmt: skip
    assert s2.metrics.registry.get_sample_value("trace_repro_dlq_messages_total", {"reason": "internal_invalid"}) == 4
    s2.relay(*a[1:], *b[1:])
    s2.upstream(T0 + 2 * SIZE + GAP)
    [evidence] = [e for e in s2.events[0].evidence if e.comparison == "version"]
    assert (evidence.before_requests, evidence.after_requests) == (40, 40)  # window 0 without the late share


def test_shares_hold_their_records_until_their_window_is_tested() -> None:
    """A crash before the window is tested replays its shares: their records are not committable until then."""
    a, b = halves(traffic(0, "0.9", 40, 0))
    s2 = Stage2()
    s2.relay(*a, *b)
    out = s2.upstream(T0 + SIZE + GAP - 1)
    s2.stage.release(out.release)
    assert s2.stage.committable((TOPIC, 0), 3) == 0
    out = s2.upstream(T0 + SIZE + GAP)
    s2.stage.release(out.release)
    assert s2.stage.committable((TOPIC, 0), 4) == 4


def test_shares_of_a_revoked_partition_are_left_to_its_next_owner() -> None:
    """The internal partition the shares came in goes to another stage-2 instance (a rebalance): it replays them
    and tests the window; this instance drops them, and publishes nothing for it when its event time moves on."""
    a, b = halves(traffic(0, "0.9", 40, 0), traffic(1, "1.0", 40, 12))
    s2 = Stage2()
    s2.relay(*a, *b)
    s2.upstream(T0 + SIZE + GAP)
    s2.stage.forget((TOPIC, 0))
    s2.upstream(T0 + 2 * SIZE + GAP, partition=1)
    assert s2.events == []
    replay = Stage2()  # the next owner, from the committed offset
    replay.relay(*a, *b)
    replay.upstream(T0 + SIZE + GAP)
    replay.upstream(T0 + 2 * SIZE + GAP)
    assert [e.signature for e in replay.events] == [SIG]
