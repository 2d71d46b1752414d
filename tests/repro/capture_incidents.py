"""Capture the golden incidents: one round of each buggy shop scenario through the real pipeline.

Run ``python -m tests.repro.capture_incidents [anomaly ...]`` (starts its own engines, ~1 min; with
``TRACE_REPRO_TEST_REUSE=1`` it uses a running ``trace-repro local up``); writes one IncidentEvent per anomaly asked
for (default: those without a file yet) to ``tests/repro/golden/incidents/<anomaly>.json``. The repro tests load
these files; they never rerun this. The pipeline now reports the double charge as a ``phantom`` (the predicate
double insert); ``duplicate_apply.json`` was captured when it was reported through ``sql.insert_identity``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

from processors.model.outputs import IncidentEvent
from streamer.engines import Layout, LocalEngines
from tests.runtime.test_collisions_live import _incidents, _shop_harness, _traffic

OUT = Path(__file__).with_name("golden") / "incidents"
FOUND = ("lost_update", "invariant_violation", "phantom")  # what one round of the buggy shop yields


async def capture(engines: LocalEngines) -> dict[str, IncidentEvent]:
    """One incident per anomaly, as the daemon published it."""
    harness = await _shop_harness(engines, engines.address("kafka"), engines.address("falkordb"))
    try:
        await harness.start()
        await _traffic(harness, engines, clean=False)
        await harness.wait_for(lambda: len(_incidents(harness)) == len(FOUND), "three incidents", timeout_s=120)
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
    wanted = sys.argv[1:] or [a for a in FOUND if not (OUT / f"{a}.json").exists()]
    if not wanted:
        print("every incident has its file; name the ones to capture again")
        return
    shared = LocalEngines() if os.environ.get("TRACE_REPRO_TEST_REUSE") == "1" else None
    if shared is not None and all(s.healthy for s in shared.status()):
        found = asyncio.run(capture(shared))
    else:
        default = Layout.default()
        run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-capture-"))
        engines = LocalEngines(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir))
        engines.up()
        try:
            found = asyncio.run(capture(engines))
        finally:
            engines.down()
    OUT.mkdir(parents=True, exist_ok=True)
    for anomaly in wanted:
        event = found[anomaly]
        (OUT / f"{anomaly}.json").write_text(json.dumps(event.model_dump(mode="json"), indent=2) + "\n")
        print(f"{anomaly}: {event.summary}")


if __name__ == "__main__":
    main()
