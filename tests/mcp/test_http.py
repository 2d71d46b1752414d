"""``trace-repro mcp --transport http``: every request needs the bearer token; ``/metrics`` has the analytics."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from streamer.engines.process import free_port
from streamer.mcp.metrics import FAMILIES
from tests.mcp.known_graph import KnownGraph

pytestmark = pytest.mark.engines
TOKEN = "s3cret-token"


@pytest.fixture
def http_server(known_graph: KnownGraph) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamer.cli", "mcp", "--transport", "http", "--port", str(port)],
                            env=known_graph.env(TRACE_REPRO_MCP_TOKEN=TOKEN), stderr=subprocess.PIPE)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/metrics", timeout=5)
            except urllib.error.HTTPError:
                break  # it answers (401 without the token)
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _get(url: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_requests_without_the_token_are_refused_and_metrics_carry_the_analytics(http_server: str) -> None:
    """No token or a wrong one: 401 on /mcp and /metrics. With it, /metrics has the critical-path shares, fan-out,
    blast radius and single point of failure of the known topology's latest window."""
    for path in ("/mcp", "/metrics"):
        assert _get(http_server + path, None)[0] == 401
        assert _get(http_server + path, "wrong")[0] == 401
    status, text = _get(http_server + "/metrics", TOKEN)
    assert status == 200
    lines = set(text.splitlines())
    assert (
        'trace_repro_critical_path_share{operation="checkout:POST /checkout",version="2.0",owner="postgresql"} 0.8'
        in lines
    )
    assert 'trace_repro_service_fan_out{service="frontend"} 2' in lines
    assert 'trace_repro_blast_radius_dependents{service="postgresql"} 5' in lines
    assert 'trace_repro_single_point_of_failure{entry="gateway",service="frontend"} 1' in lines
    for line in (line for line in lines if line and not line.startswith("#")):  # every series in FAMILIES' shape
        name, _, rest = line.partition("{")
        assert name in FAMILIES, line
        assert tuple(re.findall(r'(\w+)="', rest.rpartition("}")[0])) == FAMILIES[name], line
