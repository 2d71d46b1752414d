"""The blocked-by detector over the bench's benign traffic (``bench.otlp_gen``, what ``make bench`` sends): silent.

The bench's spans go through a real ingest stage in process, as ``bench.run.run_stage`` drives it; its accesses reach
the detector as stage 2 would hand them over. The bench has no Debezium, so its tables' keys are set as Debezium would
have taught them, and each write gets the row change the database would have made, credited to it, committed at its
request's end: the latest its lock can be released, so every write holds its row as long as the traffic allows.
Statements of independent requests on one row that are long and end as another's commit lands are what the detector
would name; benign traffic has none.
"""

from __future__ import annotations

import json
from typing import Any

from bench.otlp_gen import generate_run
from bench.run import _Clock, _polls, _records, close_all, settings_env
from processors.api.component import Emit
from processors.correlation.config import CorrelationConfig
from processors.detectors.blocked_by import BlockedByConfig, BlockedByDetector
from processors.model.events import Access, CdcOp, Commit, DbOperation, RowChange
from processors.model.finding import FindingEvent
from processors.model.units import MS_NS, ms_to_ns, s_to_ns
from streamer import config
from streamer.components import default
from streamer.decode.internal import decode
from streamer.runtime.context import stage_processors
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker

SPANS = 40_000  # the bench's --quick size (``python -m bench.run --quick``)
TABLES = ("orders", "inventory", "payments", "shipments", "charges")  # the bench's tables, each keyed by ``id``


def bench_accesses(spans: int, seed: int = 1) -> list[Access]:
    """The row accesses a real ingest stage derives from ``spans`` spans of the bench's traffic."""
    gen = generate_run(spans, 300, seed, partitions=1)
    keys = (
        "sql__key_columns=" + json.dumps({table: ["id"] for table in TABLES}),
    )  # as Debezium's message keys teach it
    env = settings_env("127.0.0.1:9", "redis://127.0.0.1:9", "blk", "bench-spans-blk", overrides=keys)
    settings = config.load(None, env=env)
    clock, metrics, tracker = _Clock(), Metrics(), PinTracker()
    processors = stage_processors(settings, metrics, clock, "ingest", tracker, default().factories)
    stage = IngestStage(settings, metrics, clock, tracker=tracker, processors=processors)
    produced = []
    for polled in _polls(_records(gen, settings.kafka.spans_topic), settings):
        produced += stage.process(polled).produce
    clock.now += 3600 * 1_000_000_000  # every partition idle: all state closes
    for out in close_all(stage):
        produced += out.produce
    ours = [m for m in produced if m.topic == settings.kafka.accesses_topic and m.value]
    return [e for m in ours if isinstance(e := decode(m.value or b""), Access)]


def run_detector(accesses: list[Access], min_wait_ms: float = 0) -> tuple[list[FindingEvent], dict[str, Any]]:
    """The shipped defaults (but ``min_wait_ms`` when given) over ``accesses``, each write committed at its request's
    end."""
    c, skew = BlockedByConfig(), CorrelationConfig()
    d = BlockedByDetector(min_wait_ns=ms_to_ns(min_wait_ms or c.min_wait_ms), release_ns=ms_to_ns(c.release_ms),
                          skew_ns=ms_to_ns(skew.skew_ms + skew.clock_jitter_ms), window_ns=s_to_ns(c.window_s),
                          settle_ns=s_to_ns(c.settle_s), max_hold_ns=s_to_ns(c.max_hold_s),
                          min_blocked=c.min_blocked)  # fmt: skip
    out = Emit()
    lsn = 0
    for a in sorted(accesses, key=lambda a: a.end_ns):
        d.on_access(a)
        if a.keyed and a.operation is not DbOperation.READ:
            lsn += 1
            at_ms = max(a.request_end_ns, a.end_ns) // MS_NS
            op = CdcOp.CREATE if a.operation is DbOperation.INSERT else CdcOp.UPDATE
            row = RowChange(table=a.table, op=op, key=(("id", a.entity.split(":", 1)[1]),), before={},
                            after={}, commit_ts_ms=at_ms, ts_ms=at_ms, lsn=lsn, tx_id=str(lsn))  # fmt: skip
            d.on_commit(a.entity, Commit(row, a.trace_id, a.span_id, "values_time"))
    d.on_watermark(max(a.end_ns for a in accesses) + s_to_ns(3600), None, out)
    assert not out.quarantined
    return [e for e in out.events if isinstance(e, FindingEvent)], {**d.counters, "accesses": len(accesses),
                                                                     "writes": lsn}  # fmt: skip


def test_the_bench_traffic_has_no_lock_waits() -> None:
    """Zero findings and zero lock waits on the bench's benign traffic, with every write holding its row."""
    found, counters = run_detector(bench_accesses(SPANS))
    assert counters["lock_accesses"] > 1000 and counters["commits"] > 1000, counters  # the rule had material
    assert found == [] and counters.get("blocks", 0) == 0, counters
