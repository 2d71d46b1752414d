"""Incidents say what sampling their parties' traces were kept with, and how likely a pair like theirs is seen."""

from __future__ import annotations

from dataclasses import replace

import pytest

from processors.detectors.collisions.detector import CollisionDetector
from processors.detectors.collisions.incident import incident_event
from processors.model.events import Access, Commit, DbOperation, Resource, SpanKind, StatusCode
from processors.model.outputs import IncidentEvent
from processors.model.sampling import Sampling
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline.accesses import with_request
from tests.processors.test_collisions import T0, acc, change, detector, judge

MS = 1_000_000


def _lost_update(culprit: float | None, victim: float | None) -> IncidentEvent:
    """r1 r2 w1 w2 on orders:1 (as test_collisions), each trace kept with the given probability."""
    d: CollisionDetector = detector()
    a = [replace(x, trace_sampling=culprit) for x in (acc("a", DbOperation.READ, 0), acc("a", DbOperation.WRITE, 5))]
    b = [replace(x, trace_sampling=victim) for x in (acc("b", DbOperation.READ, 2), acc("b", DbOperation.WRITE, 9))]
    d.on_commit("orders:1", Commit(change(10, {"status": "p"}, {"status": "c"}, 6), "a" * 32, "", "tx_id"))
    d.on_commit("orders:1", Commit(change(11, {"status": "c"}, {"status": "x"}, 10), "b" * 32, "", "tx_id"))
    [c] = judge(d, [a[0], b[0], a[1], b[1]])
    return incident_event(c, T0 + 10_000 * MS)


def test_both_parties_sampled_give_the_pair_probability_and_a_line_of_evidence() -> None:
    """Culprit kept at 0.1, victim at 0.5: a pair like this is seen with probability 0.05, twenty per one seen."""
    e = _lost_update(0.1, 0.5)
    assert (e.culprit.sampling, e.victim.sampling) == (0.1, 0.5)
    assert e.pair_probability == pytest.approx(0.05) and e.pair_sampling_known
    [line] = [x for x in e.evidence if x.startswith("sampling:")]
    assert "probability 0.1, the victim's with 0.5" in line and "0.05" in line and "about 20 such" in line


def test_unknown_sampling_is_said_and_not_taken_for_one() -> None:
    """A party without sampling information is ``None`` (unknown), the pair probability an upper bound."""
    e = _lost_update(0.25, None)
    assert (e.culprit.sampling, e.victim.sampling) == (0.25, None)
    assert e.pair_probability == 0.25 and not e.pair_sampling_known
    [line] = [x for x in e.evidence if x.startswith("sampling:")]
    assert "the victim's with unknown" in line and "at most (unknown counted as 1)" in line


def test_unsampled_incidents_are_unchanged_but_for_the_defaults() -> None:
    """No sampling information anywhere: no evidence line, probability 1, marked as not known."""
    e = _lost_update(None, None)
    assert e.culprit.sampling is None and e.pair_probability == 1.0 and not e.pair_sampling_known
    assert not [x for x in e.evidence if x.startswith("sampling:")]
    kept = _lost_update(1.0, 1.0)
    assert kept.pair_sampling_known and kept.pair_probability == 1.0
    assert not [x for x in kept.evidence if x.startswith("sampling:")]


def test_an_access_is_stamped_with_its_traces_sampling() -> None:
    """Stage 1 stamps every access of a trace with the probability its root span states (what stage 2 judges)."""
    res = Resource("shop", "1", "test", "")
    root = Span("a" * 32, "1" * 16, "", "POST /pay", SpanKind.SERVER, T0, T0 + MS, StatusCode.UNSET, res,
                sampling=Sampling(0.5, "tracestate"))  # fmt: skip
    access = Access("orders:1", "orders", DbOperation.WRITE, acc("a", DbOperation.WRITE, 0).lock, "a" * 32, "2" * 16,
                    "shop", "1", T0, T0 + MS, "UPDATE orders SET s = 1 WHERE id = 1")  # fmt: skip
    [stamped] = with_request(ClosedTrace("a" * 32, (root,)), [access])
    assert stamped.trace_sampling == 0.5
