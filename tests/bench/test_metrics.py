"""The bench's one /metrics reader: the endpoint's text, or None when nothing answers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from bench.metrics import fetch_metrics

TEXT = 'trace_repro_consumed_messages_total{topic="bench-spans"} 42.0\n'


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = TEXT.encode() if self.path == "/metrics" else b""
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = HTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_text_of_the_endpoint(server: int) -> None:
    assert fetch_metrics(server) == TEXT


def test_none_when_nothing_answers() -> None:
    with socket.socket() as s:  # a port just freed: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert fetch_metrics(port, timeout_s=2) is None
