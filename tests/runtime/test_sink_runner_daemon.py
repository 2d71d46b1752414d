"""One broken sink in a daemon on the real engines: it never stops detection or the other sinks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from processors.api.component import Context, Factory, Section
from processors.model.base import Published
from sinks.base import Sink
from streamer.components import default
from tests.gitlab.helpers import incident
from tests.harness import Harness, harness_settings
from tests.otlp_factory import ShopTelemetry, to_proto

pytestmark = pytest.mark.engines


class BrokenConfig(Section):
    """``[broken]``: nothing to configure."""


class BrokenSink(Sink):
    """Takes every event and raises RuntimeError on every flush."""

    name = "broken"

    def __init__(self) -> None:
        self.flushes = 0

    async def write(self, event: Published) -> None:
        pass

    async def flush(self) -> None:
        self.flushes += 1
        raise RuntimeError("a bug in a sink")


def _create(config: BrokenConfig, ctx: Context) -> BrokenSink:
    return BrokenSink()


BROKEN: Factory[BrokenConfig, BrokenSink] = Factory(
    kind="sink", name="broken", config=BrokenConfig, create=_create, topics=("incidents",)
)


async def test_a_sink_raising_on_every_flush_stops_neither_the_stages_nor_the_file_sink(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """Beside a sink whose flush always raises RuntimeError, the daemon keeps running: the stages consume and
    commit new spans, the file sink writes every incident, the broken sink's errors are counted and its consumer
    group commits nothing."""
    components = default().with_extra(BROKEN)
    settings = harness_settings(kafka_bootstrap, falkordb_url, components, FILE_SINK__ENABLED="true",
                                FILE_SINK__DIRECTORY=str(tmp_path))  # fmt: skip
    h = Harness(settings, kafka_bootstrap, falkordb_url, components=components)
    events = [incident(fingerprint=f"{i:016x}", occurrence=f"{i:016x}") for i in range(20)]
    try:
        await h.start()
        assert h.daemon is not None and h.task is not None
        broken = next(r for r in h.daemon.sink_runners if r.name == "broken")
        await h.produce(settings.kafka.incidents_topic, [e.model_dump_json().encode() for e in events])
        await h.wait_for(lambda: broken.telemetry.events.get("errors", 0) >= 3, "the broken sink failing")
        shop = ShopTelemetry()
        for i in range(5):
            shop.request(f"GET /item/{i}", start_ns=time.time_ns())
        await h.produce(settings.kafka.spans_topic, [to_proto(shop.take())])
        ingest = next(r for r in h.daemon.runners if r.name == "ingest")
        spans = TopicPartition(settings.kafka.spans_topic, 0)

        def spans_committed() -> bool:
            end = ingest.consumer.highwater(spans) if ingest.consumer is not None else None
            return bool(end) and ingest._committed.get(spans) == end

        await h.wait_for(spans_committed, "stage ingest to commit the new spans")
        written = tmp_path / "incidents.jsonl"
        await h.wait_for(lambda: written.exists() and len(written.read_text().splitlines()) == 20, "the file sink")
        assert [json.loads(line)["occurrence"] for line in written.read_text().splitlines()] == [
            e.occurrence for e in events
        ]
        assert not h.task.done() and broken.state == "retrying"
        assert broken.consumer is not None
        assert await broken.consumer.committed(TopicPartition(settings.kafka.incidents_topic, 0)) is None
        assert h.metric_total("trace_repro_sink_parked") == 0
    finally:
        await h.stop()
