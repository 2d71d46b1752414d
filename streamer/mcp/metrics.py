"""The topology analytics as Prometheus series, computed from the graph when ``/metrics`` is scraped.

=============================================================  ===================================================
series                                                         meaning
=============================================================  ===================================================
``trace_repro_critical_path_share{operation,version,owner}``   share of the operation's p95-tail time the owner
                                                               holds on the critical path, latest stats window
``trace_repro_service_fan_out{service}``                       distinct services it calls, latest CALLS window
``trace_repro_blast_radius_dependents{service}``               services whose calls reach it, latest CALLS window
``trace_repro_single_point_of_failure{entry,service}``         1: every call path of the entry (a service nobody
                                                               calls) to a leaf goes through the service
=============================================================  ===================================================

Each family is cut at :data:`MAX_SERIES` series (``trace_repro_analytics_truncated{family}`` says where).
"""

from __future__ import annotations

import json

from sinks.graph import analytics as q
from sinks.graph import topology
from sinks.graph.analytics import GraphReader

MAX_SERIES = 1000

# Every family this exposition can hold, with its label names (the dashboard's expressions are checked against it).
FAMILIES: dict[str, tuple[str, ...]] = {
    "trace_repro_critical_path_share": ("operation", "version", "owner"),
    "trace_repro_service_fan_out": ("service",),
    "trace_repro_blast_radius_dependents": ("service",),
    "trace_repro_single_point_of_failure": ("entry", "service"),
    "trace_repro_analytics_truncated": ("family",),
}


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(name: str, help_: str, series: list[tuple[dict[str, object], float]], out: list[str]) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} gauge")
    for labels, value in series[:MAX_SERIES]:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        out.append(f"{name}{{{text}}} {value:g}")
    if len(series) > MAX_SERIES:
        out.append(f'trace_repro_analytics_truncated{{family="{name}"}} {len(series) - MAX_SERIES}')


async def exposition(reader: GraphReader) -> str:
    """The text exposition of every analytics series."""
    out: list[str] = []
    latest = await reader.rows(q.STATS_WINDOWS, {"limit": 1})
    paths: list[tuple[dict[str, object], float]] = []
    if latest:
        for r in await reader.rows(q.WINDOW_PATHS, {"windows": [latest[0][0]], "limit": MAX_SERIES + 1}):
            for owner, share in sorted(json.loads(r[5] or "{}").items()):
                paths.append(({"operation": r[0], "version": r[2], "owner": owner}, float(share)))
    _family("trace_repro_critical_path_share", "Share of the p95 tail's critical path an owner holds.", paths, out)
    windows = await reader.rows(q.CALL_WINDOWS, {"limit": 1})
    edges = []
    if windows:
        found = await reader.rows(q.CALLS_IN, {"windows": [windows[0][0]]})
        edges = [topology.Edge(str(r[0]), str(r[1]), int(r[2] or 0)) for r in found]
    services = sorted({e.caller for e in edges} | {e.callee for e in edges})
    callees = {s: len({e.callee for e in edges if e.caller == s and e.callee != s}) for s in services}
    _family("trace_repro_service_fan_out", "Distinct services a service calls.",
            [({"service": s}, float(n)) for s, n in callees.items()], out)  # fmt: skip
    _family("trace_repro_blast_radius_dependents", "Services whose calls reach this service.",
            [({"service": s}, float(len(topology.blast_radius(edges, s)))) for s in services], out)  # fmt: skip
    called = {e.callee for e in edges if e.caller != e.callee}
    spof: list[tuple[dict[str, object], float]] = [
        ({"entry": entry, "service": s}, 1.0)
        for entry in services
        if entry not in called
        for s in topology.fan_out(edges, entry).single_points_of_failure
    ]
    _family("trace_repro_single_point_of_failure", "1: every call path of the entry goes through the service.",
            spof, out)  # fmt: skip
    return "\n".join(out) + "\n"
