"""The topology tools: service map, critical path, fan-out, blast radius, hot rows, and read-only Cypher."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from pydantic import Field

from sinks.graph import analytics as q
from sinks.graph import topology
from streamer.mcp.common import Tools, jsonable, page, rows, since_ms
from streamer.mcp.cypher import QueryTimedOut, ReadOnlyViolation, ReplyTooLarge, UnboundedQuery

Limit = Annotated[int, Field(ge=1, le=500, description="the most items to return")]
Windows = Annotated[int, Field(ge=1, le=100, description="how many of the latest windows to sum")]
Window = Annotated[str | None, Field(description='a window id "<start ms>-<end ms>" (default: the latest)')]


async def call_windows(tools: Tools, window: str | None, n: int) -> list[dict[str, Any]]:
    """The windows asked for (one by id, or the latest ``n`` that have CALLS), newest first."""
    if window:
        found = await rows(tools, q.WINDOW, {"id": window})
        if not found:
            raise ToolError(f"no window {window!r} (service_map lists the latest ones)")
    else:
        found = await rows(tools, q.CALL_WINDOWS, {"limit": n})
    return [{"id": r[0], "start_unix_ms": r[1], "end_unix_ms": r[2]} for r in found]


async def call_edges(tools: Tools, windows: list[dict[str, Any]]) -> list[topology.Edge]:
    found = await rows(tools, q.CALLS_IN, {"windows": [w["id"] for w in windows]})
    return [topology.Edge(str(r[0]), str(r[1]), int(r[2] or 0), int(r[3] or 0)) for r in found]


async def operation_key(tools: Tools, operation: str) -> str:
    """An operation's key from its key or its name (a tool error when unknown or ambiguous)."""
    keys = [r[0] for r in await rows(tools, q.OPERATIONS_NAMED, {"name": operation})]
    if operation in keys:
        return operation
    if len(keys) == 1:
        return str(keys[0])
    if not keys:
        raise ToolError(f"no operation {operation!r} (service_map lists operations; keys are service:name)")
    raise ToolError(f"operation {operation!r} is ambiguous: one of {keys}")


async def window_paths(tools: Tools, limit: int) -> dict[str, Any]:
    """Critical-path ownership per operation in the latest statistics window."""
    latest = await rows(tools, q.STATS_WINDOWS, {"limit": 1})
    if not latest:
        return {"window": None, "operations": page([], limit)}
    wid = latest[0][0]
    found = await rows(tools, q.WINDOW_PATHS, {"windows": [wid], "limit": limit + 1})
    ops = [{"operation": r[0], "version": r[2], "requests": r[3], "p95_ms": r[4],
            "critical_path": json.loads(r[5] or "{}")} for r in found]  # fmt: skip
    return {"window": {"id": wid, "start_unix_ms": latest[0][1], "end_unix_ms": latest[0][2]},
            "operations": page(ops, limit)}  # fmt: skip


def register(mcp: FastMCP, tools: Tools) -> None:
    """Add the topology tools to ``mcp``."""

    @mcp.tool()
    async def service_map(window: Window = None, windows: Windows = 1, limit: Limit = 200) -> dict[str, Any]:
        """Services, their operations, and the CALLS between them (calls, calls/s, errors, p50/p95 ms) summed over
        one window or the latest N windows."""
        ws = await call_windows(tools, window, windows)
        span_s = sum(max(0.0, (w["end_unix_ms"] or 0) - (w["start_unix_ms"] or 0)) for w in ws) / 1000
        edges = (await rows(tools, q.CALLS_IN, {"windows": [w["id"] for w in ws]})) if ws else []
        calls = sorted(({"caller": r[0], "callee": r[1], "calls": r[2], "errors": r[3],
                         "rate_per_s": round(r[2] / span_s, 4) if span_s else None,
                         "error_rate": round(r[3] / r[2], 6) if r[2] else 0.0, "p50_ms_max": r[4], "p95_ms_max": r[5]}
                        for r in edges), key=lambda c: (-c["calls"], c["caller"], c["callee"]))  # fmt: skip
        services = await rows(tools, q.SERVICES, {"ops": 20, "limit": limit + 1})
        return {"windows": ws,
                "services": page([{"name": r[0], "operations": r[1], "operation_names": sorted(r[2])}
                                  for r in services], limit),
                "calls": page(calls, limit)}  # fmt: skip

    @mcp.tool()
    async def critical_path(
        operation: Annotated[str | None, Field(description="operation key (service:name) or name; none = all")] = None,
        before_version: Annotated[str | None, Field(description="the build before the deploy")] = None,
        after_version: Annotated[str | None, Field(description="the build after it (default: the newest)")] = None,
        since: Annotated[str | None, Field(description="only windows from: 2h, 7d, ISO-8601 or unix ms")] = None,
        windows: Windows = 12,
    ) -> dict[str, Any]:
        """Who owns the slowest requests' time (the p95 tail's critical path, by owner: a service or the database),
        per window and per build, and how each owner's share moved between the build before and after a deploy.
        Without an operation: the ownership of every operation in the latest window."""
        if operation is None:
            return await window_paths(tools, 50)
        key = await operation_key(tools, operation)
        start = since_ms(since)
        per_window = await rows(tools, q.OPERATION_STATS, {"op": key, "since": start, "limit": windows + 1})
        by_version = await rows(tools, q.OPERATION_PATH_NS, {"op": key, "since": start})
        builds = {str(r[0]): {"first_window_unix_ms": r[1], "requests": r[2],
                              "shares": topology.shares(topology.ownership(r[3]))} for r in by_version}  # fmt: skip
        order = list(builds)  # by first window
        after = after_version or (order[-1] if order else None)
        before = before_version or next((v for v in reversed(order) if v != after), None)
        for v in (before_version, after_version):
            if v is not None and v not in builds:
                raise ToolError(f"operation {key} has no statistics for version {v!r}; it has {order}")
        out: dict[str, Any] = {
            "operation": key, "builds": builds,
            "windows": [{"window": r[0], "start_unix_ms": r[1], "version": r[3], "requests": r[4], "errors": r[5],
                         "p95_ms": r[6], "critical_path": json.loads(r[7] or "{}")} for r in per_window[:windows]],
            "windows_truncated": len(per_window) > windows,
        }  # fmt: skip
        if before and after and before != after:
            out["deploy"] = {"before": before, "after": after,
                             "shifts": topology.shifts(builds[before]["shares"], builds[after]["shares"])}  # fmt: skip
        return out

    @mcp.tool()
    async def fan_out(
        entry: Annotated[str, Field(min_length=1, description="entry service, or an operation (service:name)")],
        window: Window = None,
        windows: Windows = 6,
    ) -> dict[str, Any]:
        """What an entry's requests fan out to over CALLS: reachable services with depth, each one's callees, and
        the single points of failure (services on every call path from the entry to a leaf)."""
        service = entry.split(":", 1)[0] if ":" in entry else entry
        ws = await call_windows(tools, window, windows)
        f = topology.fan_out(await call_edges(tools, ws), service)
        if not f.reachable and not f.callees:
            raise ToolError(f"service {service!r} makes no calls in these windows ({[w['id'] for w in ws]})")
        return {"entry": service, "windows": [w["id"] for w in ws], "reachable": f.reachable, "depth": f.depth,
                "fan_out": {k: len(v) for k, v in f.callees.items()}, "callees": f.callees, "leaves": f.leaves,
                "single_points_of_failure": f.single_points_of_failure}  # fmt: skip

    @mcp.tool()
    async def blast_radius(
        service: Annotated[str | None, Field(description="what depends on this service (over CALLS)")] = None,
        entity: Annotated[str | None, Field(description='or on this row, e.g. "orders:8812" (or "orders:*")')] = None,
        window: Window = None,
        windows: Windows = 6,
        limit: Limit = 50,
    ) -> dict[str, Any]:
        """What breaks if a service or a row fails: for a service, every service whose calls reach it (hops, direct
        calls, estimated share of its calls that lead there) and the operations whose slow-request time it owns;
        for a row, the services, functions and entry operations that touch it, by traffic, and its incidents."""
        if (service is None) == (entity is None):
            raise ToolError("give exactly one of service or entity")
        if entity is not None:
            p = {"key": entity, "limit": limit + 1}
            touches = [{"service": r[0], "function": r[1], "access": r[2], "accesses": r[3], "traces": r[4]}
                       for r in await rows(tools, q.ENTITY_TOUCHES, p)]  # fmt: skip
            entries = await rows(tools, q.ENTITY_ENTRIES, p)
            total = sum(int(r[2]) for r in entries) or 1
            return {"entity": entity, "touched_by": page(touches, limit),
                    "entry_operations": page([{"service": r[0], "operation": r[1], "traces": r[2],
                                               "share": round(int(r[2]) / total, 4)} for r in entries], limit),
                    "incidents": [{"fingerprint": r[0], "anomaly": r[1], "state": r[2], "occurrences": r[3]}
                                  for r in await rows(tools, q.ENTITY_INCIDENTS, p)]}  # fmt: skip
        assert service is not None
        ws = await call_windows(tools, window, windows)
        deps = topology.blast_radius(await call_edges(tools, ws), service)
        paths = await rows(tools, q.WINDOW_PATHS, {"windows": [w["id"] for w in ws], "limit": 10_000})
        owned: dict[str, float] = {}
        for r in paths:
            share = json.loads(r[5] or "{}").get(service)
            if share:
                owned[r[0]] = max(owned.get(r[0], 0.0), float(share))
        ops = [{"operation": k, "max_critical_path_share": v}
               for k, v in sorted(owned.items(), key=lambda kv: (-kv[1], kv[0]))]  # fmt: skip
        return {"service": service, "windows": [w["id"] for w in ws],
                "dependents": page([asdict(d) for d in deps], limit),
                "operations_owned": page(ops, limit)}  # fmt: skip

    @mcp.tool()
    async def hot_entities(
        table: Annotated[str | None, Field(description="only rows of this table")] = None,
        since: Annotated[str | None, Field(description="only writes after: 30m, 2h, ISO-8601 or unix ms")] = None,
        concurrency_ms: Annotated[float, Field(gt=0, le=60_000, description="interval for peak writers")] = 1000.0,
        limit: Limit = 20,
    ) -> dict[str, Any]:
        """Rows with the most collisions and concurrent writers: incidents on the row, distinct writing traces,
        and the peak number of traces writing it within any `concurrency_ms` interval."""
        start = since_ms(since)
        found = await rows(tools, q.HOT_CANDIDATES, {"table": table, "since": start, "limit": limit + 1})
        keys = [r[0] for r in found[:limit]]
        times: dict[str, list[tuple[str, float]]] = {}
        for k, trace, at in await rows(tools, q.WRITE_TIMES, {"keys": keys, "since": start, "limit": 50_000}):
            times.setdefault(k, []).append((str(trace), float(at)))
        items = [{"entity": r[0], "table": r[1], "writing_traces": r[2], "writes": r[3], "services": r[4],
                  "incidents": r[5], "occurrences": r[6],
                  "peak_concurrent_writers": topology.peak_writers(times.get(r[0], []), concurrency_ms)}
                 for r in found]  # fmt: skip
        return page(items, limit)

    @mcp.tool()
    async def query_graph(
        cypher: Annotated[str, Field(min_length=1, max_length=10_000, description="a read-only Cypher query")],
        params: Annotated[dict[str, Any] | None, Field(description="Cypher parameters ($name)")] = None,
        limit: Annotated[int, Field(ge=1, le=10_000, description="the most rows to return")] = 100,
        timeout_ms: Annotated[int, Field(ge=100, le=60_000, description="server-side timeout")] = 5000,
    ) -> dict[str, Any]:
        """Run read-only Cypher on the graph (GRAPH.RO_QUERY: any write is refused), ending in RETURN. The server
        stops after `limit` rows (`truncated` says more existed) and after `timeout_ms`; a reply over the server's
        byte bound is refused (ask for fewer rows or smaller values: size(), [..n], left()). Columns come in name
        order. Pass values as params, not inside the text."""
        cap = min(limit, tools.settings.max_rows)
        wait_ms = min(timeout_ms, tools.settings.timeout_ms)
        try:
            columns, found, cut = await tools.cypher.run(cypher, params or {}, limit=cap, timeout_ms=wait_ms)
        except (ReadOnlyViolation, UnboundedQuery, QueryTimedOut) as exc:
            raise ToolError(str(exc)) from exc
        except ReplyTooLarge as exc:
            raise ToolError(f"{exc} (cut there): ask for fewer rows or smaller values (size(), [..n], left())") from exc
        except Exception as exc:
            raise ToolError(f"query failed ({type(exc).__name__}): {exc}") from exc
        return {"columns": columns, "rows": jsonable(found), "count": len(found), "limit": cap, "truncated": cut}
