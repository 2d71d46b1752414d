"""Windowed aggregates summed over their per-partition contributions: what makes N replicas agree with one process.

Every windowed aggregate (CALLS edges, service statistics) is written as one contribution per input partition
(``processors.pipeline.calls``); these functions turn the contributions stored for one window key back into the
totals the
graph shows: counts add up, latency sketches merge (so quantiles are of all requests, not averages of quantiles),
error signatures add up per signature, critical-path ownership adds up per owner. Contributions are plain rows as
the graph returns them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from processors.lib.sketch import LatencySketch
from processors.model.graph import Row


def _sketch(parts: Iterable[Mapping[str, Any]]) -> LatencySketch:
    total = LatencySketch()
    for p in parts:
        total.merge(LatencySketch.from_row(p["bins"] or [], p["bin_counts"] or [], p["min"] or 0.0, p["max"] or 0.0))
    return total


def _ms(value: float) -> float:
    return round(value, 3) if math.isfinite(value) else 0.0


def calls_total(parts: Sequence[Mapping[str, Any]]) -> Row:
    """count, errors, p50_ms and p95_ms of one (caller, callee, window) from its contributions."""
    latency = _sketch(parts)
    return {"count": sum(int(p["count"]) for p in parts), "errors": sum(int(p["errors"]) for p in parts),
            "p50_ms": _ms(latency.quantile(0.5)), "p95_ms": _ms(latency.quantile(0.95))}  # fmt: skip


def _sum_maps(parts: Iterable[Mapping[str, Any]], field: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in parts:
        for key, n in json.loads(p[field] or "{}").items():
            out[key] = out.get(key, 0) + int(n)
    return out


def stats_total(parts: Sequence[Mapping[str, Any]]) -> Row:
    """The STATS edge of one (operation, version, window) from its contributions."""
    requests = sum(int(p["requests"]) for p in parts)
    errors = sum(int(p["errors"]) for p in parts)
    latency = _sketch(parts)
    path = _sum_maps(parts, "path_ns")
    owned = sum(path.values())
    shares = {k: round(v / owned, 4) for k, v in sorted(path.items())} if owned else {}
    return {
        "revision": next((p["revision"] for p in parts if p["revision"]), ""),
        "requests": requests,
        "errors": errors,
        "error_rate": round(errors / requests, 6) if requests else 0.0,
        "p50_ms": _ms(latency.quantile(0.5)),
        "p95_ms": _ms(latency.quantile(0.95)),
        "p99_ms": _ms(latency.quantile(0.99)),
        "signatures": json.dumps(_sum_maps(parts, "signatures"), sort_keys=True),
        "critical_path": json.dumps(shares, sort_keys=True),
    }
