"""The topology analytics as pure functions on known topologies."""

from __future__ import annotations

from sinks.graph.topology import Edge, blast_radius, fan_out, ownership, peak_writers, shares, shifts


def test_single_points_of_failure_are_on_every_path_to_every_leaf() -> None:
    """a -> b -> {c, d} -> e: b is on every path (c and d are alternatives); a -> x adds a leaf that avoids b."""
    diamond = [Edge("a", "b", 10), Edge("b", "c", 5), Edge("b", "d", 5), Edge("c", "e", 5), Edge("d", "e", 5)]
    f = fan_out(diamond, "a")
    assert (f.single_points_of_failure, f.leaves, f.depth["e"]) == (["b", "e"], ["e"], 3)
    assert fan_out([*diamond, Edge("a", "x", 1)], "a").single_points_of_failure == []
    assert fan_out([Edge("a", "b", 1), Edge("b", "a", 1)], "a").single_points_of_failure == []  # a cycle, no leaf
    assert fan_out(diamond, "nobody").reachable == []


def test_blast_radius_propagates_call_shares_upstream() -> None:
    """Half of a's calls go to b, which always calls db: a depends on db through b for half its calls."""
    deps = blast_radius([Edge("a", "b", 5), Edge("a", "c", 5), Edge("b", "db", 3)], "db")
    assert [(d.service, d.hops, d.direct_calls, d.reach_share) for d in deps] == [("b", 1, 3, 1.0), ("a", 2, 0, 0.5)]


def test_critical_path_ownership_sums_contributions_and_shifts() -> None:
    owned = ownership(['{"api": 300, "db": 100}', '{"db": 600}', None])
    assert owned == {"api": 300, "db": 700}
    assert shares(owned) == {"db": 0.7, "api": 0.3}
    assert shifts({"api": 0.6, "db": 0.4}, {"db": 0.9, "cache": 0.1})[0] == {
        "owner": "api", "before": 0.6, "after": 0.0, "delta": -0.6}  # fmt: skip


def test_peak_writers_counts_distinct_traces_in_any_interval() -> None:
    writes = [("t1", 0.0), ("t1", 5.0), ("t2", 8.0), ("t3", 50.0), ("t4", 55.0), ("t5", 58.0)]
    assert peak_writers(writes, 10.0) == 3
    assert peak_writers(writes, 1.0) == 1
    assert peak_writers([], 10.0) == 0
