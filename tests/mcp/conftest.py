"""The known graph of the MCP tests (see :mod:`tests.mcp.known_graph`), written once per session."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from falkordb import FalkorDB

from sinks.graph.sink import GraphSink
from sinks.graph.writer import GraphWriter
from tests.mcp.known_graph import KnownGraph, write_known_graph


@pytest.fixture(scope="session")
async def known_graph(falkordb_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KnownGraph]:
    """The known graph, in a graph of its own (deleted afterwards)."""
    name = f"mcp_{uuid.uuid4().hex[:8]}"
    repro_dir = tmp_path_factory.mktemp("repros")
    sink = GraphSink(GraphWriter(falkordb_url, name), clock_ms=lambda: 1.0)
    await sink.start()
    try:
        test_path = await write_known_graph(sink, repro_dir)
        yield KnownGraph(falkordb_url, name, repro_dir, test_path)
    finally:
        await sink.close()
        host, port = falkordb_url.removeprefix("redis://").rsplit(":", 1)
        FalkorDB(host=host, port=int(port)).select_graph(name).delete()
