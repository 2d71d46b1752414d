"""KeyedState's byte bound: the sizes its owner reports, evicted least recently retained first, counted."""

from __future__ import annotations

import pytest

from processors.state.keyed import KeyedState


def test_sizes_past_the_byte_bound_evict_the_least_recently_retained_and_count_them() -> None:
    """Big items keep the reported total under the bound, evicting (through on_evict, like the item bound) the
    least recently retained keys; a replaced value replaces its size; charge grows a key; discard releases it."""
    evicted: list[str] = []
    state: KeyedState[str, str] = KeyedState("pending", bound=100, new=str, max_bytes=1_000, bytes_reason="max_b",
                                             on_evict=lambda k, _v: evicted.append(k))  # fmt: skip
    for i in range(10):
        state.put(f"k{i}", "v", 300)
        assert state.bytes <= 1_000
    assert (evicted, state.telemetry.dropped["max_b"], len(state)) == ([f"k{i}" for i in range(7)], 7, 3)
    assert state.telemetry.dropped["pending_bound"] == 0
    state.put("k9", "w", 100)  # replaced: its new size, not both
    assert state.bytes == 700
    state.retain("k7")  # k8 is now the least recently retained
    state.charge("k9", 500)
    assert (evicted[-1], state.bytes) == ("k8", 900)
    state.charge("k9", 5_000)  # least recently retained, and over the bound alone: it goes
    assert (evicted[-1], list(state), state.bytes) == ("k9", ["k7"], 300)
    state.charge("k7", 5_000)  # the last key, alone over the bound: it goes too
    assert (evicted[-1], len(state), state.bytes) == ("k7", 0, 0)
    state.put("a", "v", 10)
    state.discard("a")
    assert state.bytes == 0
    with pytest.raises(KeyError):
        state.charge("gone", 1)


def test_without_sizes_or_under_the_bound_nothing_changes() -> None:
    """Items reported small, or not sized at all, are bounded by count alone, as without a byte bound."""
    for max_bytes in (None, 1 << 20):
        state: KeyedState[int, int] = KeyedState("s", bound=3, new=int, max_bytes=max_bytes)
        for i in range(5):
            state.put(i, i, 10)
        assert (list(state), state.telemetry.dropped["s_bound"]) == ([2, 3, 4], 2)
        assert state.telemetry.dropped.get("s_bytes", 0) == 0
