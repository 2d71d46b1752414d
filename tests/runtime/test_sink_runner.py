"""The sink runner on the real Kafka: nothing held twice through retry cycles (a recording sink, the GitLab sink and
the file sink), Retry-After honoured, commits only after a successful flush, a parked GitLab sink that resumes on
its own, a full sink that reads the rest later, and a sink's exceptions that never end the runner."""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from pydantic import SecretStr

import streamer.runtime.sink_runner
from bench.gitlab_server import FakeGitLab
from processors.model.base import Published
from processors.model.outputs import IncidentEvent
from sinks.base import RetryableSinkError, Sink
from sinks.files import FileSink
from sinks.gitlab import GitLabSink, markdown
from streamer.config import Settings
from streamer.runtime.metrics import Metrics
from streamer.runtime.sink_runner import SinkRunner
from streamer.runtime.topics import create_topics
from tests.gitlab.helpers import PROJECT, TOKEN, incident
from tests.harness import harness_settings

pytestmark = pytest.mark.engines


class RecordingSink(Sink):
    """Records every write; its flushes fail with what ``failures`` holds (popped one per flush), then succeed."""

    name = "recording"

    def __init__(self, failures: Sequence[Exception] = ()) -> None:
        self.failures = list(failures)
        self.writes: list[str] = []
        self.delivered: list[str] = []
        self.flushes: list[float] = []  # monotonic time of each flush call
        self._buffer: list[str] = []

    async def write(self, event: Published) -> None:
        self.writes.append(event.event_id)
        self._buffer.append(event.event_id)

    async def flush(self) -> None:
        self.flushes.append(time.monotonic())
        if self.failures:
            raise self.failures.pop(0)
        self.delivered += self._buffer
        self._buffer = []


def incidents(n: int) -> list[IncidentEvent]:
    """``n`` incidents of ``n`` different defects."""
    return [incident(fingerprint=f"{i:016x}", occurrence=f"{i:016x}") for i in range(n)]


def filed(server: FakeGitLab) -> list[str]:
    """The fingerprints of the issues on the server, in the order they were filed."""
    issues = sorted(server.issues(), key=lambda i: int(i["iid"]))
    return [str(markdown.fingerprint_of(i["description"])) for i in issues]


class Bench:
    """A topic of output events on the real Kafka and a runner for one sink on it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = f"out-{uuid.uuid4().hex[:8]}"
        self.tp = TopicPartition(self.topic, 0)
        self.metrics = Metrics()

    async def produce(self, events: Sequence[Published]) -> None:
        await create_topics(self.settings.kafka.bootstrap, {self.topic: 1})
        producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka.bootstrap)
        await producer.start()
        try:
            for e in events:
                await producer.send(self.topic, e.model_dump_json().encode())
            await producer.flush()
        finally:
            await producer.stop()

    def runner(self, sink: Sink, **kw: Any) -> SinkRunner:
        options: dict[str, Any] = {"backoff_s": 0.05, "max_backoff_s": 0.2, "probe_s": 0.1, "max_probe_s": 0.3}
        options.update(kw)
        return SinkRunner(sink.name, sink, settings=self.settings, topics=[self.topic], metrics=self.metrics,
                          **options)  # fmt: skip

    async def committed(self, runner: SinkRunner) -> int | None:
        assert runner.consumer is not None
        offset: int | None = await runner.consumer.committed(self.tp)
        return offset

    def parked(self, runner: SinkRunner) -> float:
        return float(self.metrics.sink_parked.labels(runner.name)._value.get())

    def backlog(self, runner: SinkRunner) -> float:
        return float(self.metrics.sink_backlog.labels(runner.name)._value.get())

    @asynccontextmanager
    async def running(self, runner: SinkRunner) -> AsyncIterator[asyncio.Task[None]]:
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        try:
            yield task
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


async def until(task: asyncio.Task[None], predicate: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Wait for ``predicate``; fail at once if the runner ended (it must not)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert not task.done(), f"the runner ended while waiting for {what}: {task.exception()!r}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
def bench(kafka_bootstrap: str, falkordb_url: str) -> Bench:
    return Bench(harness_settings(kafka_bootstrap, falkordb_url))


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Every structlog line of the sink runner, as JSON lines in a buffer."""
    buf = io.StringIO()
    logger = structlog.wrap_logger(structlog.PrintLogger(buf), processors=[structlog.processors.JSONRenderer()])
    monkeypatch.setattr(streamer.runtime.sink_runner, "log", logger)
    return buf


def events_logged(buf: io.StringIO, name: str) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, buf.getvalue().splitlines()) if line["event"] == name]


@pytest.fixture
def gitlab() -> Any:
    with FakeGitLab(token=TOKEN, project=PROJECT) as srv:
        yield srv


async def test_retry_cycles_write_each_event_once_and_wait_at_least_retry_after(
    bench: Bench, logged: io.StringIO
) -> None:
    """Five failed flushes asking Retry-After 0.3 s: every event is written to the sink exactly once, the attempts
    are at least 0.3 s apart, nothing is committed until the flush succeeds, then everything is."""
    sink = RecordingSink([RetryableSinkError("down", retry_after_s=0.3) for _ in range(5)])
    events = incidents(200)
    await bench.produce(events)
    runner = bench.runner(sink)
    async with bench.running(runner) as task:
        await until(task, lambda: len(sink.flushes) >= 3, "three failed flushes")
        assert await bench.committed(runner) is None and runner.state == "retrying"
        await until(task, lambda: len(sink.delivered) == 200, "the delivery")
        await until(task, lambda: runner._committed.get(bench.tp) == 200, "the commit")
        assert await bench.committed(runner) == 200
    assert sorted(sink.writes) == sorted(e.event_id for e in events) and sink.delivered == sink.writes
    gaps = [b - a for a, b in zip(sink.flushes, sink.flushes[1:6], strict=False)]
    assert len(gaps) == 5 and min(gaps) >= 0.3
    assert runner.telemetry.events["retries"] == 5 and "errors" not in runner.telemetry.events
    assert len(events_logged(logged, "sink.retrying")) == 1 and len(events_logged(logged, "sink.recovered")) == 1


async def test_gitlab_queue_does_not_grow_across_retry_cycles(bench: Bench, gitlab: FakeGitLab) -> None:
    """GitLab answers 500 to every new issue for five retry cycles: the sink holds the 200 events once (not 200 per
    cycle), and when GitLab recovers every event is filed exactly once, in order."""
    sink = GitLabSink(gitlab.url, PROJECT, SecretStr(TOKEN), max_attempts=1, timeout_s=5)
    gitlab.inject(r"/issues$", "error", method="POST", status=500, count=10_000)
    events = incidents(200)
    await bench.produce(events)
    runner = bench.runner(sink)
    async with bench.running(runner) as task:
        await until(task, lambda: runner.telemetry.events.get("retries", 0) >= 5, "five retry cycles")
        assert sink.pending == 200 and runner.held == 200 and await bench.committed(runner) is None
        gitlab.clear_faults()
        await until(task, lambda: sink.pending == 0 and runner._committed.get(bench.tp) == 200, "the delivery")
    assert filed(gitlab) == [e.fingerprint for e in events]


async def test_file_sink_buffer_does_not_grow_across_retry_cycles(bench: Bench, tmp_path: Path) -> None:
    """The file sink's directory is a plain file for five retry cycles (every flush fails with an OSError): the sink
    buffers the 200 events once, and once the directory is back each is written exactly once."""
    directory = tmp_path / "events"
    sink = FileSink(directory)
    directory.rmdir()
    directory.write_text("not a directory")
    events = incidents(200)
    await bench.produce(events)
    runner = bench.runner(sink)
    async with bench.running(runner) as task:
        await until(task, lambda: runner.telemetry.events.get("retries", 0) >= 5, "five retry cycles")
        assert sink.buffered == 200 and await bench.committed(runner) is None
        directory.unlink()
        directory.mkdir()
        await until(task, lambda: runner._committed.get(bench.tp) == 200, "the delivery")
    lines = (directory / "incidents.jsonl").read_text().splitlines()
    assert [json.loads(line)["occurrence"] for line in lines] == [e.occurrence for e in events]


async def test_a_parked_gitlab_sink_keeps_everything_and_resumes_on_its_own(
    bench: Bench, gitlab: FakeGitLab, logged: io.StringIO
) -> None:
    """The token expires: the sink is parked (gauge 1, logged once, nothing committed, its backlog gauge counts
    every undelivered event) while events keep coming; the token is accepted again: the probe sees it, everything
    kept is filed in order and once, the offsets are committed, the gauges are 0 and the resumption is logged once."""
    sink = GitLabSink(gitlab.url, PROJECT, SecretStr(TOKEN), timeout_s=5)
    events = incidents(30)
    gitlab.token = "glpat-someone-else"
    await bench.produce(events[:20])
    runner = bench.runner(sink, backlog_every_s=0.05)
    async with bench.running(runner) as task:
        await until(task, lambda: runner.state == "parked" and runner.held == 20, "parking")
        assert bench.parked(runner) == 1.0
        await bench.produce(events[20:])
        await until(task, lambda: runner.held == 30, "the events that came while parked")
        await until(task, lambda: bench.backlog(runner) == 30, "the backlog gauge of the parked sink")
        await asyncio.sleep(1.0)  # several probes fail meanwhile
        assert await bench.committed(runner) is None and gitlab.issues() == []
        gitlab.token = TOKEN
        await until(task, lambda: runner._committed.get(bench.tp) == 30, "the resumption")
        assert runner.state == "running" and bench.parked(runner) == 0.0
        await until(task, lambda: bench.backlog(runner) == 0, "the backlog gauge once delivered")
    assert filed(gitlab) == [e.fingerprint for e in events]
    assert [p["error"] for p in events_logged(logged, "sink.parked")] == ["GitLabParkedError"]
    assert len(events_logged(logged, "sink.resumed")) == 1
    assert TOKEN not in logged.getvalue()


async def test_a_full_sink_is_fed_nothing_more_and_reads_the_rest_later(bench: Bench, gitlab: FakeGitLab) -> None:
    """A parked GitLab sink with room for 10 events: the runner stops feeding it at 10 (the refusals are counted
    drops, nothing is committed); once GitLab accepts it again, all 30 are filed, in order, once."""
    sink = GitLabSink(gitlab.url, PROJECT, SecretStr(TOKEN), timeout_s=5, max_queued=10)
    events = incidents(30)
    gitlab.token = "glpat-someone-else"
    await bench.produce(events)
    runner = bench.runner(sink)
    async with bench.running(runner) as task:
        await until(task, lambda: runner.state == "parked" and sink.pending == 10, "a full parked sink")
        await asyncio.sleep(0.5)
        assert sink.pending == 10 and sink.telemetry.dropped["max_queued"] >= 1
        assert await bench.committed(runner) is None
        gitlab.token = TOKEN
        await until(task, lambda: runner._committed.get(bench.tp) == 30, "the rest, read again")
    assert filed(gitlab) == [e.fingerprint for e in events]


async def test_a_sink_that_raises_anything_is_retried_and_the_runner_carries_on(
    bench: Bench, logged: io.StringIO
) -> None:
    """RuntimeError, KeyError and ValueError from flush: counted as errors, logged by type (once per type, not per
    event), retried with backoff; the runner never ends, and then delivers and commits."""
    sink = RecordingSink([RuntimeError("bug"), RuntimeError("bug"), KeyError("k"), ValueError("v")])
    events = incidents(50)
    await bench.produce(events)
    runner = bench.runner(sink)
    async with bench.running(runner) as task:
        await until(task, lambda: runner._committed.get(bench.tp) == 50, "the delivery")
    assert sink.delivered == [e.event_id for e in events]
    assert runner.telemetry.events["errors"] == 4 and runner.telemetry.events["retries"] == 4
    logged_errors = [line["error"] for line in events_logged(logged, "sink.retrying")]
    assert logged_errors == ["RuntimeError", "KeyError", "ValueError"]
