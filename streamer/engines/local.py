"""The four local engines as one unit: ``up``, ``status``, ``down``, and the addresses other processes use.

Used by ``trace-repro local up|down|status``, ``make demo`` and the test fixtures. Kafka starts first (the JVM is
the slowest), FalkorDB and PostgreSQL start while it boots, Kafka Connect last. The schema registry (Apicurio, for
Debezium's Avro form) is a fifth engine started only when named (``trace-repro local up registry``): a JVM and a
large first download that the default set has no use for.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamer.engines import connect, falkordb, jars, kafka, postgres, registry
from streamer.engines import state as state_file
from streamer.engines.layout import Layout
from streamer.engines.process import EngineError, alive, kill, stop
from streamer.engines.state import EngineState

ALL = ("kafka", "falkordb", "postgres", "connect")  # what `local up` starts by default
KNOWN = (*ALL, "registry")  # in start order; the registry on demand
# The variable `local env` writes for each engine's address (names the daemon's settings or the tools read).
ENVIRONMENT = {
    "kafka": "TRACE_REPRO_KAFKA_BOOTSTRAP",
    "falkordb": "TRACE_REPRO_FALKORDB_URL",
    "postgres": "TRACE_REPRO_POSTGRES_DSN",
    "connect": "TRACE_REPRO_CONNECT_URL",
    "registry": "TRACE_REPRO_DECODE__SCHEMA_REGISTRY__URL",  # the daemon's own setting: it reads Avro at once
}
_HEALTH: dict[str, Callable[[EngineState], bool]] = {
    "kafka": kafka.healthy,
    "falkordb": falkordb.healthy,
    "postgres": postgres.healthy,
    "connect": connect.healthy,
    "registry": registry.healthy,
}


@dataclass(frozen=True, slots=True)
class EngineStatus:
    name: str
    pid: int
    running: bool
    healthy: bool
    address: str


class LocalEngines:
    """Starts, probes and stops the local engines recorded in one run directory's state file."""

    __slots__ = ("layout", "timings")

    def __init__(self, layout: Layout | None = None) -> None:
        self.layout = layout or Layout.default()
        self.timings: dict[str, float] = {}

    @property
    def engines(self) -> dict[str, EngineState]:
        return state_file.load(self.layout.state_file)

    def up(self, names: Sequence[str] = ALL) -> dict[str, EngineState]:
        """Start the named engines that are not already running and healthy; returns all their states."""
        unknown = set(names) - set(KNOWN)
        if unknown:
            raise EngineError(f"unknown engine(s) {sorted(unknown)}; choose from {list(KNOWN)}")
        if {"kafka", "connect", "registry"} & set(names):
            jars.require_java()
        wanted = [n for n in KNOWN if n in names or (n == "kafka" and "connect" in names)]
        running = {n: s for n, s in self.engines.items() if alive(s.pid) and (n not in wanted or _HEALTH[n](s))}
        started: list[str] = []
        try:
            for name in wanted:
                if name in running:
                    continue
                begin = time.monotonic()
                running[name] = self._start(name, running)
                started.append(name)
                self.timings[name] = time.monotonic() - begin
                state_file.save(self.layout.state_file, running)
        except BaseException:
            for name in reversed(started):  # a half-started set would leave processes nobody asked for
                stop(running.pop(name).pid)
            state_file.save(self.layout.state_file, running)
            raise
        return running

    def _start(self, name: str, running: dict[str, EngineState]) -> EngineState:
        previous = self.engines.get(name)
        port = previous.port if previous else None  # a restart keeps the address clients already have
        if name == "kafka":
            return kafka.start(
                self.layout,
                port=port,
                controller_port=previous.extra.get("controller_port") if previous else None,
            )
        if name == "falkordb":
            return falkordb.start(self.layout, port=port)
        if name == "postgres":
            return postgres.start(self.layout, port=port)
        if name == "registry":
            return registry.start(self.layout, port=port)
        return connect.start(self.layout, bootstrap=kafka.bootstrap(running["kafka"]), port=port)

    def stop_engine(self, name: str) -> None:
        """Stop one engine but keep its data and address, so that ``up`` restarts it in place."""
        engine = self.engines.get(name)
        if engine is not None:
            stop(engine.pid)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one engine at once (SIGKILL: a crash, waited for); its data and address are kept."""
        engine = self.engines.get(name)
        if engine is None:
            raise EngineError(f"engine {name!r} is not in {self.layout.state_file}")
        kill(engine.pid, sig)

    def restart(self, name: str) -> EngineState:
        """Start one engine again in place (same data, same address) once it is down; stops it first if running."""
        self.stop_engine(name)
        return self.up([name])[name]

    def down(self, *, keep_data: bool = False) -> list[int]:
        """Stop every engine (Connect first, Kafka last); returns the PIDs that were stopped."""
        stopped = []
        engines = self.engines
        for name in reversed(KNOWN):
            engine = engines.get(name)
            if engine is not None:
                stop(engine.pid)
                stopped.append(engine.pid)
        if not keep_data:
            shutil.rmtree(postgres.base_dir(self.layout), ignore_errors=True)
            shutil.rmtree(self.layout.run_dir, ignore_errors=True)
        return stopped

    def status(self) -> list[EngineStatus]:
        out = []
        for name in KNOWN:
            engine = self.engines.get(name)
            if engine is None and name not in ALL:
                continue  # an on-demand engine never started
            if engine is None:
                out.append(EngineStatus(name, 0, False, False, "-"))
                continue
            running = alive(engine.pid)
            out.append(EngineStatus(name, engine.pid, running, running and _HEALTH[name](engine), self.address(name)))
        return out

    def address(self, name: str) -> str:
        engine = self.engines[name]
        match name:
            case "kafka":
                return kafka.bootstrap(engine)
            case "falkordb":
                return falkordb.url(engine)
            case "postgres":
                return postgres.dsn(engine)
            case "registry":
                return registry.url(engine)
            case _:
                return connect.rest_url(engine)

    def environment(self) -> dict[str, str]:
        """``TRACE_REPRO_*`` variables naming the running engines, for other processes."""
        return {ENVIRONMENT[n]: self.address(n) for n in KNOWN if n in self.engines}

    def capture(self, tables: Sequence[str], *, topic_prefix: str = "shop", database: str = "postgres") -> None:
        """Have Debezium capture ``tables`` (``schema.table``) of the local PostgreSQL into Kafka."""
        engines = self.engines
        if "connect" not in engines or "postgres" not in engines:
            raise EngineError("capture needs PostgreSQL and Kafka Connect running: trace-repro local up")
        pg = engines["postgres"]
        connect.capture(engines["connect"], pg_dsn=postgres.dsn(pg, database), pg_port=pg.port, tables=tables,
                        topic_prefix=topic_prefix, database=database)  # fmt: skip
