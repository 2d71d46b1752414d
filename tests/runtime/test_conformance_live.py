"""Containment on the real engines: the daemon keeps consuming and committing beside processors that always raise,
every hook of every registered sink that raises costs a retry and never an event, and the runtime's own graph sink
failing (after its own retries) ends the daemon loudly, after which a restart loses nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from processors.api.component import Context, Emit, Factory, Processor, Section
from processors.graph.rows import GraphPolicyConfig
from processors.model.base import Published
from processors.model.events import Access, Commit, LogRecord, Relay
from processors.model.trace import ClosedTrace
from sinks.base import Sink
from streamer.components import FACTORIES, default
from streamer.runtime.context import RuntimeContext, create
from streamer.runtime.metrics import Metrics
from streamer.runtime.sink_runner import SinkRunner
from tests.gitlab.helpers import incident
from tests.harness import Harness, harness_settings
from tests.otlp_factory import ShopTelemetry, to_proto
from tests.runtime.test_sink_runner import Bench, until

pytestmark = pytest.mark.engines

UPDATE = "UPDATE orders SET status = %s WHERE id = %s"


class Injected(RuntimeError):
    """The fault."""


class RaisingConfig(Section):
    """``[raising_*]``: nothing to configure."""


class Raising(Processor):
    """A processor every hook of which raises, every time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def _raise(self, *args: Any) -> None:
        self.calls += 1
        raise Injected(self.name)

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        self._raise()

    def on_log(self, record: LogRecord, part: str) -> None:
        self._raise()

    def on_event(self, event: Published, part: str) -> None:
        self._raise()

    def on_access(self, access: Access) -> None:
        self._raise()

    def on_commit(self, entity: str, commit: Commit) -> None:
        self._raise()

    def on_relay(self, relay: Relay, part: str) -> None:
        self._raise()

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        self._raise()

    def on_assign(self, part: str) -> None:
        self._raise()

    def on_revoke(self, part: str) -> None:
        self._raise()

    async def sync(self) -> None:
        self._raise()


def _raising(stage: str) -> Factory[RaisingConfig, Raising]:
    return Factory(kind="detector", name=f"raising_{stage}", config=RaisingConfig, stage=stage,  # type: ignore[arg-type]
                   create=lambda config, ctx: Raising(f"raising_{stage}"), topics=("incidents",))  # fmt: skip


def _traces(n: int) -> list[bytes]:
    """``n`` requests touching a row each, one message each."""
    shop = ShopTelemetry()
    now = time.time_ns()
    out = []
    for i in range(n):
        shop.request(f"/orders/{i}", statements=[(UPDATE, f"('paid', {i})")], start_ns=now + i * 2_000_000)
        out.append(to_proto(shop.take()))
    return out


async def test_the_daemon_keeps_consuming_and_committing_beside_processors_that_always_raise(
    kafka_bootstrap: str, falkordb_url: str
) -> None:
    """A processor in each stage whose every hook raises, every time: the stages consume and commit everything, every
    trace reaches the graph, and the failures are counted against those processors."""
    components = default().with_extra(_raising("ingest"), _raising("entities"))
    settings = harness_settings(kafka_bootstrap, falkordb_url, components, PROOF__SETTLE_S="1")
    settings = settings.model_copy(update={"graph_policy": GraphPolicyConfig(detail="all")})
    h = Harness(settings, kafka_bootstrap, falkordb_url, components=components)
    try:
        await h.start()
        assert h.daemon is not None
        await h.produce(settings.kafka.spans_topic, _traces(20))
        await h.wait_for(lambda: h.count("MATCH (t:Trace) RETURN count(t)") == 20, "every trace in the graph")
        await h.wait_for(h.drained, "both stages to commit everything")
        for stage in ("ingest", "entities"):
            assert h.daemon.metrics.telemetry(f"raising_{stage}").dropped.get("error", 0) > 0
        assert h.daemon.failure == "" and h.task is not None and not h.task.done()
    finally:
        await h.stop()


async def test_a_graph_write_that_raises_ends_the_daemon_loudly_and_a_restart_loses_nothing(
    kafka_bootstrap: str, falkordb_url: str
) -> None:
    """The graph sink raises on a write (an error it gave up on): stage 1 fails, the daemon exits 1 without
    committing that batch, and a restart writes every trace."""
    settings = harness_settings(kafka_bootstrap, falkordb_url, PROOF__SETTLE_S="1")
    settings = settings.model_copy(update={"graph_policy": GraphPolicyConfig(detail="all")})
    h = Harness(settings, kafka_bootstrap, falkordb_url)
    try:
        await h.start()
        assert h.daemon is not None and h.task is not None
        graph = h.daemon.graph
        write = graph.write_batch

        async def failing(batch: Any, *args: Any) -> int:
            if batch.traces:
                raise Injected("the graph gave up")
            return await write(batch, *args)

        graph.write_batch = failing  # type: ignore[method-assign]
        await h.produce(settings.kafka.spans_topic, _traces(10))
        assert await asyncio.wait_for(h.task, 60) == 1
        assert h.daemon.failure == "stage ingest: Injected"
        h.daemon = None
        await h.start()  # the restart: same group, same graph
        await h.wait_for(lambda: h.count("MATCH (t:Trace) RETURN count(t)") == 10, "every trace after the restart")
        await h.wait_for(h.drained, "the restart to commit everything")
    finally:
        await h.stop()


class FaultySink(Sink):
    """A registered sink whose ``hook`` raises once, then behaves."""

    def __init__(self, sink: Sink, hook: str) -> None:
        self.sink, self.hook, self.name = sink, hook, sink.name
        self.fired = False

    def _fault(self, hook: str) -> None:
        if hook == self.hook and not self.fired:
            self.fired = True
            raise Injected(f"{self.name}.{hook}")

    async def write(self, event: Published) -> None:
        self._fault("write")
        await self.sink.write(event)

    async def flush(self) -> None:
        self._fault("flush")
        await self.sink.flush()

    async def healthcheck(self) -> bool:
        self._fault("healthcheck")
        return await self.sink.healthcheck()

    async def close(self) -> None:
        self._fault("close")
        await self.sink.close()


OUTPUT_SINKS = [f for f in FACTORIES if f.kind == "sink" and not f.stage]


def test_the_registry_has_the_sinks_this_covers() -> None:
    """Every registered sink is either built and faulted here (files) or runs through the same runner, whose
    handling does not depend on the sink (the GitLab sink's faults: ``test_sink_runner``)."""
    assert {f.name for f in OUTPUT_SINKS} == {"gitlab", "file_sink"}


@pytest.mark.parametrize("hook", ["write", "flush", "close", "healthcheck"])
async def test_a_sink_hook_that_raises_once_costs_a_retry_never_an_event(
    hook: str, bench: Bench, tmp_path: Path
) -> None:
    """The file sink, built from the registry, raises once from ``hook``: every event is delivered once and
    committed, the runner never ends on it (``close`` raising is logged as it stops), and a health check that raises
    counts as failing."""
    factory = next(f for f in OUTPUT_SINKS if f.name == "file_sink")
    settings = harness_settings(bench.settings.kafka.bootstrap, bench.settings.falkordb.url,
                                FILE_SINK__ENABLED="true", FILE_SINK__DIRECTORY=str(tmp_path))  # fmt: skip
    ctx: Context = RuntimeContext(settings, Metrics(), time.time_ns)
    sink = FaultySink(create(factory, ctx, settings), hook)
    if hook == "healthcheck":
        assert not await SinkRunner._healthy(bench.runner(sink))  # the daemon's check does the same: False
        assert await sink.healthcheck()
        return
    events = [incident(fingerprint=f"{i:016x}", occurrence=f"{i:016x}") for i in range(30)]
    await bench.produce(events)
    runner = bench.runner(sink)
    async with bench.running(runner) as task:
        await until(task, lambda: runner._committed.get(bench.tp) == 30, "every event committed")
    assert not task.exception()
    assert sink.fired
    written = (tmp_path / "incidents.jsonl").read_text().splitlines()
    assert [json.loads(line)["occurrence"] for line in written] == [e.occurrence for e in events]


@pytest.fixture
def bench(kafka_bootstrap: str, falkordb_url: str) -> Bench:
    return Bench(harness_settings(kafka_bootstrap, falkordb_url))
