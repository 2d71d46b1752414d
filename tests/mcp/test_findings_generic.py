"""The findings tools handle a finding of any registered type: listed and filtered by type, shown with its typed
data; the tools advertise the classes the daemon emits (anomalies and registered types), none it never emits."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from falkordb import FalkorDB

from processors.model.anomaly import Anomaly
from sinks.graph.analytics import GraphReader
from sinks.graph.sink import GraphSink
from sinks.graph.writer import GraphWriter
from streamer.findings_cli import details
from streamer.mcp import server
from streamer.mcp.common import Tools
from streamer.mcp.cypher import AgentCypher
from streamer.mcp.settings import McpSettings
from streamer.mcp.tools_findings import get_finding, list_findings
from tests.finding_samples import SAMPLE_TYPE, T0, finding

pytestmark = pytest.mark.engines


@pytest.fixture
async def tools(falkordb_url: str) -> AsyncIterator[Tools]:
    """The tools' state on a fresh graph holding one finding of the sample type (two occurrences)."""
    name = f"mcp_findings_{uuid.uuid4().hex[:8]}"
    sink = GraphSink(GraphWriter(falkordb_url, name), clock_ms=lambda: 1.0)
    await sink.start()
    await sink.record([finding("o1", T0), finding("o2", T0 + 60_000)])
    settings = McpSettings(falkordb_url=falkordb_url, graph=name, kafka_bootstrap="127.0.0.1:9")
    reader = GraphReader(falkordb_url, name)
    try:
        yield Tools(reader, settings, AgentCypher(falkordb_url, name, max_result_bytes=1 << 20, socket_timeout_s=15))
    finally:
        await reader.close()
        await sink.close()
        host, port = falkordb_url.removeprefix("redis://").rsplit(":", 1)
        FalkorDB(host=host, port=int(port)).select_graph(name).delete()


async def test_a_finding_of_a_registered_type_is_listed_filtered_and_shown(tools: Tools) -> None:
    listed = await list_findings(tools, anomaly=SAMPLE_TYPE.name, service="checkout")
    [item] = listed["items"]
    assert (item["fingerprint"], item["type"], item["severity"], item["state"]) == (
        "fp-sample-hang", SAMPLE_TYPE.name, "high", "open")  # fmt: skip
    assert item["occurrences"] == 2 and item["on"] == ["checkout:GET /checkout"] and item["services"] == ["checkout"]
    assert (await list_findings(tools, anomaly=Anomaly.LOST_UPDATE.value))["items"] == []

    shown = await get_finding(tools, "fp-sample-hang")
    e = finding("o2", T0 + 60_000)
    assert shown["finding"]["data"] == e.data and shown["finding"]["remedy"] == "add_timeout"
    assert shown["finding"]["subject"] == {"service": "checkout", "operation": "GET /checkout", "entity": "payments"}
    assert shown["finding"]["evidence"] == e.evidence and shown["finding"]["traces"] == e.traces
    assert [o["id"] for o in shown["occurrences"]["items"]] == ["o2", "o1"]
    assert shown["occurrences"]["items"][0]["traces"] == e.traces
    text = details(shown)  # ``trace-repro findings show``
    assert "type sample_hang  remedy add_timeout  contract sample_hang:fp-sample-hang" in text
    assert f"  - {e.evidence[0]}" in text and '"hung": 20' not in text and "hung=20" in text
    assert f"  trace {e.traces[0]}" in text


async def test_the_tools_advertise_the_classes_the_daemon_emits(falkordb_url: str) -> None:
    """``list_findings`` (and its first name ``list_incidents``) names every anomaly and registered type as a filter,
    and no class the daemon never emits (``oversell``, ``double_charge``)."""
    mcp = server.build(McpSettings(falkordb_url=falkordb_url, graph="unused", kafka_bootstrap="127.0.0.1:9"))
    listed = {t.name: t for t in await mcp.list_tools()}
    assert {"list_findings", "get_finding", "list_incidents", "get_incident"} <= set(listed)
    for name in ("list_findings", "list_incidents"):
        text = str(listed[name].description)
        assert "type" in listed[name].inputSchema["properties"] and "anomaly" in listed[name].inputSchema["properties"]
        assert all(a.value in text for a in Anomaly) and SAMPLE_TYPE.name in text, text
        assert "oversell" not in text and "double_charge" not in text
    assert "oversell" not in server.INSTRUCTIONS and "double charge" not in server.INSTRUCTIONS
