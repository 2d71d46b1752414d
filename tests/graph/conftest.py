"""A graph sink on a fresh graph of the real FalkorDB, deleted after the test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from falkordb import FalkorDB

from sinks.graph.sink import GraphSink
from sinks.graph.writer import GraphWriter


@pytest.fixture
async def sink(falkordb_url: str) -> AsyncIterator[GraphSink]:
    name = f"paths_{uuid.uuid4().hex[:8]}"
    s = GraphSink(GraphWriter(falkordb_url, name), clock_ms=lambda: 1.0)
    await s.start()
    try:
        yield s
    finally:
        await s.close()
        host, port = falkordb_url.removeprefix("redis://").rsplit(":", 1)
        FalkorDB(host=host, port=int(port)).select_graph(name).delete()
