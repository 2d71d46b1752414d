"""A sink runner never waits on the broker without a bound: its backlog measurement, which asks the group's
committed offsets, gives up after ``PROBE_TIMEOUT_S`` when the broker is away, so a stop request is seen.

(Found by the Kafka-outage fault test: killed a second time, the broker left a runner inside
``consumer.committed`` while the daemon was asked to stop, and the stop never ended.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import TopicPartition

import streamer.runtime.sink_runner
from sinks.files import FileSink
from streamer.runtime.metrics import Metrics
from streamer.runtime.sink_runner import SinkRunner
from tests.harness import harness_settings

TP = TopicPartition("trace-repro.incidents", 0)


class AwayBroker:
    """The consumer's calls as aiokafka makes them with the broker gone: the end offsets come from the fetcher's
    cache, the group's committed offset never comes."""

    def __init__(self) -> None:
        self.asked_committed = 0

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(partitions, 7)

    async def committed(self, tp: TopicPartition) -> int | None:
        self.asked_committed += 1
        await asyncio.Event().wait()  # the coordinator never answers
        return None


async def test_the_backlog_measurement_gives_up_while_the_broker_is_away(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(streamer.runtime.sink_runner, "PROBE_TIMEOUT_S", 0.2)
    settings = harness_settings("127.0.0.1:9", "redis://127.0.0.1:9")
    runner = SinkRunner("file", FileSink(tmp_path), settings=settings, topics=[TP.topic], metrics=Metrics())
    consumer = AwayBroker()
    await asyncio.wait_for(runner._measure_backlog(consumer), 5)  # type: ignore[arg-type]
    assert consumer.asked_committed == 1
    assert runner.metrics.sink_backlog.labels("file")._value.get() == 0  # not measured: nothing set
