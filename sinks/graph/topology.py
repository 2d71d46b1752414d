"""Topology analytics over the graph's aggregates: pure functions of the rows :mod:`sinks.graph.analytics` reads.

- **Critical-path ownership** of an operation: the owned nanoseconds of its slowest requests (the ``path_ns`` of
  each stored contribution), summed per build and turned into shares, and how each owner's share moved between two
  builds (a deploy).
- **Fan-out and single points of failure** of an entry service on the ``CALLS`` graph: the services it reaches,
  each one's callees, and the services on *every* call path from the entry to a leaf (the dominators of every leaf
  reachable from it, the entry excluded: when one of them fails, no request of the entry completes its path).
- **Blast radius** of a service: every service that reaches it over ``CALLS``, how far, and which share of its
  outgoing calls lead (directly or through others) to the service, estimated by propagating call shares.
- **Peak concurrent writers** of a row: the most distinct traces writing it within any interval of a given length.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Edge:
    """Calls from one service to another, summed over the windows asked for."""

    caller: str
    callee: str
    count: int
    errors: int = 0


def ownership(path_ns_json: Iterable[str | None]) -> dict[str, int]:
    """Owned nanoseconds per owner, summed over stored ``path_ns`` contributions (JSON objects)."""
    owned: dict[str, int] = {}
    for doc in path_ns_json:
        for owner, ns in json.loads(doc or "{}").items():
            owned[owner] = owned.get(owner, 0) + int(ns)
    return owned


def shares(owned: Mapping[str, int]) -> dict[str, float]:
    """Shares of the total, largest first, rounded to 4 digits (empty when nothing is owned)."""
    total = sum(owned.values())
    if not total:
        return {}
    return {k: round(v / total, 4) for k, v in sorted(owned.items(), key=lambda kv: (-kv[1], kv[0]))}


def shifts(before: Mapping[str, float], after: Mapping[str, float]) -> list[dict[str, float | str]]:
    """Each owner's share before and after, the largest move first."""
    owners = set(before) | set(after)
    moves: list[dict[str, float | str]] = [{"owner": o, "before": before.get(o, 0.0), "after": after.get(o, 0.0),
              "delta": round(after.get(o, 0.0) - before.get(o, 0.0), 4)} for o in owners]  # fmt: skip
    return sorted(moves, key=lambda m: (-abs(float(m["delta"])), str(m["owner"])))


def _adjacency(edges: Iterable[Edge]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for e in edges:
        if e.caller == e.callee:
            continue  # a service calling itself does not make a path
        out.setdefault(e.caller, {})[e.callee] = out.get(e.caller, {}).get(e.callee, 0) + e.count
        out.setdefault(e.callee, {})
    return out


def _reachable(adj: Mapping[str, Mapping[str, int]], entry: str) -> list[str]:
    order, seen, stack = [], {entry}, [entry]
    while stack:
        node = stack.pop()
        order.append(node)
        for nxt in sorted(adj.get(node, {}), reverse=True):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return order


def _dominators(adj: Mapping[str, Mapping[str, int]], entry: str, nodes: Sequence[str]) -> dict[str, set[str]]:
    """The iterative dominator sets of the nodes reachable from ``entry``."""
    preds: dict[str, set[str]] = {n: set() for n in nodes}
    for n in nodes:
        for m in adj.get(n, {}):
            if m in preds:
                preds[m].add(n)
    everything = set(nodes)
    dom = {n: ({n} if n == entry else set(everything)) for n in nodes}
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n == entry or not preds[n]:
                continue
            new = {n} | set.intersection(*(dom[p] for p in preds[n]))
            if new != dom[n]:
                dom[n], changed = new, True
    return dom


@dataclass(frozen=True, slots=True)
class FanOut:
    """What an entry service's requests fan out to."""

    entry: str
    reachable: list[str]
    depth: dict[str, int]
    callees: dict[str, dict[str, int]]  # service -> callee -> calls, for the reachable services
    leaves: list[str]
    single_points_of_failure: list[str] = field(default_factory=list)


def fan_out(edges: Iterable[Edge], entry: str) -> FanOut:
    """Fan-out and single points of failure of ``entry`` (see the module docstring)."""
    adj = _adjacency(edges)
    if entry not in adj:
        return FanOut(entry, [], {}, {}, [])
    nodes = _reachable(adj, entry)
    depth = {entry: 0}
    frontier = [entry]
    while frontier:
        nxt = []
        for n in frontier:
            for m in sorted(adj[n]):
                if m not in depth:
                    depth[m] = depth[n] + 1
                    nxt.append(m)
        frontier = nxt
    leaves = sorted(n for n in nodes if n != entry and not adj[n])
    dom = _dominators(adj, entry, nodes)
    spof: set[str] = set.intersection(*(dom[leaf] for leaf in leaves)) - {entry} if leaves else set()
    return FanOut(entry=entry, reachable=sorted(n for n in nodes if n != entry), depth=depth,
                  callees={n: dict(sorted(adj[n].items())) for n in sorted(nodes) if adj[n]}, leaves=leaves,
                  single_points_of_failure=sorted(spof, key=lambda s: (depth[s], s)))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Dependent:
    """A service whose calls lead to the target."""

    service: str
    hops: int
    direct_calls: int  # its calls to the target itself (0 when it only reaches it through others)
    reach_share: float  # estimated share of its outgoing calls that lead to the target


def blast_radius(edges: Iterable[Edge], target: str, *, iterations: int = 50) -> list[Dependent]:
    """Every service that reaches ``target`` over CALLS, nearest and most dependent first."""
    adj = _adjacency(edges)
    callers: dict[str, set[str]] = {}
    for a, callees in adj.items():
        for b in callees:
            callers.setdefault(b, set()).add(a)
    hops: dict[str, int] = {target: 0}
    frontier = [target]
    while frontier:
        nxt = []
        for n in frontier:
            for c in sorted(callers.get(n, ())):
                if c not in hops:
                    hops[c] = hops[n] + 1
                    nxt.append(c)
        frontier = nxt
    share = {n: (1.0 if n == target else 0.0) for n in hops}
    for _ in range(iterations):  # relaxation; a cycle converges (shares only grow, bounded by 1)
        moved = False
        for n in hops:
            if n == target:
                continue
            total = sum(adj[n].values())
            value = sum(c * share.get(m, 0.0) for m, c in adj[n].items()) / total if total else 0.0
            if abs(value - share[n]) > 1e-9:
                share[n], moved = min(1.0, value), True
        if not moved:
            break
    out = [Dependent(n, hops[n], adj[n].get(target, 0), round(share[n], 4)) for n in hops if n != target]
    return sorted(out, key=lambda d: (d.hops, -d.reach_share, d.service))


def peak_writers(times: Iterable[tuple[str, float]], window_ms: float) -> int:
    """The most distinct traces (``(trace, at_ms)`` pairs) that write within any ``window_ms`` interval."""
    events = sorted(times, key=lambda t: t[1])
    best, lo = 0, 0
    inside: dict[str, int] = {}
    for trace, at in events:
        inside[trace] = inside.get(trace, 0) + 1
        while events[lo][1] < at - window_ms:
            old = events[lo][0]
            inside[old] -= 1
            if not inside[old]:
                del inside[old]
            lo += 1
        best = max(best, len(inside))
    return best
