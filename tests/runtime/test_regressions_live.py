"""Regressions reach people: the split service's builds through the daemon to the file sink and a GitLab issue."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bench.gitlab_server import FakeGitLab
from bench.shop.proof.traffic import run_scenario
from sinks.gitlab.markdown import fingerprint_label
from tests.harness import Harness, harness_settings

pytestmark = pytest.mark.engines

ROUNDING = "bench.shop.proof.split.RoundingError"
TOKEN = "glpat-regressions-live"
PROJECT = "trace-repro/split"


async def test_a_regression_is_written_by_the_file_sink_and_filed_once_on_gitlab(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """1.0's new RoundingError against 0.9 is detected by the daemon, published on the incidents topic, appended
    to regressions.jsonl once per occurrence, and filed as one GitLab issue per fingerprint."""
    with FakeGitLab(token=TOKEN, project=PROJECT) as gitlab:
        settings = harness_settings(
            kafka_bootstrap, falkordb_url, WINDOWS__WINDOW_S="1", WINDOWS__TRACE_GAP_S="0.2",
            FILE_SINK__ENABLED="true", FILE_SINK__DIRECTORY=str(tmp_path), GITLAB__URL=gitlab.url,
            GITLAB__PROJECT=PROJECT, GITLAB_TOKEN=TOKEN,
        )  # fmt: skip
        h = Harness(settings, kafka_bootstrap, falkordb_url)
        k = settings.kafka
        try:
            await h.start()
            await asyncio.to_thread(run_scenario, kafka_bootstrap, spans_topic=k.spans_topic,
                                    logs_topic=k.logs_topic, sequence=(("0.9", 400), ("1.0", 400)))  # fmt: skip
            written = tmp_path / "regressions.jsonl"

            def rounding() -> list[dict[str, object]]:
                if not written.exists():
                    return []
                events = [json.loads(line) for line in written.read_text().splitlines()]
                return [e for e in events if str(e["signature"]).endswith(ROUNDING)]

            await h.wait_for(lambda: len({e["operation"] for e in rounding()}) == 2, "both routes' regressions")
            found = rounding()
            assert all(e["version"] == "1.0" and e["previous_version"] == "0.9" for e in found)
            assert len({e["occurrence"] for e in found}) == len(found)  # written once per occurrence
            on_topic = [json.loads(m.value) for m in await h.consume_all(k.incidents_topic, expect=len(found))]
            assert {e["occurrence"] for e in found} <= {e.get("occurrence") for e in on_topic}
            regressions = [e for e in on_topic if e.get("kind") == "regression"]  # counted by service for alerts
            await h.wait_for(lambda: h.metric_total("trace_repro_regressions_total") >= len(regressions), "the counts")
            for e in regressions:
                assert h.daemon is not None
                sample = h.daemon.metrics.registry.get_sample_value(
                    "trace_repro_regressions_total", {"service": str(e["service"]), "metric": str(e["metric"])}
                )
                assert sample is not None and sample >= 1
            for fingerprint in {str(e["fingerprint"]) for e in found}:
                label = fingerprint_label(fingerprint)
                await h.wait_for(lambda label=label: len(gitlab.issues(tag=label)) == 1, f"the issue {label}")
                [issue] = gitlab.issues(tag=label)
                assert issue["title"].startswith("[trace-repro] Regression: ") and issue["state"] == "opened"
                assert "xychart-beta" in issue["description"]
        finally:
            await h.stop()
