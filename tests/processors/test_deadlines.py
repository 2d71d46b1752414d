"""``Deadlines``: one event-time deadline per key, moved earlier or later, due in order of the deadline in force."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from processors.state.keyed import Deadlines


def test_a_deadline_moved_later_is_due_then_not_before() -> None:
    d: Deadlines[str] = Deadlines()
    d.set("a", 10)
    d.set("a", 30)
    d.set("b", 20)
    assert d.due(15) == [] and d.earliest() == (20, "b")
    assert d.due(25) == ["b"] and d.earliest() == (30, "a")
    assert d.due(30) == ["a"] and len(d) == 0 and d.earliest() is None


def test_moving_a_deadline_later_again_and_again_keeps_one_entry() -> None:
    """An open trace's deadline moves with each span: the heap holds one entry for it, not one per span."""
    d: Deadlines[str] = Deadlines()
    for at in range(1, 1_001):
        d.set("trace", at)
    assert len(d._heap) == 1 and d.due(999) == [] and d.due(1_000) == ["trace"]


def test_a_deadline_moved_later_then_back_keeps_one_entry() -> None:
    """An open trace awaiting a parent: its deadline goes later (``max_request``) and back (the parent came) with
    each span, never before its first one: the heap holds one entry for it, due at the deadline in force."""
    d: Deadlines[str] = Deadlines()
    d.set("trace", 10)  # its first span
    for at in range(10, 1_010):
        d.set("trace", at + 5_000)  # awaiting
        d.set("trace", at)  # the parent came: back to the quiet deadline, later than the first
    assert len(d._heap) == 1 and d.due(1_008) == [] and d.earliest() == (1_009, "trace")
    assert d.due(1_009) == ["trace"] and not d._heap and d.earliest() is None


ops = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 50), st.sampled_from(["set", "extend",
                                                                                       "cancel", "due"])),
               max_size=60)  # fmt: skip


@given(ops)
def test_due_matches_a_plain_map_of_deadlines(steps: list[tuple[str, int, str]]) -> None:
    """Against a dict of the deadlines in force: every key is due at its latest deadline, earliest first."""
    d: Deadlines[str] = Deadlines()
    model: dict[str, int] = {}
    for key, at, op in steps:
        if op == "set":
            d.set(key, at)
            model[key] = at
        elif op == "extend":
            d.extend(key, at)
            model[key] = max(model.get(key, at), at)
        elif op == "cancel":
            d.cancel(key)
            model.pop(key, None)
        else:
            due = sorted((t, k) for k, t in model.items() if t <= at)
            got = d.due(at)
            assert got == [k for _, k in due] or sorted(got) == sorted(k for _, k in due)
            assert [model[k] for k in got] == sorted(model[k] for k in got)
            for k in got:
                del model[k]
        assert len(d) == len(model)
        first = min(((t, k) for k, t in model.items()), default=None)
        earliest = d.earliest()
        assert (earliest is None) == (first is None)
        if earliest is not None and first is not None:
            assert earliest[0] == first[0] and model[earliest[1]] == first[0]


def test_many_random_moves_end_due_at_their_last_deadline() -> None:
    rng = random.Random(7)
    d: Deadlines[int] = Deadlines()
    last: dict[int, int] = {}
    for _ in range(5_000):
        key, at = rng.randrange(200), rng.randrange(10_000)
        d.set(key, at)
        last[key] = at
    seen = []
    for now in range(0, 10_001, 37):
        seen += [(last[k], k) for k in d.due(now)]
        assert all(t <= now for t, _ in seen)
    assert sorted(k for _, k in seen) == sorted(last) and [t for t, _ in seen] == sorted(t for t, _ in seen)
