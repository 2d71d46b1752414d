"""The Java service's race points, without a JVM: a line on the race server's socket (what ``CorpusService.race``
writes) runs the hook of the thread that sent the request, and is answered only once that hook returned; and the
service's JDBC URL from the corpus's DSN."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from bench.corpus.race import Point, racing
from bench.corpus.stacks.java_jdbc.app import METHODS, jdbc_url
from bench.corpus.stacks.java_jdbc.races import RaceServer


@pytest.fixture
def server() -> Iterator[RaceServer]:
    races = RaceServer.open()
    yield races
    races.close()


def _point(port: int, race_id: str, point: str) -> str:
    """What the Java service does at a race point: one line, then wait for the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(f"{race_id} {point}\n".encode())
        return conn.makefile().readline()


def test_a_point_runs_the_senders_hook(server: RaceServer) -> None:
    """Each point reaches the hook installed in the sending thread, in order; a thread without a hook gets ``ok``."""
    seen: list[Point] = []
    with racing(seen.append), server.request() as race_id:
        answers = [_point(server.port, race_id, p) for p in ("race", "written", "committed")]
    assert answers == ["ok\n"] * 3
    assert seen == ["race", "written", "committed"]
    with server.request() as race_id:
        assert _point(server.port, race_id, "race") == "ok\n"


def test_the_answer_waits_for_the_hook(server: RaceServer) -> None:
    """The Java handler stays blocked while the duel's hook holds it (the follower waiting for the leader)."""
    release = threading.Event()
    answered: list[str] = []

    def hold(_: Point) -> None:
        release.wait(10)

    with racing(hold), server.request() as race_id:
        caller = threading.Thread(target=lambda: answered.append(_point(server.port, race_id, "race")))
        caller.start()
        caller.join(0.3)
        assert caller.is_alive() and not answered  # still held
        release.set()
        caller.join(10)
    assert answered == ["ok\n"]


def test_unknown_requests_and_points_are_refused(server: RaceServer) -> None:
    with server.request() as race_id:
        assert _point(server.port, race_id, "elsewhere") == "unknown\n"
    assert _point(server.port, race_id, "race") == "unknown\n"  # the request is over


def test_jdbc_url_and_view_names() -> None:
    """The DSN's user, password, host, port and database, the schema as ``currentSchema``; views named as a Java
    stack trace names the method."""
    assert jdbc_url("postgresql://postgres@127.0.0.1:5433/postgres", "stacks_1") == (
        "jdbc:postgresql://127.0.0.1:5433/postgres?user=postgres&currentSchema=stacks_1"
    )
    assert jdbc_url("postgresql://app:p%40ss@db/shop", "public") == (
        "jdbc:postgresql://db:5432/shop?user=app&currentSchema=public&password=p%40ss"
    )
    assert METHODS["corpus.CorpusService.goOffCall"].issuers >= {
        "corpus.CorpusService.goOffCall",
        "corpus.CorpusService.offCall",
    }
