"""The "Extending" examples (docs/extending.md): a detector in one folder, registered in one line, publishes through
the daemon; one that publishes findings of its own registered type reaches every sink, the graph and MCP."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind

from bench.gitlab_server import FakeGitLab
from processors.model.finding import FindingEvent
from sinks.gitlab.body_finding import description
from sinks.gitlab.markdown import fingerprint_label
from streamer.components import default
from tests.extending import slow_requests
from tests.extending.slow_statements import FACTORY
from tests.harness import Harness, harness_settings
from tests.otlp_factory import ShopTelemetry, to_proto
from tests.runtime.everywhere import GITLAB_PROJECT, GITLAB_TOKEN, assert_everywhere, sink_settings

pytestmark = pytest.mark.engines

SLOW = "SELECT * FROM orders WHERE created < now() - interval '1 year'"


def _request(shop: ShopTelemetry, start_ns: int, db_ms: float) -> None:
    """A request whose one DB statement takes ``db_ms``."""
    with shop.tracer.start_as_current_span("GET /report", kind=SpanKind.SERVER, start_time=start_ns,
                                           end_on_exit=False) as server:  # fmt: skip
        db = shop.tracer.start_span("db", kind=SpanKind.CLIENT, start_time=start_ns + 1_000_000)
        db.set_attribute("db.system.name", "postgresql")
        db.set_attribute("db.query.text", SLOW)
        db.end(end_time=start_ns + 1_000_000 + int(db_ms * 1e6))
        server.end(end_time=start_ns + 2_000_000 + int(db_ms * 1e6))


def _slow_and_fast() -> bytes:
    """Two requests of one DB statement each: one taking 350 ms (slow), one 20 ms (fast)."""
    shop = ShopTelemetry()
    now = time.time_ns()
    _request(shop, now, db_ms=350)
    _request(shop, now + 500_000_000, db_ms=20)
    return to_proto(shop.take())


async def test_an_extra_detector_registered_in_one_line_publishes_to_the_topic_and_the_sinks(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """With ``default().with_extra(FACTORY)`` the daemon builds the new detector, validates its config section,
    publishes its events on the incidents topic and hands them to every sink (here: the file sink)."""
    components = default().with_extra(FACTORY)
    settings = harness_settings(kafka_bootstrap, falkordb_url, components, SLOW_STATEMENTS__THRESHOLD_MS="100",
                                FILE_SINK__ENABLED="true", FILE_SINK__DIRECTORY=str(tmp_path))  # fmt: skip
    h = Harness(settings, kafka_bootstrap, falkordb_url, components=components)
    try:
        await h.start()
        await h.produce(settings.kafka.spans_topic, [_slow_and_fast()])
        messages = await h.consume_all(settings.kafka.incidents_topic, expect=1)
        found = [json.loads(m.value) for m in messages]
        assert [(e["kind"], e["statement"]) for e in found] == [("slow_statement", SLOW)]
        assert 349 < found[0]["duration_ms"] < 352
        written = tmp_path / "slow_statements.jsonl"
        await h.wait_for(lambda: written.exists() and written.read_text().count("\n") == 1, "the file sink")
        assert json.loads(written.read_text())["span_id"] == found[0]["span_id"]
        assert h.metric_total("trace_repro_component_events_total") > 0
    finally:
        await h.stop()


async def test_a_findings_detector_added_in_one_line_reaches_every_sink_the_graph_and_mcp(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """``tests/extending/slow_requests`` registers its finding type and publishes ``FindingEvent`` s; with
    ``default().with_extra(FACTORY)`` and no other code, its finding is on the incidents topic, in
    ``findings.jsonl``, a GitLab issue in the generic body, an ``Incident:Finding`` node on its Operation, and
    listed by MCP under its type; the fast request is not reported."""
    components = default().with_extra(slow_requests.FACTORY)
    with FakeGitLab(token=GITLAB_TOKEN, project=GITLAB_PROJECT) as gitlab:
        settings = harness_settings(kafka_bootstrap, falkordb_url, components, SLOW_REQUESTS__THRESHOLD_MS="100",
                                    **sink_settings(gitlab, tmp_path))  # fmt: skip
        h = Harness(settings, kafka_bootstrap, falkordb_url, components=components)
        try:
            await h.start()
            await h.produce(settings.kafka.spans_topic, [_slow_and_fast()])
            [message] = await h.consume_all(settings.kafka.incidents_topic, expect=1)
            found = FindingEvent.model_validate_json(message.value)
            assert (found.type, found.subject.service, found.subject.operation) == (
                "slow_request", "checkout", "GET /report")  # fmt: skip
            assert found.data["db_statements"] == 1 and 351 < found.data["duration_ms"] < 354
            await assert_everywhere(h, gitlab, tmp_path, [found])
            [issue] = gitlab.issues(tag=fingerprint_label(found.fingerprint))
            assert issue["description"] == description(found) and "anomaly::slow_request" in issue["labels"]
            on = h.graph_rows("MATCH (:Finding {fingerprint: $fp})-[:ON]->(o:Operation) RETURN o.name",
                              {"fp": found.fingerprint})  # fmt: skip
            assert on == [["GET /report"]]
            assert len((tmp_path / "findings.jsonl").read_text().splitlines()) == 1
            assert h.metric_total("trace_repro_findings_total") == 1
        finally:
            await h.stop()
