"""The graph writer's error classification and what it does for each class, against an injected fake graph client
(the same paths on the real FalkorDB are in test_writer_live.py and test_hostile_rows_live.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
import redis.exceptions as r
from falkordb.exceptions import SchemaVersionMismatchException

from sinks.graph import schema
from sinks.graph.writer import GraphWriter, Handling, WriteAborted, classify

STATEMENT = "UNWIND $rows AS r MERGE (w:Window {id: r.id}) SET w.start = r.start"
Fault = Callable[[list[Any], int], BaseException | None]  # (rows of the call, call number) -> error to raise, or None


class FakeGraph:
    """A graph client whose ``query`` raises what ``fault`` says, and otherwise records the rows as written."""

    def __init__(self, fault: Fault, columns: tuple[str, ...] = ("id", "start")) -> None:
        self.fault = fault
        self.columns = columns
        self.calls = 0
        self.written: list[Any] = []

    async def query(self, text: str, params: None = None, timeout: int | None = None) -> Any:  # noqa: ASYNC109
        self.calls += 1
        rows = self._rows(text)
        error = self.fault(rows, self.calls)
        if error is not None:
            raise error
        self.written += rows
        return type("Result", (), {"result_set": []})()

    def _rows(self, text: str) -> list[Any]:
        """The rows of a query text the writer sent: its ``CYPHER rows=[...]`` header, each row back as a map (or as
        the positional list it is, without column names)."""
        prefix = "CYPHER `rows`="
        if not text.startswith(prefix):
            return []  # a read
        sent, _ = json.JSONDecoder().raw_decode(text, len(prefix))
        if not self.columns:
            return list(sent)
        return [dict(zip(self.columns, row, strict=True)) for row in sent]


class Recorder:
    """The writer's callbacks and sleep, recorded; a writer that sleeps 1,000 times for one write retries forever."""

    def __init__(self) -> None:
        self.retries: list[str] = []
        self.rejected: list[tuple[str, int]] = []
        self.sleeps: list[float] = []
        self.connects = 0

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if len(self.sleeps) > 1000:
            raise AssertionError("the writer retries this for ever")


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
MISCONF = (
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk. Commands that "
    "may modify the data set are disabled, because this instance is configured to report errors during writes if RDB "
    "snapshotting fails (stop-writes-on-bgsave-error option). Please check the Redis logs for details about the RDB "
    "error."
)
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
    pytest.param(r.ResponseError(MISCONF), Handling.TRANSIENT, id="MISCONF"),
    pytest.param(r.ResponseError("NOREPLICAS Not enough good replicas to write."), Handling.TRANSIENT, id="NOREPLICAS"),
    pytest.param(SchemaVersionMismatchException(3), Handling.TRANSIENT, id="schema-version"),
    pytest.param(r.ConnectionError("Connection refused"), Handling.RECONNECT, id="connection-refused"),
    pytest.param(r.AuthenticationError("invalid username-password pair"), Handling.RECONNECT, id="WRONGPASS"),
    pytest.param(r.TimeoutError("Timeout reading from socket"), Handling.RECONNECT, id="socket-timeout"),
    pytest.param(ConnectionResetError(104, "reset"), Handling.RECONNECT, id="os-error"),
    pytest.param(r.ResponseError("Query timed out"), Handling.SHRINK, id="query-timeout"),
    pytest.param(r.ResponseError("Query's mem consumption exceeded capacity"), Handling.SHRINK, id="query-memory"),
]
# Errors no rule names, or that are about the statement or the server: never a row's content.
UNKNOWN = [
    pytest.param(r.ResponseError("unknown command 'GRAPH.QUERY', with args beginning with: "), id="unknown-command"),
    pytest.param(r.ResponseError("Unknown function 'nosuch'"), id="unknown-function"),
    pytest.param(r.ResponseError("errMsg: Invalid input ')': expected '.' line: 1, column: 39, offset: 38 errCtx: "
                                 "UNWIND $rows AS r MERGE (w:W {id: r[0]) errCtxOffset: 38"),
                 id="statement-parse-error"),
    pytest.param(r.ResponseError("Invalid graph operation on empty key"), id="not-a-graph"),
    pytest.param(r.ResponseError("Division by zero"), id="division"),
    pytest.param(r.ResponseError("Something FalkorDB 9 says"), id="unforeseen"),
]  # fmt: skip
CONTENT = [
    pytest.param(r.ResponseError("Type mismatch: expected Integer but was String"), id="type-mismatch"),
    pytest.param(
        r.ResponseError("Property values can only be of primitive types or arrays of primitive types"),
        id="map-property",
    ),
    pytest.param(r.ResponseError("Cannot merge node using null property value"), id="null-merge"),
    pytest.param(r.ResponseError("unique constraint violation on node of type Window"), id="constraint"),
    pytest.param(r.ResponseError("errMsg: Invalid input at end of input: expected ` line: 1, column: 13, offset: 12 "
                                 "errCtx: CYPHER `rows errCtxOffset: 12"), id="parameter-parse-error"),
    pytest.param(ValueError("Cypher map key cannot be empty"), id="client-encoding"),
]  # fmt: skip


@pytest.mark.parametrize(("error", "handling"), TRANSIENT)
def test_server_conditions_are_transient(error: BaseException, handling: Handling) -> None:
    """Overload, loading, failover, memory, persistence, replicas, credentials and connection errors are transient."""
    assert classify(error) is handling


@pytest.mark.parametrize("error", UNKNOWN)
def test_errors_no_rule_names_are_unknown(error: BaseException) -> None:
    """An unknown command or function, a parse error in the statement (not in its parameters) or an unforeseen server
    condition is not about any row's content."""
    assert classify(error) is Handling.UNKNOWN


@pytest.mark.parametrize("error", CONTENT)
def test_content_errors_name_a_value(error: BaseException) -> None:
    """Only what FalkorDB says of a value it was given (or the client cannot encode) is about content."""
    assert classify(error) is Handling.CONTENT


@pytest.mark.parametrize(
    ("error", "handling"),
    [p for p in TRANSIENT if "SHRINK" not in str(p.values[1])] + [(*p.values, Handling.UNKNOWN) for p in UNKNOWN],
)
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


@pytest.mark.parametrize("error", [r.ResponseError(MISCONF), r.ResponseError("Something FalkorDB 9 says")])
async def test_a_persistent_unknown_or_persistence_error_never_drops_a_row(error: BaseException) -> None:
    """The server refuses every statement 300 times (about 50 minutes of capped backoff): the writer keeps waiting,
    counts each retry, rejects nothing, and writes every row once the server takes them again."""
    graph = FakeGraph(lambda rows, n: error if n <= 300 else None)
    rec = Recorder()
    w = writer(graph, rec)
    written = await w.write_rows("windows", STATEMENT, ROWS)
    assert rec.rejected == [] and written == 64 and graph.written == ROWS
    assert len(rec.retries) == 300
    if classify(error) is Handling.UNKNOWN:
        assert w.telemetry.events["unknown_errors"] == 300  # visible apart, for an alert


async def test_a_statement_too_big_for_the_server_is_written_in_halves() -> None:
    """A query timeout on more than 8 rows: the batch is split until the pieces pass; nothing is rejected."""
    graph = FakeGraph(lambda rows, n: r.ResponseError("Query timed out") if len(rows) > 8 else None)
    rec = Recorder()
    assert await writer(graph, rec).write_rows("windows", STATEMENT, ROWS) == 64
    assert sorted(graph.written, key=lambda x: x["start"]) == ROWS and rec.rejected == []
    assert len(rec.retries) == 7  # 64 -> 2x32 -> 4x16 -> 8x8: one retry per refused statement


def _too_big(rows: list[Any], n: int) -> BaseException | None:
    """FalkorDB's query memory bound, for any statement carrying more than 1,000 characters of text."""
    return r.ResponseError("Query's mem consumption exceeded capacity") if len(json.dumps(rows)) > 1_000 else None


async def test_one_row_too_big_alone_is_trimmed_and_the_rows_behind_it_are_written() -> None:
    """A row whose 5,000-character value alone exceeds the query memory bound: its text is cut (and marked) until
    the server takes it, counted; the 63 rows behind it are written; nothing is rejected."""
    rows = [{"id": "w0", "start": "x" * 5_000}, *ROWS[1:]]
    graph, rec = FakeGraph(_too_big), Recorder()
    w = writer(graph, rec)
    assert await w.write_rows("windows", STATEMENT, rows) == 64
    assert rec.rejected == [] and {row["id"] for row in graph.written} == {row["id"] for row in rows}
    [big] = [row for row in graph.written if row["id"] == "w0"]
    assert big["start"].startswith("x" * 256) and big["start"].endswith("trimmed to 625 of 5000 characters]")
    assert w.telemetry.events["rows_trimmed"] == 1


async def test_a_trace_too_big_alone_is_written_in_parts() -> None:
    """A trace row whose kept spans together exceed the bound but each fits: it is written in parts (each with the
    trace's own fields), counted; every span is written once and none is trimmed."""
    spans = [[f"{i:016x}", None, "svc", "1", "op", "server", 1.0, 2.0, "ok", "", 0, "", "", "", 0, "s" * 200]
             for i in range(12)]  # fmt: skip
    trace = {"id": "t" * 32, "root": "GET /", "service": "svc", "start": 1.0, "end": 2.0, "status": "ok",
             "version": "1", "rooted": True, "omitted": None, "spans": spans}  # fmt: skip
    graph, rec = FakeGraph(_too_big, columns=()), Recorder()
    w = writer(graph, rec)
    assert await w.write_rows("traces", schema.UPSERTS["traces"], [list(trace.values())]) == 1
    assert rec.rejected == [] and w.telemetry.events["rows_split"] >= 3 and "rows_trimmed" not in w.telemetry.events
    assert all(row[:9] == list(trace.values())[:9] for row in graph.written)
    assert sorted(span for row in graph.written for span in row[9]) == spans


async def test_a_content_error_isolates_exactly_the_bad_rows_into_the_dead_letters() -> None:
    """Two rows the graph refuses among 64: they are found by halving, counted, and handed over as dead rows with
    their content and the reason; 62 are written."""
    bad = {"w7", "w40"}

    def fault(rows: list[Any], n: int) -> BaseException | None:
        if any(row["id"] in bad for row in rows):
            return r.ResponseError("Type mismatch: expected Integer but was Map")
        return None

    graph, rec, dead = FakeGraph(fault), Recorder(), []
    assert await writer(graph, rec).write_rows("windows", STATEMENT, ROWS, dead) == 62
    assert rec.rejected == [("windows", 1), ("windows", 1)] and rec.retries == [] and rec.sleeps == []
    assert {row["id"] for row in graph.written} == {row["id"] for row in ROWS} - bad
    assert sorted(d.row["id"] for d in dead) == sorted(bad)
    for d in dead:
        assert json.loads(d.value) == {"op": "windows", "row": d.row}
        assert dict(d.headers)["reason"] == b"graph_row_refused" and b"Type mismatch" in dict(d.headers)["error"]


async def test_stopping_ends_a_transient_wait_with_write_aborted() -> None:
    """While the daemon stops, a transient error aborts the write instead of waiting (the input is replayed)."""
    stopping = asyncio.Event()
    stopping.set()
    graph = FakeGraph(lambda rows, n: r.ResponseError("Max pending queries exceeded"))
    with pytest.raises(WriteAborted):
        await writer(graph, Recorder(), stopping=stopping).write_rows("windows", STATEMENT, ROWS)
    assert graph.written == []


async def test_a_query_refused_for_good_raises_falkordbs_own_error() -> None:
    """``query`` retries transient and unknown errors, and raises a content error as the ResponseError FalkorDB
    sent."""
    errors = [r.ReadOnlyError("READONLY"), r.ResponseError("unknown command 'X'"),
              r.ResponseError("Type mismatch: expected Node but was Relationship")]  # fmt: skip
    graph = FakeGraph(lambda rows, n: errors[n - 1] if n <= 3 else None)
    rec = Recorder()
    with pytest.raises(r.ResponseError, match="Type mismatch"):
        await writer(graph, rec).query("MATCH (n) RETURN n")
    assert rec.retries == ["query", "query"]


async def test_a_write_failing_for_long_makes_the_writer_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a statement keeps failing (here: MISCONF) past the health bound, the health check fails and the
    ``write_stalled`` gauge is 1; both clear once it is written."""
    clock = [1_000.0]
    monkeypatch.setattr("sinks.graph.writer.time.monotonic", lambda: clock[0])
    seen: list[tuple[bool, float]] = []
    rec = Recorder()
    graph = FakeGraph(lambda rows, n: r.ResponseError(MISCONF) if n <= 5 else None)
    w = writer(graph, rec)
    w.ready = True

    async def sleep(seconds: float) -> None:
        seen.append((w.healthy(), w.telemetry.state["write_stalled"]))
        clock[0] += 5

    w._sleep = sleep
    assert await w.write_rows("windows", STATEMENT, ROWS) == 64
    assert seen[0] == (True, 1) and seen[-1] == (False, 1)
    assert w.healthy() and w.telemetry.state["write_stalled"] == 0
