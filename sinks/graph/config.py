"""``[falkordb]``: where the graph lives and how it is written."""

from __future__ import annotations

from pydantic import Field

from processors.component import Section


class FalkorDBConfig(Section):
    """The FalkorDB server and the graph of this environment."""

    url: str = Field("redis://127.0.0.1:6379", description="FalkorDB (Redis protocol) URL")
    graph: str = Field("", description='graph name; default "trace_repro_<environment>" (one graph per environment)')
    batch_rows: int = Field(2000, ge=1, description="rows per UNWIND statement")
    query_timeout_ms: int = Field(30_000, ge=100, description="per-query timeout (the server needs TIMEOUT_MAX)")
