"""The MCP server: FastMCP with the findings and topology tools, over stdio or bearer-token streamable HTTP.

Over HTTP every request (the MCP endpoint ``/mcp`` and ``/metrics``) must carry ``Authorization: Bearer <token>``
with the token from ``TRACE_REPRO_MCP_TOKEN``; without a token configured the server refuses to start on HTTP.
Nothing the server runs writes the graph: every query is ``GRAPH.RO_QUERY`` (an agent's own Cypher is also
bounded in rows, time and reply bytes: :mod:`streamer.mcp.cypher`). The two tools that act
(``run_repro``, ``add_contract``) are listed always and refuse unless enabled.
"""

from __future__ import annotations

import hmac
from typing import Any

from mcp.server.fastmcp import FastMCP
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sinks.graph.analytics import GraphReader
from streamer import logs
from streamer.components import default
from streamer.mcp import metrics, tools_findings, tools_topology
from streamer.mcp.common import Tools
from streamer.mcp.cypher import AgentCypher
from streamer.mcp.settings import McpSettings

INSTRUCTIONS = (
    "trace-repro finds concurrency defects between requests (lost updates, invariant violations, duplicate applies, "
    "write skew, phantoms, read skew), latency and error regressions, and the findings of every registered detector "
    "in production traces, reproduces collisions as a pytest, and judges deployed fixes. Start with list_findings "
    "(filter by type), then get_finding and get_repro; service_map, critical_path, fan_out, blast_radius and "
    "hot_entities describe the topology; query_graph runs read-only Cypher."
)


class MissingToken(RuntimeError):
    """Streamable HTTP asked for without ``TRACE_REPRO_MCP_TOKEN``."""


def build(settings: McpSettings, *, host: str = "127.0.0.1", port: int = 8765) -> FastMCP:
    """The server with every tool registered."""
    reader = GraphReader(settings.falkordb_url, settings.graph, timeout_ms=settings.timeout_ms)
    mcp = FastMCP("trace-repro", instructions=INSTRUCTIONS, host=host, port=port, log_level="WARNING")
    cypher = AgentCypher(settings.falkordb_url, settings.graph, max_result_bytes=settings.max_result_bytes,
                         socket_timeout_s=settings.timeout_ms / 1000 + 5)  # fmt: skip
    tools = Tools(reader, settings, cypher)
    default()  # the components' packages register their finding types (advertised by the findings tools)
    tools_findings.register(mcp, tools)
    tools_topology.register(mcp, tools)

    @mcp.custom_route("/metrics", methods=["GET"])  # type: ignore[untyped-decorator]
    async def _metrics(request: Request) -> Response:
        return PlainTextResponse(await metrics.exposition(reader), media_type="text/plain; version=0.0.4")

    return mcp


class BearerAuth:
    """ASGI middleware: HTTP requests without the bearer token get 401 (lifespan events pass through)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                response = PlainTextResponse("missing or wrong bearer token", status_code=401,
                                             headers={"WWW-Authenticate": 'Bearer realm="trace-repro"'})  # fmt: skip
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def http_app(mcp: FastMCP, token: str | None) -> Any:
    """The streamable HTTP app behind the bearer check (:class:`MissingToken` without a token)."""
    if not token:
        raise MissingToken("streamable HTTP needs a bearer token: set TRACE_REPRO_MCP_TOKEN (refusing to serve)")
    return BearerAuth(mcp.streamable_http_app(), token)


def serve(settings: McpSettings, transport: str, host: str, port: int) -> None:
    """Run until stopped: stdio, or streamable HTTP on ``host:port``. Log lines go to stderr (stdout is the stdio
    transport's)."""
    logs.configure("WARNING")
    mcp = build(settings, host=host, port=port)
    if transport == "stdio":
        mcp.run("stdio")
        return
    import uvicorn

    app = http_app(mcp, settings.token)
    uvicorn.run(app, host=host, port=port, log_level="warning")
