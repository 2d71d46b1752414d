"""The graph sink: FalkorDB, its schema (all Cypher), the stages' rows and the published events."""

from sinks.graph.config import FalkorDBConfig
from sinks.graph.endpoint import Endpoint
from sinks.graph.rows import DeadRow
from sinks.graph.sink import GraphSink
from sinks.graph.writer import GraphWriter, WriteAborted

__all__ = ["DeadRow", "Endpoint", "FalkorDBConfig", "GraphSink", "GraphWriter", "WriteAborted"]
