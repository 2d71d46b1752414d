"""Valid OTLP messages (protobuf and the collector's JSON) with hostile content, through both stages.

Properties: nothing escapes either stage's ``process`` and no processor hook raises; stage 2 reads everything stage 1
wrote to the internal topic; a message whose every span is believable is never dead-lettered, one with unbelievable
times (or, in JSON, a lone surrogate) is dead-lettered with that reason; every good request in a message comes out of
stage 1 as its row access and its Trace row, whatever the message's other traces hold; with ``graph_policy.detail =
all`` every believable hostile trace gets its Trace row too; once input stops and event time passes, every consumed
position is committable (no pin left behind).
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from streamer.decode._attrs import QUERY_PARAM, DecodeOptions, span_keys
from tests.fuzz.driver import Run
from tests.fuzz.profiles import fuzz
from tests.fuzz.strategies import DEEP_LOST, DEEP_TRACE, MS, NOW, OtlpMessage, otlp_batches
from tests.runtime.chain import CDC, SPANS

_messages = st.sampled_from(["otlp_proto", "otlp_json"]).flatmap(otlp_batches)


_KEYS = span_keys(DecodeOptions())


def _kept(key: str) -> bool:
    """Whether the decoder reads this span attribute (and so bounds it)."""
    return key in _KEYS or key.startswith(QUERY_PARAM)


def _change(run: Run, row: int, lsn: int) -> None:
    """The row change a good request's UPDATE made, so that stage 2 credits it among the hostile traffic."""
    ms = NOW // MS
    images = {
        "before": {"id": row, "status": "pending", "amount": "NaN"},
        "after": {"id": row, "status": "paid", "amount": "NaN"},
    }
    source = {"ts_ms": ms, "schema": "public", "table": "orders", "txId": lsn, "lsn": lsn}
    value = json.dumps({**images, "source": source, "op": "u", "ts_ms": ms})
    run.step([run.record(CDC, json.dumps({"id": row}).encode(), value.encode())])


@fuzz(_messages, st.sampled_from(["paths", "all"]), examples=150, long_examples=25_000)
def test_hostile_spans_never_escape_and_good_requests_are_kept(messages: list[OtlpMessage], policy: str) -> None:
    """See the module docstring."""
    encoding = messages[0].encoding
    run = Run({"TRACE_REPRO_KAFKA__SPAN_ENCODING": encoding, "TRACE_REPRO_GRAPH_POLICY__DETAIL": policy})
    records = [run.record(SPANS, None, m.encode()) for m in messages]
    run.step(records)
    for lsn, trace in enumerate(t for m in messages for t in m.good):
        assert trace.row is not None
        _change(run, trace.row, 100 + 8 * lsn)
    run.settle()

    assert run.processor_errors() == {}
    assert not [
        (d.stage, d.reason, d.error[:200]) for d in run.dead if d.stage == "entities" or d.reason.startswith("internal")
    ]
    unreadable = run.dropped().get((f"decode.{encoding}.traces", "unreadable_spans"), 0)
    assert (unreadable > 0) == any(m.deep == DEEP_LOST for m in messages), "an unreadable span went uncounted"
    cut = run.dropped().get((f"decode.{encoding}.traces", "truncated_attributes"), 0)
    if any(m.oversize(_kept) for m in messages if not m.surrogates):
        assert cut > 0, "an oversize value was not counted"
    accessed = {a.trace_id for a in run.accesses if a.table == "orders"}
    traced = run.traced()
    for record, message in zip(records, messages, strict=True):
        dead = {d.reason for d in run.dead_at(SPANS, record.offset)}
        if message.surrogates:
            assert dead == {"invalid_unicode"}
            continue
        assert dead == (set() if message.valid(NOW) else {"clock_skew"}), [(d.reason, d.error[:200]) for d in run.dead]
        for trace in message.good:
            assert trace.hex in accessed, "a good request's access was lost"
            assert trace.hex in traced, "a good request's trace was lost"
        if policy == "all":
            for trace in message.traces:
                if any(s.sane(NOW) for s in trace.spans):
                    assert trace.hex in traced, "a believable trace was lost"
            if message.deep and message.deep != DEEP_LOST:
                assert DEEP_TRACE.hex() in traced, "a span upb reads alone was lost"
    assert run.chain.committable_everywhere()
