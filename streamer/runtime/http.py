"""``/metrics``, ``/healthz`` and ``/readyz`` on a tiny asyncio HTTP server (no framework needed for three GETs).

``/readyz`` answers 200 only while the daemon has started and every sink's last health check passed (the daemon
checks them in the background, so a probe never waits on GitLab); the body names the sinks that failed.
``/healthz`` answers 200 while the process is alive and well: 503 once a stage or a sink runner has failed (the
daemon then stops, and exits non-zero), the body saying what failed.

The worker supervisor (:mod:`streamer.runtime.workers`) serves the same three paths from what its workers answer:
``metrics`` and ``ready`` may then be coroutines (a scrape of every worker) instead of a registry and a function.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Readiness = tuple[bool, str]


def _alive() -> Readiness:
    return True, ""


class HttpServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry | Callable[[], Awaitable[bytes]],
                 ready: Callable[[], Readiness | Awaitable[Readiness]],
                 live: Callable[[], Readiness] = _alive) -> None:  # fmt: skip
        self.host = host
        self.port = port
        self._metrics = registry
        self._ready = ready
        self._live = live
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            path = request.split(b" ", 2)[1].decode("latin-1") if request.count(b" ") >= 2 else "/"
            status, ctype, body = await self._route(path.split("?", 1)[0])
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            if isinstance(self._metrics, CollectorRegistry):
                return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._metrics)
            return "200 OK", CONTENT_TYPE_LATEST, await self._metrics()
        if path == "/healthz":
            alive, why = self._live()
            if alive:
                return "200 OK", "text/plain", b"ok\n"
            return "503 Service Unavailable", "text/plain", (why + "\n").encode()
        if path == "/readyz":
            answer = self._ready()
            ready, why = await answer if inspect.isawaitable(answer) else answer
            if ready:
                return "200 OK", "text/plain", b"ready\n"
            return "503 Service Unavailable", "text/plain", (why + "\n").encode()
        return "404 Not Found", "text/plain", b"not found\n"
