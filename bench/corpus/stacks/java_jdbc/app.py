"""The corpus's lost update, write skew and phantom as a Java service: JDBC on the PostgreSQL driver, traced by the
OpenTelemetry Java agent on its defaults (``corpus/CorpusService.java``; built by :mod:`.build`).

The service runs in a JVM of its own (the JDK the engines run on) with ``-javaagent:``: the agent's JDK HTTP server
instrumentation makes a SERVER span per request (``http.route`` the handler's context path) and its JDBC
instrumentation a CLIENT span per statement, as the agent's sanitiser leaves it (``?`` for every value), with no
parameters, no ``code.*`` and no span for ``commit()``. The agent is pointed at the Collector and nothing else is
set: the OTLP endpoint and protocol, the service name, a short batch delay (as the Python stacks' exporters), and
no metrics or logs exporters (the corpus's Collector has a traces pipeline only, as the Python stacks export only
spans). Each request runs on a connection of its own with autocommit off (READ COMMITTED, the database's default).

A request is an HTTP POST from the calling thread (the duel's contender); its race points reach the thread's hook
through :mod:`.races`. :func:`start` waits for the service to listen; ``shutdown`` stops the JVM with SIGTERM, on
which the agent exports what it still holds.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, unquote, urlsplit

from bench.corpus.apps.lost_update import LostUpdate
from bench.corpus.apps.phantom import Phantom
from bench.corpus.apps.write_skew import WriteSkew
from bench.corpus.scenario import BUG, RoundPlan, Scenario
from bench.corpus.stacks.java_jdbc.build import MAIN, build
from bench.corpus.stacks.java_jdbc.races import RaceServer
from bench.corpus.stacks.web import TRACE_HEADER, Reply, View, all_plans
from streamer.engines import Layout
from streamer.engines.process import EngineError

STACK = "java_jdbc"
OFFSET = 400  # this stack's rounds are numbered from 401
START_TIMEOUT_S = 120.0  # the JVM and the agent's instrumentation on a loaded 2-core machine
STOP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 60.0


class JavaMethod:
    """A handler of the Java service as a view's function: named as a Java stack trace (and the code locator) names
    it, ``corpus.CorpusService.deposit``; ``calls``: the methods of its class it calls. It runs in the JVM only."""

    def __init__(self, method: str, calls: tuple[str, ...] = ()) -> None:
        self.__module__ = MAIN
        self.__qualname__ = self.__name__ = method
        self.calls = calls

    @property
    def issuers(self) -> set[str]:
        """The names of the methods that may issue its statements: itself and the methods it calls."""
        return {f"{MAIN}.{m}" for m in (self.__qualname__, *self.calls)}

    def __call__(self, *args: Any) -> Any:
        raise TypeError(f"{MAIN}.{self.__qualname__} runs in the Java service: send it a request")


def _view(context: str, key: str, method: str, *calls: str) -> View:
    return View(f"{context}{{{key}}}", JavaMethod(method, (*calls, "race", "quote")))


VIEWS: dict[str, dict[str, View]] = {
    LostUpdate.name: {BUG: _view("/deposits/", "account_no", "deposit", "balance"),
                      "control:for_update": _view("/locked-deposits/", "account_no", "depositLocked", "balance"),
                      "control:atomic_update": _view("/atomic-deposits/", "account_no", "depositAtomic", "balance")},
    WriteSkew.name: {BUG: _view("/off-call/", "name", "goOffCall", "offCall"),
                     "control:for_update": _view("/locked-off-call/", "name", "goOffCallLocked"),
                     "control:serializable_retry": _view("/serializable-off-call/", "name", "goOffCallSerializable",
                                                         "offCall")},
    Phantom.name: {BUG: _view("/bookings/", "room", "book"),
                   "control:unique_on_conflict": _view("/safe-bookings/", "room", "bookSafe")},
}  # fmt: skip
METHODS: dict[str, JavaMethod] = {v.name: v.function for kinds in VIEWS.values() for v in kinds.values()
                                  if isinstance(v.function, JavaMethod)}  # fmt: skip


def plans() -> list[tuple[Scenario, list[RoundPlan]]]:
    """One round of every kind of every scenario, numbered from this stack's offset."""
    return all_plans(VIEWS, OFFSET)


def jdbc_url(dsn: str, schema: str) -> str:
    """``postgresql://user[:password]@host:port/db`` as the PostgreSQL JDBC driver's URL, tables found in ``schema``."""
    parts = urlsplit(dsn)
    query = [f"user={quote(unquote(parts.username or ''))}", f"currentSchema={quote(schema)}"]
    if parts.password:
        query.append(f"password={quote(unquote(parts.password))}")
    return f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path or '/'}?{'&'.join(query)}"


@dataclass
class Running:
    """The Java service in its JVM, its race server, and where its output goes."""

    process: subprocess.Popen[bytes]
    base_url: str
    races: RaceServer
    log: Path
    timings: dict[str, float] = field(default_factory=dict)

    def send(self, path: str, body: dict[str, Any]) -> Reply:
        with self.races.request() as race_id:
            request = urllib.request.Request(
                self.base_url + path,
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "X-Race-Id": race_id},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                    status, headers, raw = response.status, response.headers, response.read()
            except urllib.error.HTTPError as refused:
                status, headers, raw = refused.code, refused.headers, refused.read()
        try:
            data = json.loads(raw)
        except ValueError:
            data = {"error": raw.decode("utf-8", "replace")[:500]}
        return Reply(status, headers.get(TRACE_HEADER, ""), data)

    def shutdown(self) -> None:
        """SIGTERM: the JVM's shutdown hooks stop the server and the agent exports what is still queued; the JVM's
        output is removed once it stopped."""
        try:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise EngineError(f"the Java service did not stop in {STOP_TIMEOUT_S:g} s; see {self.log}") from None
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.races.close()
        self.log.unlink(missing_ok=True)  # kept when the service failed to stop (the error names it)


def _listening(stdout: IO[bytes], process: subprocess.Popen[bytes], log: Path) -> int:
    """The port the service printed it listens on (``listening on <port>``), waiting for it up to the deadline."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while (left := deadline - time.monotonic()) > 0:
        if process.poll() is not None:
            break
        ready, _, _ = select.select([stdout], [], [], min(left, 1.0))
        if ready:
            line = stdout.readline().decode("utf-8", "replace").strip()
            if line.startswith("listening on "):
                return int(line.rpartition(" ")[2])
    process.kill()
    process.wait()
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise EngineError(f"the Java service did not start in {START_TIMEOUT_S:g} s (exit {process.returncode}):\n{tail}")


def start(dsn: str, schema: str, otlp_endpoint: str) -> Running:
    """The service on ``dsn`` (tables found in ``schema``), traced by the OpenTelemetry Java agent on its defaults,
    exporting OTLP/HTTP to ``otlp_endpoint``."""
    began = time.monotonic()
    built = build(Layout.default().cache_dir)
    compiled = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # the agent's defaults, not ours
    env.update({
        "OTEL_SERVICE_NAME": f"corpus-{STACK}",
        "OTEL_RESOURCE_ATTRIBUTES": "service.version=1.0.0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint.rstrip("/"),
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    })  # fmt: skip
    races = RaceServer.open()
    fd, name = tempfile.mkstemp(prefix=f"corpus-{STACK}-", suffix=".log")
    log = Path(name)
    cmd = [str(built.java.executable), f"-javaagent:{built.agent}", f"-Dcorpus.race.port={races.port}",
           "-cp", os.pathsep.join(map(str, built.classpath)), MAIN, jdbc_url(dsn, schema)]  # fmt: skip
    try:
        with os.fdopen(fd, "wb") as err:
            process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
        assert process.stdout is not None
        port = _listening(process.stdout, process, log)
    except BaseException:
        races.close()
        raise
    timings = {"build_s": compiled - began, "jvm_s": time.monotonic() - compiled}
    return Running(process, f"http://127.0.0.1:{port}", races, log, timings)
