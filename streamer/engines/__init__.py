"""Real local engines (Kafka, FalkorDB, PostgreSQL, Kafka Connect + Debezium), started by the project itself."""

from streamer.engines.layout import Layout
from streamer.engines.local import ALL, KNOWN, EngineStatus, LocalEngines
from streamer.engines.process import EngineError

__all__ = ["ALL", "KNOWN", "EngineError", "EngineStatus", "Layout", "LocalEngines"]
