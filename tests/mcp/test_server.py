"""``trace-repro mcp`` driven by the MCP SDK's own client over stdio, on the known graph in the real FalkorDB."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from falkordb import FalkorDB
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from redis.exceptions import ResponseError

from sinks.graph.analytics import GraphReader
from tests.mcp.known_graph import FP, VERDICT_KEY, W1, W2, KnownGraph

pytestmark = pytest.mark.engines

TOOLS = {"list_incidents", "get_incident", "get_repro", "run_repro", "list_verdicts", "get_receipt", "add_contract",
         "service_map", "critical_path", "fan_out", "blast_radius", "hot_entities", "query_graph"}  # fmt: skip


@asynccontextmanager
async def client(graph: KnownGraph, *args: str, **env: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "streamer.cli", "mcp", *args],
                                   env=graph.env(**env))  # fmt: skip
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.isError, result.content
    assert result.structuredContent is not None
    out: dict[str, Any] = result.structuredContent
    return out


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.isError
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_help() -> None:
    """`trace-repro mcp --help` describes the server and its switches."""
    done = subprocess.run([sys.executable, "-m", "streamer.cli", "mcp", "--help"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    assert (
        "--transport" in done.stdout and "--allow-contracts" in done.stdout and "TRACE_REPRO_MCP_TOKEN" in done.stdout
    )


def test_http_without_a_token_is_refused(known_graph: KnownGraph) -> None:
    """Streamable HTTP without TRACE_REPRO_MCP_TOKEN: the server refuses to start, and says why."""
    done = subprocess.run([sys.executable, "-m", "streamer.cli", "mcp", "--transport", "http", "--port", "0"],
                          env=known_graph.env(), capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "TRACE_REPRO_MCP_TOKEN" in done.stderr


async def test_tools_list_shows_every_tool_with_its_schema(known_graph: KnownGraph) -> None:
    """Every tool is listed with a description and a typed JSON schema (bounds on limits, required params)."""
    async with client(known_graph) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
    assert set(listed) >= TOOLS
    for tool in listed.values():
        assert tool.description and tool.inputSchema["type"] == "object", tool.name
    limit = listed["list_incidents"].inputSchema["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 200)
    assert listed["get_incident"].inputSchema["required"] == ["fingerprint"]
    assert listed["query_graph"].inputSchema["required"] == ["cypher"]


async def test_incident_repro_verdict_tools_on_the_known_graph(known_graph: KnownGraph) -> None:
    """list_incidents (with filters), get_incident (evidence, timeline, Mermaid), get_repro, list_verdicts and
    get_receipt return what the graph writer wrote."""
    async with client(known_graph) as session:
        listed = await call(session, "list_incidents", service="checkout", anomaly="lost_update", state="fixed")
        assert [i["fingerprint"] for i in listed["items"]] == [FP]  # the known graph holds its FIXED verdict
        assert (await call(session, "list_incidents", state="open"))["items"] == []
        assert listed["items"][0]["on"] == ["orders:8812"] and listed["truncated"] is False
        assert (await call(session, "list_incidents", service="payments"))["items"] == []
        assert (await call(session, "list_incidents", anomaly="oversell"))["items"] == []

        incident = await call(session, "get_incident", fingerprint=FP)
        assert incident["anomaly"] == "lost_update" and incident["occurrences"]["items"][0]["entity"] == "orders:8812"
        assert [(p["role"], p["function"], p["route"]) for p in incident["parties"]] == [
            ("culprit", "capture_payment", "/orders/{id}/capture"),
            ("victim", "capture_payment", "/orders/{id}/capture"),
        ]  # the DB spans' code site (on their WROTE edges) and route (their trace's root)
        assert [(e["role"], e["access"], e["function"]) for e in incident["timeline"]["items"]] == [
            ("culprit", "WROTE", "capture_payment"), ("victim", "WROTE", "capture_payment")]  # fmt: skip
        assert (
            incident["mermaid"].startswith("sequenceDiagram") and "C->>E: WROTE capture_payment" in incident["mermaid"]
        )
        assert incident["repro"][0]["status"] == "proven" and incident["contracts"][0]["verdicts"] == ["FIXED @ 2.0"]
        assert "no incident" in await refused(session, "get_incident", fingerprint="ffffffffffffffff")

        repro = await call(session, "get_repro", fingerprint=FP)
        assert (repro["red"], repro["green"], repro["proven"], repro["divergence"]["faithful"]) == (
            "failed", "passed", True, True)  # fmt: skip
        assert "def test_lost_update" in repro["test_source"]["text"]
        assert "+SELECT * FROM orders WHERE id = %s FOR UPDATE" in repro["patch"]["text"]

        verdicts = await call(session, "list_verdicts", service="checkout")
        assert [v["key"] for v in verdicts["items"]] == [VERDICT_KEY]
        receipt = await call(session, "get_receipt", key=VERDICT_KEY)
        assert receipt["receipt"]["after_requests"] == 400 and receipt["receipt"]["p_value"] == 0.0004


async def test_topology_tools_on_the_known_graph(known_graph: KnownGraph) -> None:
    """service_map, critical_path (before/after the deploy), fan_out (single point of failure), blast_radius
    (service and row) and hot_entities on the known topology."""
    async with client(known_graph) as session:
        one = await call(session, "service_map", window=W1)
        calls = {(c["caller"], c["callee"]): c for c in one["calls"]["items"]}
        assert calls[("gateway", "frontend")]["calls"] == 100
        assert calls[("gateway", "frontend")]["rate_per_s"] == round(100 / 60, 4)
        assert calls[("payments", "postgresql")]["errors"] == 1
        both = await call(session, "service_map", windows=2)
        assert [w["id"] for w in both["windows"]] == [W2, W1]
        assert {(c["caller"], c["callee"]): c["calls"] for c in both["calls"]["items"]}[("frontend", "cache")] == 40

        path = await call(session, "critical_path", operation="POST /checkout")
        assert path["builds"]["1.0"]["shares"] == {"checkout": 0.6, "postgresql": 0.4}
        assert path["builds"]["2.0"]["shares"] == {"postgresql": 0.8, "checkout": 0.2}
        assert path["deploy"]["before"] == "1.0" and path["deploy"]["after"] == "2.0"
        assert path["deploy"]["shifts"][0] == {"owner": "checkout", "before": 0.6, "after": 0.2, "delta": -0.4}
        assert [w["window"] for w in path["windows"]] == [W2, W1]
        latest = await call(session, "critical_path")
        assert latest["window"]["id"] == W2
        assert latest["operations"]["items"][0]["critical_path"] == {"checkout": 0.2, "postgresql": 0.8}

        fan = await call(session, "fan_out", entry="gateway")
        assert fan["single_points_of_failure"] == ["frontend"]
        assert fan["fan_out"]["frontend"] == 2 and fan["leaves"] == ["cache", "postgresql"]
        assert (await call(session, "fan_out", entry="checkout"))["single_points_of_failure"] == ["postgresql"]

        blast = await call(session, "blast_radius", service="postgresql")
        deps = {d["service"]: (d["hops"], d["reach_share"]) for d in blast["dependents"]["items"]}
        assert deps == {"payments": (1, 1.0), "inventory": (1, 1.0), "checkout": (2, 1.0), "frontend": (3, 0.8),
                        "gateway": (4, 0.8)}  # fmt: skip
        assert blast["operations_owned"]["items"] == [
            {"operation": "checkout:POST /checkout", "max_critical_path_share": 0.8}]  # fmt: skip
        row = await call(session, "blast_radius", entity="orders:8812")
        assert row["touched_by"]["items"][0] | {} == {"service": "checkout", "function": "capture_payment",
                                                     "access": "WROTE", "accesses": 2, "traces": 2}  # fmt: skip
        assert row["incidents"][0]["fingerprint"] == FP
        assert "exactly one" in await refused(session, "blast_radius")

        hot = await call(session, "hot_entities", table="orders")
        assert hot["items"][0]["entity"] == "orders:8812"
        assert (hot["items"][0]["incidents"], hot["items"][0]["writing_traces"]) == (1, 2)
        assert hot["items"][0]["peak_concurrent_writers"] == 2  # the two writes are 10 ms apart


# Every kind of write, spelled every way a text filter could miss: the read-only query must refuse each one.
WRITES = (
    "CREATE (:Service {name: 'evil'})", "MATCH (s:Service) SET s.name = 'x'", "MATCH (s:Service) DETACH DELETE s",
    "MERGE (:X)", "MATCH (s) REMOVE s.name", "match (s:Service) with s delete s", "FOREACH (i IN [1] | CREATE (:X))",
    "UNWIND [1] AS i CALL { CREATE (:X) } RETURN i", "CREATE INDEX FOR (s:Service) ON (s.tier)",
    "CALL db.idx.fulltext.createNodeIndex('Service', 'name')",
    "CALL `db.idx.fulltext.createNodeIndex`('Service', 'name')",
    "cAlL Db.IdX.FullText.CreateNodeIndex('Service', 'name')",
    "CALL /* an index */ db . idx . fulltext . `createNodeIndex`('Service', 'name') // now",
    "CALL db.idx.fulltext.drop('Service')", "DROP INDEX ON :Service(name)",
    "LOAD CSV FROM 'file:///services.csv' AS row CREATE (:Service {name: row[0]})",
)  # fmt: skip


def graph_state(graph: KnownGraph) -> tuple[object, ...]:
    """Node and edge counts, labels, indexes and constraints of the known graph, read directly."""
    host, port = graph.url.removeprefix("redis://").rsplit(":", 1)
    g = FalkorDB(host=host, port=int(port)).select_graph(graph.graph)
    one = [g.ro_query(q).result_set for q in ("MATCH (n) RETURN count(n)", "MATCH ()-[r]->() RETURN count(r)",
                                              "CALL db.labels() YIELD label RETURN collect(label)")]  # fmt: skip
    indexes = sorted(map(str, g.ro_query("CALL db.indexes() YIELD label, properties, types").result_set))
    return *one, indexes, sorted(map(str, g.ro_query("CALL db.constraints()").result_set))


async def test_the_read_only_query_refuses_every_write(known_graph: KnownGraph) -> None:
    """GRAPH.RO_QUERY itself, with no text filter in front, refuses every write (clauses, index procedures quoted or
    not, in any case, with comments, LOAD CSV feeding a CREATE), and the graph, its indexes and its constraints are
    unchanged: the server is the guarantee, the tool's filter only an earlier message."""
    reader = GraphReader(known_graph.url, known_graph.graph)
    before = graph_state(known_graph)
    try:
        for cypher in WRITES:
            with pytest.raises(ResponseError, match="only on read-only queries"):
                await reader.rows(cypher)
    finally:
        await reader.close()
    assert graph_state(known_graph) == before


async def test_query_graph_reads_and_refuses_writes(known_graph: KnownGraph) -> None:
    """Read-only Cypher with parameters and a row limit; every write is refused as read-only, whether the filter
    saw it or only the server did, and the graph is unchanged."""
    before = graph_state(known_graph)
    async with client(known_graph) as session:
        out = await call(session, "query_graph", cypher="MATCH (s:Service) RETURN s.name ORDER BY s.name", limit=3)
        assert out["rows"] == [["cache"], ["checkout"], ["frontend"]] and out["truncated"] is True
        out = await call(session, "query_graph", cypher="MATCH (s:Service {name: $n}) RETURN s.name",
                         params={"n": "x' OR 1=1 //"})  # fmt: skip
        assert out["rows"] == []
        lit = await call(session, "query_graph", cypher="RETURN 'CREATE (n)' AS text, 1 AS `set` // DELETE")
        assert lit["rows"] == [[1, "CREATE (n)"]]  # write keywords in a literal, a name or a comment are data
        for cypher in (*WRITES, "MATCH (s:Service) SET s.name = 'x' RETURN s", "MERGE (x:X) RETURN x",
                       "UNWIND [1] AS i CALL { CREATE (:X) RETURN 1 AS one } RETURN i"):  # fmt: skip
            assert "read-only" in await refused(session, "query_graph", cypher=cypher), cypher
        count = await call(session, "query_graph", cypher="MATCH (s:Service) RETURN count(s)")
        assert count["rows"] == [[7]]
        assert "query failed" in await refused(session, "query_graph", cypher="MATCH (n RETURN n")
    assert graph_state(known_graph) == before


async def test_query_graph_is_bounded_on_the_server(known_graph: KnownGraph) -> None:
    """Rows, time and bytes are bounded before a result reaches the server's memory: a query whose full result
    the graph server could never build returns its first rows (truncated); a slow one ends at its timeout; a
    single huge value is refused at the reply's byte bound; a query that could close the wrapper is refused."""
    async with client(known_graph, TRACE_REPRO_MCP_MAX_RESULT_BYTES="65536") as session:
        huge = "UNWIND range(1, 20000) AS i UNWIND range(1, 20000) AS j RETURN i, j"  # 4 * 10^8 rows
        out = await call(session, "query_graph", cypher=huge, limit=5, timeout_ms=2000)
        assert out["rows"] == [[1, 1], [1, 2], [1, 3], [1, 4], [1, 5]] and out["truncated"] is True
        slow = "UNWIND range(1, 20000) AS i UNWIND range(1, 20000) AS j WITH i, j WHERE i * j < 0 RETURN count(*)"
        assert "timed out" in await refused(session, "query_graph", cypher=slow, timeout_ms=300)
        too_big = await refused(session, "query_graph", cypher="RETURN range(1, 1000000) AS numbers")
        assert "larger than 65536 bytes" in too_big
        again = await call(session, "query_graph", cypher="UNWIND range(1, 3) AS i RETURN i")  # connection renewed
        assert (again["rows"], again["truncated"]) == ([[1], [2], [3]], False)
        escape = "MATCH (s:Service) RETURN s } RETURN 1 AS x UNION CALL { UNWIND range(1, 100) AS s RETURN s"
        assert "unbalanced braces" in await refused(session, "query_graph", cypher=escape)


async def test_disabled_tools_refuse_and_enabled_ones_act(known_graph: KnownGraph) -> None:
    """run_repro and add_contract refuse unless enabled; enabled, run_repro re-runs the stored test (RED) and the
    GREEN test the repro worker left, on its repaired source copy, and add_contract validates and returns the
    contract (dry run)."""
    async with client(known_graph) as session:
        assert "disabled" in await refused(session, "run_repro", fingerprint=FP)
        assert "disabled" in await refused(session, "add_contract", fingerprint=FP, signature="error:*:X",
                                           must_start="x")  # fmt: skip
    async with client(known_graph, "--allow-run-repro", "--allow-contracts",
                      TRACE_REPRO_POSTGRES_DSN="postgresql://unused@127.0.0.1:1/x") as session:  # fmt: skip
        run = await call(session, "run_repro", fingerprint=FP)  # RED on the recorded source, GREEN on the repaired
        assert (run["red"]["status"], run["green"]["status"], run["reproduced"], run["fixed"]) == (
            "failed", "passed", True, True
        )  # fmt: skip
        red = await call(session, "run_repro", fingerprint=FP, runs="red")
        assert ("green" not in red, red["fixed"], red["reproduced"]) == (True, None, True)
        added = await call(session, "add_contract", fingerprint=FP, signature="error:*:RoundingError",
                           must_start="split.rounded", min_requests=50, dry_run=True)  # fmt: skip
        assert added["published"] is False and added["contract"]["min_requests"] == 50
        assert "not a valid contract" in await refused(session, "add_contract", fingerprint=FP,
                                                       signature="nonsense", must_start="x")  # fmt: skip


def test_outputs_are_json() -> None:
    """(A guard for the helpers the tools share.)"""
    from streamer.mcp.common import clip, page

    assert page([1, 2, 3], 2) == {"items": [1, 2], "count": 2, "limit": 2, "truncated": True}
    assert clip("x" * 10, 4) == {"text": "xxxx", "truncated": True, "total_chars": 10}
    json.dumps(page([], 1))
