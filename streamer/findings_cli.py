"""``trace-repro findings list|show``: the findings the daemon keeps, read from a terminal.

The source is the daemon's graph (the ``Incident`` nodes in FalkorDB, with their occurrences, culprit and victim
spans, repro, contracts and verdicts), not the incidents topic: the graph holds each defect once, with its state
(open, or fixed by a FIXED verdict) and counts, while the topic holds every occurrence and would have to be read from
its beginning. The queries are the MCP server's (``streamer.mcp.tools_findings``): read-only, with a timeout.

Output is a table for people, or with ``--json`` the same JSON the MCP tools return (``list_findings``,
``get_finding``) for scripts. Exit status: 0, 1 when ``show`` finds no such fingerprint, 2 on a bad config or an
unreachable graph.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from streamer.mcp.settings import McpSettings

SUMMARY_CHARS = 70


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    f = sub.add_parser("findings", help="list the findings the daemon keeps, or show one (from its graph)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    actions = f.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("list", help="findings, most recently seen first")
    ls.add_argument("--service", help="only findings involving this service")
    ls.add_argument("--anomaly", help="only this class or registered finding type: lost_update, regression, ...")
    ls.add_argument("--state", choices=["open", "fixed"], help="only open ones, or fixed ones")
    ls.add_argument("--since", help="last seen after: 30m, 2h, 7d, an ISO-8601 time or unix ms")
    ls.add_argument("--limit", type=int, default=20, choices=range(1, 201), metavar="N", help="at most N (1-200)")
    show = actions.add_parser("show", help="one finding's evidence: occurrences, parties, timeline, repro, verdicts")
    show.add_argument("fingerprint")
    for p in (ls, show):
        p.add_argument("--config", type=Path, help="the daemon's TOML config (default: TRACE_REPRO_* environment)")
        p.add_argument("--json", action="store_true", help="JSON (as the MCP tools return it) instead of a table")
    f.set_defaults(handler=main)


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run the command (the MCP tools' modules are imported here: ``trace-repro run`` never loads them)."""
    from mcp.server.fastmcp.exceptions import ToolError

    from streamer.config import ConfigError
    from streamer.mcp.settings import resolve

    out = out or sys.stdout
    try:
        settings = resolve(args.config)
    except ConfigError as exc:
        print(f"trace-repro findings: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args, settings, out))
    except ToolError as exc:
        print(f"trace-repro findings: {exc}", file=sys.stderr)
        return 1 if args.action == "show" and str(exc).startswith("no incident") else 2


async def _run(args: argparse.Namespace, settings: McpSettings, out: TextIO) -> int:
    from sinks.graph.analytics import GraphReader
    from streamer.mcp.common import Tools
    from streamer.mcp.cypher import AgentCypher
    from streamer.mcp.tools_findings import get_finding, list_findings

    reader = GraphReader(settings.falkordb_url, settings.graph, timeout_ms=settings.timeout_ms)
    cypher = AgentCypher(settings.falkordb_url, settings.graph, max_result_bytes=settings.max_result_bytes,
                         socket_timeout_s=settings.timeout_ms / 1000 + 5)  # fmt: skip
    tools = Tools(reader, settings, cypher)
    try:
        if args.action == "list":
            found = await list_findings(tools, service=args.service, anomaly=args.anomaly, state=args.state,
                                        since=args.since, limit=args.limit)  # fmt: skip
            out.write(json.dumps(found, indent=2) + "\n" if args.json else table(found))
        else:
            finding = await get_finding(tools, args.fingerprint)
            out.write(json.dumps(finding, indent=2, default=str) + "\n" if args.json else details(finding))
    finally:
        await reader.close()
    return 0


def _when(unix_ms: Any) -> str:
    if not isinstance(unix_ms, int | float) or unix_ms <= 0:
        return "-"
    return datetime.fromtimestamp(unix_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _cut(text: Any, n: int) -> str:
    s = " ".join(str(text or "").split())  # untrusted text: one line
    return s if len(s) <= n else s[: n - 1] + "…"


def table(found: dict[str, Any]) -> str:
    """The list as aligned columns, newest first, and a line saying when more exist."""
    head = ("FINGERPRINT", "ANOMALY", "SEVERITY", "STATE", "OCC", "LAST SEEN (UTC)", "SERVICES", "SUMMARY")
    rows = [(str(i["fingerprint"]), str(i["anomaly"] or "-"), str(i["severity"] or "-"), str(i["state"] or "-"),
             str(i["occurrences"] or 0), _when(i["last_seen_unix_ms"]), _cut(",".join(i["services"]), 30) or "-",
             _cut(i["summary"], SUMMARY_CHARS)) for i in found["items"]]  # fmt: skip
    if not rows:
        return "no findings\n"
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head) - 1)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in [head, *rows]]
    if found["truncated"]:
        lines.append(f"(more than {found['limit']}: narrow with --service/--since or raise --limit)")
    return "\n".join(line.rstrip() for line in lines) + "\n"


def details(f: dict[str, Any]) -> str:
    """One finding as a readable report: what, where, who, when, and what was done about it."""
    lines = [
        f"{f['fingerprint']}  {f['anomaly']}  severity {f['severity'] or '-'}  state {f['state'] or '-'}",
        f"  {_cut(f['summary'], 200)}",
        f"  on {', '.join(f['on']) or '-'}" + (f"  table {f['table']}" if f.get("table") else ""),
        f"  seen {f['occurrences_total'] or 0} time(s): first {_when(f['first_seen_unix_ms'])}, "
        f"last {_when(f['last_seen_unix_ms'])} UTC",
    ]
    found = f.get("finding")
    if found:  # a finding of a registered type: what it published of itself
        lines.append(f"  type {found['type']}  remedy {found['remedy'] or '-'}  contract {found['contract'] or '-'}")
        lines += [f"  - {_cut(line, 200)}" for line in found["evidence"]]
        lines.append(
            "  data: " + _cut(", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(found["data"].items())), 300)
        )
        lines += [f"  trace {t}" for t in found["traces"]]
    if f["parties"]:
        lines.append("parties:")
        for p in f["parties"]:
            where = " ".join(x for x in (p["route"], p["function"]) if x)
            lines.append(f"  {p['role']:<8} trace {p['trace']}  {p['service']} {p['version'] or ''}  {where}".rstrip())
    if f["occurrences"]["items"]:
        lines.append("occurrences (newest first):")
        for o in f["occurrences"]["items"]:
            lines.append(f"  {_when(o['at_unix_ms'])}  {o['entity'] or o['window'] or '-'}  version "
                         f"{o['version'] or '-'}  commit {o['commit'] or '-'}")  # fmt: skip
    if f["timeline"]["items"]:
        lines.append("timeline:")
        for e in f["timeline"]["items"]:
            lines.append(f"  {e['role']:<8} {e['access'] or '-':<6} lock={e['lock'] or '-':<10} "
                         f"{_cut(e['statement'], 90)}")  # fmt: skip
    for r in f["repro"]:
        lines.append(f"repro: {r['path']}  {r['status']}")
    for c in f["contracts"]:
        verdicts = ", ".join(str(v) for v in c["verdicts"]) or "none yet"
        lines.append(f"contract: {c['signature']}  issue {c['issue'] or '-'}  verdicts: {verdicts}")
    return "\n".join(lines) + "\n"
