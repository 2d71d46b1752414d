"""Capture the golden incidents: one round of each buggy shop scenario through the real pipeline.

Run ``python -m tests.repro.capture_incidents`` (starts its own engines, ~1 min); writes one IncidentEvent per
anomaly to ``tests/repro/golden/incidents/<anomaly>.json``. The repro tests load these files; they never rerun this.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from streamer.engines import Layout, LocalEngines
from streamer.schemas import IncidentEvent
from tests.runtime.test_collisions_live import _incidents, _shop_harness, _traffic

OUT = Path(__file__).with_name("golden") / "incidents"
WANT = ("lost_update", "invariant_violation", "duplicate_apply")


async def capture(engines: LocalEngines) -> dict[str, IncidentEvent]:
    """One incident per anomaly, as the daemon published it."""
    harness = await _shop_harness(engines, engines.address("kafka"), engines.address("falkordb"))
    try:
        await harness.start()
        await _traffic(harness, engines, clean=False)
        await harness.wait_for(lambda: len(_incidents(harness)) == len(WANT), "three incidents", timeout_s=120)
        messages = await harness.consume_all(harness.settings.kafka.incidents_topic, expect=3 * 3)
    finally:
        await harness.stop()
    found: dict[str, IncidentEvent] = {}
    for m in messages:
        event = IncidentEvent.model_validate_json(m.value)
        if event.manifest:
            found.setdefault(event.anomaly, event)
    return found


def main() -> None:
    default = Layout.default()
    run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-capture-"))
    engines = LocalEngines(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir))
    engines.up()
    try:
        found = asyncio.run(capture(engines))
    finally:
        engines.down()
    OUT.mkdir(parents=True, exist_ok=True)
    for anomaly in WANT:
        event = found[anomaly]
        (OUT / f"{anomaly}.json").write_text(json.dumps(event.model_dump(mode="json"), indent=2) + "\n")
        print(f"{anomaly}: {event.summary}")


if __name__ == "__main__":
    main()
