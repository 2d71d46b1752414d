"""How long the daemon's polls wait when nothing comes: every stage runner and sink runner of an in-process daemon on
the real Kafka waits as ``CoreSettings.poll_timeout_ms`` says (a fifth of ``windows.idle_s`` within its bounds, unless
``kafka.poll_timeout_ms`` is set), not a wait of its own. The waits are read from the polls' arguments, not timed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from tests.harness import Harness, harness_settings

pytestmark = pytest.mark.engines

POLLS = 3  # polls of each runner's consumer seen before the waits are read


@pytest.mark.parametrize(
    ("overrides", "wait_ms"),
    [
        ({"WINDOWS__IDLE_S": "5"}, 1000),  # the shipped idleness: a fifth of it
        ({"WINDOWS__IDLE_S": "0.5"}, 200),  # tuned windows: the lower bound
        ({"WINDOWS__IDLE_S": "5", "KAFKA__POLL_TIMEOUT_MS": "300"}, 300),  # set: as set
    ],
)
async def test_every_runner_waits_as_the_settings_derive(
    overrides: dict[str, str], wait_ms: int, kafka_bootstrap: str, falkordb_url: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    waits: dict[str, list[int]] = {}  # consumer group -> the timeout of each of its polls
    getmany = AIOKafkaConsumer.getmany

    async def recorded(self: AIOKafkaConsumer, *partitions: Any, timeout_ms: int = 0, **kw: Any) -> Any:
        waits.setdefault(self._group_id, []).append(timeout_ms)
        return await getmany(self, *partitions, timeout_ms=timeout_ms, **kw)

    monkeypatch.setattr(AIOKafkaConsumer, "getmany", recorded)
    settings = harness_settings(kafka_bootstrap, falkordb_url, FILE_SINK__ENABLED="true",
                                FILE_SINK__DIRECTORY=str(tmp_path), **overrides)  # fmt: skip
    assert settings.poll_timeout_ms == wait_ms
    h = Harness(settings, kafka_bootstrap, falkordb_url)
    try:
        await h.start()
        assert h.daemon is not None
        groups = [r.group_id for r in h.daemon.runners] + [r.group_id for r in h.daemon.sink_runners]
        assert len(h.daemon.runners) == 2 and h.daemon.sink_runners
        deadline = time.monotonic() + 60
        while any(len(waits.get(g, ())) < POLLS for g in groups):
            assert time.monotonic() < deadline, f"polls seen: { {g: len(waits.get(g, ())) for g in groups} }"
            await asyncio.sleep(0.1)
        seen = {g: waits[g][:POLLS] for g in groups}
    finally:
        await h.stop()
    assert seen == {g: [wait_ms] * POLLS for g in groups}
