"""/readyz follows every sink's health: 503 naming the sink while one fails, 200 again once it recovers."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from tests.harness import Harness, harness_settings

pytestmark = pytest.mark.engines


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = (await reader.read()).decode()
    writer.close()
    head, _, body = raw.partition("\r\n\r\n")
    return int(head.split(" ", 2)[1]), body


async def test_readyz_turns_503_while_a_sink_fails_and_back_to_200(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """The file sink's directory disappears: the next health check fails it and /readyz says so; restored, ready."""
    directory = tmp_path / "events"
    settings = harness_settings(kafka_bootstrap, falkordb_url, FILE_SINK__ENABLED="true",
                                FILE_SINK__DIRECTORY=str(directory))  # fmt: skip
    h = Harness(settings, kafka_bootstrap, falkordb_url)
    try:
        await h.start()
        assert h.daemon is not None
        port = h.daemon.http.port
        assert await _get(port, "/readyz") == (200, "ready\n")
        shutil.rmtree(directory)
        health = await h.daemon.check_health()
        assert health == {"graph": True, "kafka": True, "files": False}
        assert await _get(port, "/readyz") == (503, "unhealthy sinks: files\n")
        assert await _get(port, "/healthz") == (200, "ok\n")  # alive, just not ready
        metrics = (await _get(port, "/metrics"))[1]
        assert 'trace_repro_sink_healthy{sink="files"} 0.0' in metrics
        directory.mkdir()
        await h.daemon.check_health()
        assert await _get(port, "/readyz") == (200, "ready\n")
    finally:
        await h.stop()
