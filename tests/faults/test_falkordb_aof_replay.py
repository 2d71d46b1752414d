"""A write FalkorDB refuses half-way leaves an append-only file the server can replay.

FalkorDB before 4.20.4 replicates a write that runs longer than ``EFFECTS_THRESHOLD`` as its effects, and a write
refused for one row's content after it changed others leaves effects that crash the server when it replays the AOF
(SIGSEGV in ``AttributeSet_Update``, FalkorDB#2235): every restart crashes again. The local engines start FalkorDB
with a threshold no write reaches (``streamer.engines.falkordb.MODULE_ARGS``), so writes are replicated as queries.
Here a batch long enough to pass the default threshold is refused for its last row, the writer isolates and
dead-letters that row, the same rows are written again (as a replay of the input does), and FalkorDB, stopped and
started again from its AOF, comes back with every row but the refused one.
"""

from __future__ import annotations

import pytest
from falkordb import FalkorDB

from processors.model.graph import GraphBatch
from sinks.graph.rows import DeadRow
from sinks.graph.writer import GraphWriter
from streamer.engines import LocalEngines

pytestmark = pytest.mark.engines

ROWS = 3000  # Window rows ahead of the refused one: the statement runs well past FalkorDB's default 300 µs


async def test_a_write_refused_half_way_leaves_an_aof_falkordb_replays(healthy: LocalEngines) -> None:
    url = healthy.address("falkordb")
    port = int(url.rsplit(":", 1)[1])
    config = dict(FalkorDB(port=port).connection.execute_command("GRAPH.CONFIG", "GET", "*"))  # values in µs, ms
    # Whether a write goes to the AOF as effects depends on how long it ran (load, machine): no write may qualify.
    assert int(config["EFFECTS_THRESHOLD"]) >= 1000 * int(config["TIMEOUT_MAX"])
    graph = "aof_replay"
    rows = [{"id": f"w{i:05d}", "start": float(i), "end": float(i + 1)} for i in range(ROWS)]
    refused = {"id": "refused", "start": {"nested": True}, "end": 0.0}  # a map: FalkorDB takes no map property
    writer = GraphWriter(url, graph, batch_rows=ROWS + 1)
    dead: list[DeadRow] = []
    try:
        await writer.bootstrap()
        written = await writer.write(GraphBatch(windows=[*rows, refused]), dead)
        assert written == ROWS
        assert [d.row for d in dead] == [refused]
        assert await writer.write(GraphBatch(windows=rows)) == ROWS  # a replay of the same input updates them
    finally:
        await writer.close()
    healthy.restart("falkordb")  # a graceful stop rewrites nothing: the restart replays the AOF (stop, start)
    db = FalkorDB(port=port)
    try:
        [[count]] = db.select_graph(graph).ro_query("MATCH (w:Window) RETURN count(w)").result_set
        assert count == ROWS
    finally:
        db.select_graph(graph).delete()
