"""What the MCP server reads and what it may do: the daemon's config file and environment, plus ``TRACE_REPRO_MCP_*``.

The graph (FalkorDB URL, the environment's graph name), the Kafka bootstrap and the repro settings come from the
daemon's own configuration (:func:`streamer.config.load`). The server's own switches are command-line flags or
environment variables (the daemon's settings model has no ``[mcp]`` section):

====================================  =================================================================  =======
variable                              meaning                                                            default
====================================  =================================================================  =======
``TRACE_REPRO_MCP_TOKEN``             bearer token every HTTP request must carry (HTTP refused without)  none
``TRACE_REPRO_MCP_RUN_REPRO``         ``1``: ``run_repro`` may run a stored repro test                   off
``TRACE_REPRO_MCP_CONTRACTS``         ``1``: ``add_contract`` may publish proof contracts                off
``TRACE_REPRO_MCP_TIMEOUT_MS``        server-side timeout of every graph query                           10000
``TRACE_REPRO_MCP_MAX_ROWS``          the most rows ``query_graph`` returns                              500
``TRACE_REPRO_MCP_MAX_RESULT_BYTES``  the largest ``query_graph`` reply read from the server (bytes)     1048576
====================================  =================================================================  =======
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from processors.connectors.repro.config import ReproConfig
from sinks.graph.endpoint import Endpoint
from sinks.kafka.config import KafkaConfig
from streamer import config

_ON = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class McpSettings:
    """Everything the tools need, resolved once at start."""

    falkordb_url: str | Endpoint  # the daemon's [falkordb] endpoint (user, password, TLS), or a bare URL
    graph: str
    kafka_bootstrap: str | KafkaConfig  # the daemon's [kafka] section (TLS, SASL), or bare bootstrap servers
    contracts_topic: str = "trace-repro.contracts"
    repro_dir: str = "out/repros"
    repro_dsn: str = ""
    repro_timeout_ms: int = 5_000
    allow_run_repro: bool = False
    allow_contracts: bool = False
    timeout_ms: int = 10_000
    max_rows: int = 500
    max_result_bytes: int = 1 << 20
    token: str | None = None


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise config.ConfigError(f"{name}: expected an integer, got {raw!r}") from exc
    if not lo <= value <= hi:
        raise config.ConfigError(f"{name}: expected {lo}..{hi}, got {value}")
    return value


def resolve(path: Path | None, *, run_repro: bool = False, contracts: bool = False,
            env: Mapping[str, str] | None = None) -> McpSettings:  # fmt: skip
    """The settings from the daemon's config file and environment (:class:`streamer.config.ConfigError` if bad)."""
    env = dict(os.environ if env is None else env)
    daemon = config.load(path, env)
    repro = daemon.section("repro", ReproConfig)
    token = env.get("TRACE_REPRO_MCP_TOKEN") or None
    return McpSettings(
        falkordb_url=daemon.falkordb.endpoint(),
        graph=daemon.graph_name,
        kafka_bootstrap=daemon.kafka,
        contracts_topic=daemon.kafka.contracts_topic,
        repro_dir=repro.output_dir,
        repro_dsn=repro.dsn or daemon.postgres_dsn,
        repro_timeout_ms=repro.statement_timeout_ms,
        allow_run_repro=run_repro or env.get("TRACE_REPRO_MCP_RUN_REPRO", "").lower() in _ON,
        allow_contracts=contracts or env.get("TRACE_REPRO_MCP_CONTRACTS", "").lower() in _ON,
        timeout_ms=_int(env, "TRACE_REPRO_MCP_TIMEOUT_MS", 10_000, 100, 600_000),
        max_rows=_int(env, "TRACE_REPRO_MCP_MAX_ROWS", 500, 1, 100_000),
        max_result_bytes=_int(env, "TRACE_REPRO_MCP_MAX_RESULT_BYTES", 1 << 20, 1024, 1 << 30),
        token=token,
    )
