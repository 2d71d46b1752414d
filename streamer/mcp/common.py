"""What every tool shares: the graph reader, the settings, helpers that keep outputs bounded and errors clear."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mcp.server.fastmcp.exceptions import ToolError

from sinks.graph.analytics import GraphReader
from streamer.mcp.cypher import AgentCypher
from streamer.mcp.settings import McpSettings

MAX_TEXT = 20_000  # characters of one text field (a test's source, a patch) before it is cut
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True, slots=True)
class Tools:
    """The state the tools close over."""

    reader: GraphReader
    settings: McpSettings
    cypher: AgentCypher  # query_graph's bounded client


def clip(text: Any, limit: int = MAX_TEXT) -> dict[str, Any]:
    """A text field, cut at ``limit`` characters, saying so."""
    s = "" if text is None else str(text)
    if len(s) <= limit:
        return {"text": s, "truncated": False}
    return {"text": s[:limit], "truncated": True, "total_chars": len(s)}


def page(items: list[Any], limit: int) -> dict[str, Any]:
    """Rows fetched with ``LIMIT limit + 1``: at most ``limit`` of them, and whether more exist."""
    return {"items": items[:limit], "count": min(len(items), limit), "limit": limit, "truncated": len(items) > limit}


def since_ms(since: str | None, now_ms: float | None = None) -> float | None:
    """``since`` as unix ms: a relative age (``30m``, ``2h``, ``7d``), an ISO-8601 time, or unix ms."""
    if since is None or not since.strip():
        return None
    text = since.strip()
    now = time.time() * 1000 if now_ms is None else now_ms
    if m := _RELATIVE.match(text):
        return now - float(m.group(1)) * _UNIT_MS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000
    except ValueError as exc:
        raise ToolError(f"since: expected 30m / 2h / 7d, an ISO-8601 time or unix ms, got {since!r}") from exc


async def rows(tools: Tools, cypher: str, params: dict[str, Any]) -> list[list[Any]]:
    """A read query; a server error becomes a tool error that says what failed."""
    try:
        return await tools.reader.rows(cypher, params)
    except Exception as exc:
        raise ToolError(f"graph query failed ({type(exc).__name__}): {exc}") from exc


def jsonable(value: Any) -> Any:
    """A graph value as JSON (nodes and edges as their properties)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    props = getattr(value, "properties", None)
    if isinstance(props, dict):
        labels = getattr(value, "labels", None) or getattr(value, "relation", None)
        return {"labels": jsonable(labels), "properties": jsonable(props)}
    return str(value)
