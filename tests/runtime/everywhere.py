"""Where a published finding must arrive: the Kafka topic, the file sink, GitLab, the graph and MCP. Shared by the
conformance test (every registered detector's kinds) and the extending test (a detector added in one line)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from bench.gitlab_server import FakeGitLab
from processors.model.finding import Finding
from sinks.gitlab import bodies  # noqa: F401 - registers the bodies issue_body finds
from sinks.gitlab.body import issue_body
from sinks.gitlab.markdown import fingerprint_label, kind_of
from sinks.graph.analytics import GraphReader
from streamer.mcp.common import Tools
from streamer.mcp.cypher import AgentCypher
from streamer.mcp.settings import McpSettings
from streamer.mcp.tools_findings import get_finding, list_findings
from tests.harness import Harness

GITLAB_TOKEN = "glpat-everywhere"
GITLAB_PROJECT = "trace-repro/everywhere"


def sink_settings(gitlab: FakeGitLab, directory: Path) -> dict[str, str]:
    """The harness overrides that turn on the file sink and the GitLab sink (on ``gitlab``)."""
    return {"FILE_SINK__ENABLED": "true", "FILE_SINK__DIRECTORY": str(directory), "GITLAB__URL": gitlab.url,
            "GITLAB__PROJECT": GITLAB_PROJECT, "GITLAB_TOKEN": GITLAB_TOKEN}  # fmt: skip


def _in_file(directory: Path, e: Finding) -> bool:
    path = directory / f"{kind_of(e)}s.jsonl"
    return path.exists() and any(
        json.loads(line)["occurrence"] == e.occurrence for line in path.read_text().splitlines()
    )


def _filed(gitlab: FakeGitLab, e: Finding) -> bool:
    """One issue of the fingerprint, titled by the body its type renders with."""
    issues = gitlab.issues(tag=fingerprint_label(e.fingerprint))
    return len(issues) == 1 and issues[0]["title"] == issue_body(e).title()


def _in_graph(h: Harness, e: Finding) -> bool:
    rows = h.graph_rows("MATCH (i:Incident {fingerprint: $fp}) RETURN count(i)", {"fp": e.fingerprint})
    return rows == [[1]]


async def assert_everywhere(h: Harness, gitlab: FakeGitLab, directory: Path, findings: list[Finding]) -> None:
    """Each of ``findings`` (published by the daemon ``h``) is on the incidents topic, in its kind's file, filed as
    its GitLab issue in the body its type renders with, an Incident node of the graph, and listed and shown by MCP."""
    k = h.settings.kafka
    on_topic = [json.loads(m.value) for m in await h.consume_all(k.incidents_topic, expect=len(findings))]
    assert {e.occurrence for e in findings} <= {m.get("occurrence") for m in on_topic}, "the incidents topic"
    for e in findings:
        what = f"{e.finding_type()} {e.fingerprint}"
        await h.wait_for(functools.partial(_in_file, directory, e), f"{what} in the file sink")
        await h.wait_for(functools.partial(_filed, gitlab, e), f"{what} on GitLab")
        await h.wait_for(functools.partial(_in_graph, h, e), f"{what} in the graph")
    settings = McpSettings(falkordb_url=h.falkordb_url, graph=h.settings.graph_name, kafka_bootstrap=k.bootstrap)
    reader = GraphReader(h.falkordb_url, h.settings.graph_name)
    tools = Tools(reader, settings, AgentCypher(h.falkordb_url, h.settings.graph_name, max_result_bytes=1 << 20,
                                                socket_timeout_s=15))  # fmt: skip
    try:
        for e in findings:
            shown = await get_finding(tools, e.fingerprint)
            listed = await list_findings(tools, anomaly=shown["anomaly"], limit=200)
            assert e.fingerprint in {i["fingerprint"] for i in listed["items"]}, f"MCP lists {e.fingerprint}"
            assert shown["severity"] in ("high", "medium", "low"), shown
    finally:
        await reader.close()
