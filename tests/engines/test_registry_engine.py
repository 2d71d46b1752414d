"""The schema registry engine's release: downloaded once, checked against its pinned SHA-512, unpacked, cached."""

from __future__ import annotations

import hashlib
import io
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from streamer.engines import registry
from streamer.engines.process import EngineError


def _zip(*names: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name in names:
            zf.writestr(name, b"jar")
    return out.getvalue()


ARCHIVE = _zip(registry.RUNNER, "lib/a.jar")


@pytest.fixture
def central() -> Iterator[tuple[str, list[str]]]:
    """A repository serving ARCHIVE at the release's path; the paths asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(ARCHIVE)))
            self.end_headers()
            self.wfile.write(ARCHIVE)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/maven2", asked
    finally:
        server.shutdown()
        server.server_close()


def test_release_checked_unpacked_and_cached(tmp_path: Path, central: tuple[str, list[str]]) -> None:
    url, asked = central
    digest = hashlib.sha512(ARCHIVE).hexdigest()
    home = registry.install(tmp_path, repository=url, sha512=digest)
    assert (home / registry.RUNNER).is_file() and (home / "lib" / "a.jar").is_file()
    assert asked == [registry.archive_url(url).removeprefix(url.rsplit("/", 1)[0])]
    assert registry.install(tmp_path, repository=url, sha512=digest) == home and len(asked) == 1  # cached


def test_release_not_matching_its_digest_refused_and_not_kept(tmp_path: Path, central: tuple[str, list[str]]) -> None:
    with pytest.raises(EngineError, match="does not match its pinned SHA-512"):
        registry.install(tmp_path, repository=central[0], sha512="0" * 128)
    assert not any((tmp_path / "apicurio").iterdir())
