"""``trace-repro doctor`` on Debezium's Avro form: the schemas come from the configured registry first."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from streamer import config
from streamer.decode import Record
from streamer.doctor.diagnose import diagnose
from tests.decode.registry_server import registry_server

FIXTURE = Path(__file__).parents[1] / "decode" / "fixtures" / "debezium_avro.json"


def _records() -> list[Record]:
    raw = [r for r in json.loads(FIXTURE.read_text()) if r["topic"].endswith(".prices")]
    data = [(r["key"] and base64.b64decode(r["key"]), r["value"] and base64.b64decode(r["value"])) for r in raw]
    return [Record(r["topic"], 0, i, key, value) for i, (r, (key, value)) in enumerate(zip(raw, data, strict=True))]


def test_avro_changes_read_through_the_registry_and_refused_without_one() -> None:
    topic = _records()[0].topic
    with registry_server() as served:
        env = {"TRACE_REPRO_KAFKA__CDC_PATTERN": "^i33dbz", "TRACE_REPRO_DECODE__SCHEMA_REGISTRY__URL": served.url}
        report = diagnose(_records(), config.load(None, env=env))
    assert topic not in report.undecodable
    captured = next(f for f in report.findings if f.capability == "cdc: captured")
    assert captured.detail == "4 change(s) (c:2 d:1 u:1)"
    form = next(f for f in report.findings if f.capability == "cdc: converter form")
    assert form.detail.endswith("; schemas from the registry"), form.detail  # (not "schemas off": they are by id)
    plain = diagnose(_records(), config.load(None, env={"TRACE_REPRO_KAFKA__CDC_PATTERN": "^i33dbz"}))
    assert plain.undecodable[topic] == {"avro_no_registry": 4}
