"""The corpus's race points across the process boundary: a small local server the Java service calls at each one.

``bench.corpus.race`` installs a duel's hook per contender thread (a ``ContextVar``); the Java handler runs in
another process. So each request is sent with an ``X-Race-Id`` header naming the sending thread's context
(:meth:`RaceServer.request` registers a copy of it), and the Java ``race(request, point)`` writes ``<id> <point>``
as one line to this server over a plain socket (no HTTP client: the agent would trace it) and waits for ``ok``: the
server runs ``race_point(point)`` in that context, so the hook blocks the Java handler exactly as it blocks an
in-process view. Without a hook ``race_point`` returns at once and the line is answered at once.
"""

from __future__ import annotations

import contextvars
import socketserver
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast, get_args

from bench.corpus.race import Point, race_point

POINTS = frozenset(get_args(Point))


class _Handler(socketserver.StreamRequestHandler):
    server: RaceServer

    def handle(self) -> None:
        race_id, _, point = self.rfile.readline(256).decode("ascii", "replace").strip().partition(" ")
        context = self.server.contexts.get(race_id)
        if context is None or point not in POINTS:
            self.wfile.write(b"unknown\n")
            return
        context.run(race_point, cast(Point, point))
        self.wfile.write(b"ok\n")


class RaceServer(socketserver.ThreadingTCPServer):
    """See the module docstring; :meth:`open` starts one on a free loopback port."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.contexts: dict[str, contextvars.Context] = {}
        self._thread = threading.Thread(target=self.serve_forever, name="corpus-java-races", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @classmethod
    def open(cls) -> RaceServer:
        server = cls()
        server._thread.start()
        return server

    @contextmanager
    def request(self) -> Iterator[str]:
        """A race id for one request sent from this thread (its race points run in this thread's context)."""
        race_id = uuid.uuid4().hex
        self.contexts[race_id] = contextvars.copy_context()
        try:
            yield race_id
        finally:
            del self.contexts[race_id]

    def close(self) -> None:
        self.shutdown()
        self.server_close()
