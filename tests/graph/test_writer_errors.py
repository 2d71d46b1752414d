"""The graph writer's error classification and what it does for each class, against an injected fake graph client
(the same paths on the real FalkorDB are in test_writer_live.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis.exceptions as r
from falkordb.exceptions import SchemaVersionMismatchException

from sinks.graph.writer import GraphWriter, Handling, WriteAborted, classify

STATEMENT = "UNWIND $rows AS r MERGE (w:Window {id: r.id}) SET w.start = r.start"
Fault = Callable[[list[Any], int], BaseException | None]  # (rows of the call, call number) -> error to raise, or None


class FakeGraph:
    """A graph client whose ``query`` raises what ``fault`` says, and otherwise records the rows as written."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self.calls = 0
        self.written: list[Any] = []

    async def query(self, text: str, params: None = None, timeout: int | None = None) -> Any:  # noqa: ASYNC109
        self.calls += 1
        rows = _rows(text)
        error = self.fault(rows, self.calls)
        if error is not None:
            raise error
        self.written += rows
        return type("Result", (), {"result_set": []})()


def _rows(text: str) -> list[dict[str, Any]]:
    """The rows of a query text the writer sent: its ``CYPHER rows=[...]`` header, each row back as a map."""
    prefix = "CYPHER `rows`="
    if not text.startswith(prefix):
        return []  # a read
    assert text.endswith(STATEMENT.replace("r.id", "r[0]").replace("r.start", "r[1]"))
    sent, _ = json.JSONDecoder().raw_decode(text, len(prefix))
    return [dict(zip(("id", "start"), row, strict=True)) for row in sent]


class Recorder:
    """The writer's callbacks and sleep, recorded."""

    def __init__(self) -> None:
        self.retries: list[str] = []
        self.rejected: list[tuple[str, int]] = []
        self.sleeps: list[float] = []
        self.connects = 0

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def writer(graph: FakeGraph, rec: Recorder, **kw: Any) -> GraphWriter:
    async def connect() -> FakeGraph:
        rec.connects += 1
        return graph

    return GraphWriter(
        "redis://127.0.0.1:1",
        "g",
        on_retry=rec.retries.append,
        on_rejected=lambda op, n: rec.rejected.append((op, n)),
        sleep=rec.sleep,
        connect=connect,
        **kw,
    )


ROWS = [{"id": f"w{i}", "start": i} for i in range(64)]

TRANSIENT = [
    pytest.param(r.ResponseError("Max pending queries exceeded"), Handling.TRANSIENT, id="max-pending-queries"),
    pytest.param(r.BusyLoadingError("Redis is loading the dataset in memory"), Handling.RECONNECT, id="LOADING"),
    pytest.param(
        r.ResponseError("LOADING Redis is loading the dataset in memory"), Handling.TRANSIENT, id="LOADING-untyped"
    ),
    pytest.param(r.ReadOnlyError("You can't write against a read only replica."), Handling.TRANSIENT, id="READONLY"),
    pytest.param(
        r.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), Handling.TRANSIENT, id="OOM"
    ),
    pytest.param(
        r.ResponseError("OOM command not allowed when used memory > 'maxmemory'."), Handling.TRANSIENT, id="OOM-untyped"
    ),
    pytest.param(r.ResponseError("BUSY Redis is busy running a script."), Handling.TRANSIENT, id="BUSY"),
    pytest.param(r.TryAgainError("Multiple keys request during rehashing of slot"), Handling.TRANSIENT, id="TRYAGAIN"),
    pytest.param(r.ClusterDownError("The cluster is down"), Handling.TRANSIENT, id="CLUSTERDOWN"),
    pytest.param(r.MasterDownError("Link with MASTER is down"), Handling.TRANSIENT, id="MASTERDOWN"),
    pytest.param(r.NoPermissionError("this user has no permissions"), Handling.TRANSIENT, id="NOPERM"),
    pytest.param(SchemaVersionMismatchException(3), Handling.TRANSIENT, id="schema-version"),
    pytest.param(r.ConnectionError("Connection refused"), Handling.RECONNECT, id="connection-refused"),
    pytest.param(r.TimeoutError("Timeout reading from socket"), Handling.RECONNECT, id="socket-timeout"),
    pytest.param(ConnectionResetError(104, "reset"), Handling.RECONNECT, id="os-error"),
    pytest.param(r.ResponseError("Query timed out"), Handling.SHRINK, id="query-timeout"),
    pytest.param(r.ResponseError("Query's mem consumption exceeded capacity"), Handling.SHRINK, id="query-memory"),
]
PERMANENT = [
    pytest.param(r.ResponseError("Type mismatch: expected Integer but was String"), id="type-mismatch"),
    pytest.param(
        r.ResponseError("Property values can only be of primitive types or arrays of primitive types"),
        id="map-property",
    ),
    pytest.param(r.ResponseError("Cannot merge node using null property value"), id="null-merge"),
    pytest.param(r.ResponseError("unique constraint violation on node of type Window"), id="constraint"),
    pytest.param(r.ResponseError("Division by zero"), id="division"),
    pytest.param(ValueError("Cypher map key cannot be empty"), id="client-encoding"),
]


@pytest.mark.parametrize(("error", "handling"), TRANSIENT)
def test_server_conditions_are_transient(error: BaseException, handling: Handling) -> None:
    """Overload, loading, failover, memory, cluster and connection errors are never permanent."""
    assert classify(error) is handling


@pytest.mark.parametrize("error", PERMANENT)
def test_content_errors_are_permanent(error: BaseException) -> None:
    """Errors about what the rows contain are permanent."""
    assert classify(error) is Handling.PERMANENT


def test_an_unforeseen_error_is_unknown() -> None:
    """A server error no rule names is unknown (bounded retries), not permanent at once."""
    assert classify(r.ResponseError("Something FalkorDB 9 says")) is Handling.UNKNOWN


@pytest.mark.parametrize(("error", "handling"), [p for p in TRANSIENT if "SHRINK" not in str(p.values[1])])
async def test_transient_errors_are_retried_until_every_row_is_written(
    error: BaseException, handling: Handling
) -> None:
    """Seven failures in a row: every row is written in the end, none rejected, each retry counted and backed off
    with a growing delay that never exceeds the cap."""
    graph = FakeGraph(lambda rows, n: error if n <= 7 else None)
    rec = Recorder()
    written = await writer(graph, rec, backoff_s=0.1, max_backoff_s=1.0).write_rows("windows", STATEMENT, ROWS)
    assert written == 64 and graph.written == ROWS and rec.rejected == []
    assert rec.retries == ["windows"] * 7 and len(rec.sleeps) == 7
    assert all(s <= 1.0 for s in rec.sleeps) and rec.sleeps[-1] >= 0.5 > rec.sleeps[0]
    assert rec.connects == (8 if handling is Handling.RECONNECT else 1)  # only a suspect connection is dropped


async def test_a_statement_too_big_for_the_server_is_written_in_halves() -> None:
    """A query timeout on more than 8 rows: the batch is split until the pieces pass; nothing is rejected."""
    graph = FakeGraph(lambda rows, n: r.ResponseError("Query timed out") if len(rows) > 8 else None)
    rec = Recorder()
    assert await writer(graph, rec).write_rows("windows", STATEMENT, ROWS) == 64
    assert sorted(graph.written, key=lambda x: x["start"]) == ROWS and rec.rejected == []
    assert len(rec.retries) == 7  # 64 -> 2x32 -> 4x16 -> 8x8: one retry per refused statement


async def test_a_single_row_that_times_out_is_retried_not_dropped() -> None:
    """One row cannot be split further: its timeout is retried like any transient error."""
    graph = FakeGraph(lambda rows, n: r.ResponseError("Query timed out") if n <= 3 else None)
    rec = Recorder()
    assert await writer(graph, rec).write_rows("windows", STATEMENT, ROWS[:1]) == 1
    assert rec.rejected == [] and len(rec.sleeps) == 3


async def test_a_permanent_error_isolates_exactly_the_bad_rows() -> None:
    """Two rows the graph refuses among 64: they are found by halving, dropped and counted; 62 are written."""
    bad = {"w7", "w40"}

    def fault(rows: list[Any], n: int) -> BaseException | None:
        if any(row["id"] in bad for row in rows):
            return r.ResponseError("Type mismatch: expected Integer but was Map")
        return None

    graph, rec = FakeGraph(fault), Recorder()
    assert await writer(graph, rec).write_rows("windows", STATEMENT, ROWS) == 62
    assert rec.rejected == [("windows", 1), ("windows", 1)] and rec.retries == [] and rec.sleeps == []
    assert {row["id"] for row in graph.written} == {row["id"] for row in ROWS} - bad


async def test_an_unknown_error_that_passes_loses_nothing() -> None:
    """An unforeseen error that goes away within ``unknown_attempts`` is retried, and every row is written."""
    graph = FakeGraph(lambda rows, n: r.ResponseError("new server condition") if n <= 2 else None)
    rec = Recorder()
    assert await writer(graph, rec, unknown_attempts=3).write_rows("windows", STATEMENT, ROWS) == 64
    assert rec.rejected == [] and len(rec.retries) == 2


async def test_an_unknown_error_that_persists_is_treated_as_permanent() -> None:
    """An unforeseen error on one row: retried ``unknown_attempts`` times, then isolated without more retries."""
    graph = FakeGraph(lambda rows, n: r.ResponseError("no rule for this") if ROWS[5] in rows else None)
    rec = Recorder()
    assert await writer(graph, rec, unknown_attempts=3).write_rows("windows", STATEMENT, ROWS) == 63
    assert rec.rejected == [("windows", 1)] and len(rec.sleeps) == 2 and ROWS[5] not in graph.written


async def test_stopping_ends_a_transient_wait_with_write_aborted() -> None:
    """While the daemon stops, a transient error aborts the write instead of waiting (the input is replayed)."""
    stopping = asyncio.Event()
    stopping.set()
    graph = FakeGraph(lambda rows, n: r.ResponseError("Max pending queries exceeded"))
    with pytest.raises(WriteAborted):
        await writer(graph, Recorder(), stopping=stopping).write_rows("windows", STATEMENT, ROWS)
    assert graph.written == []


async def test_a_query_refused_for_good_raises_falkordbs_own_error() -> None:
    """``query`` retries transient errors, and raises a permanent one as the ResponseError FalkorDB sent."""
    errors = [r.ReadOnlyError("READONLY"), r.ResponseError("Type mismatch: expected Node but was Relationship")]
    graph = FakeGraph(lambda rows, n: errors[n - 1] if n <= 2 else None)
    rec = Recorder()
    with pytest.raises(r.ResponseError, match="Type mismatch"):
        await writer(graph, rec).query("MATCH (n) RETURN n")
    assert rec.retries == ["query"]
