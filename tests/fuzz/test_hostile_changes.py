"""Debezium records with hostile row values, times and keys, through both stages beside ordinary requests.

Properties: nothing escapes either stage and no processor hook raises (the collision detector judges rows whose
images hold ``NaN``, ``Infinity``, huge numbers, megabyte strings and deep nesting under the configured invariants);
each valid record is passed on to the internal topic (a value over the bound replaced by Debezium's unavailable
placeholder), each tombstone is taken as one, anything else is dead-lettered with a reason (never an internal
error); stage 2 reads whatever stage 1 passed on; the ordinary requests' accesses come out of stage 1 whatever the
row changes around them hold; every consumed position ends committable.
"""

from __future__ import annotations

from hypothesis import strategies as st

from processors.sql.values import UNAVAILABLE
from tests.fuzz.driver import Run
from tests.fuzz.profiles import fuzz
from tests.fuzz.strategies import ATTRIBUTE_BYTES, MS, NOW, Change, OtlpMessage, changes, good_trace
from tests.runtime.chain import SPANS

_requests = st.lists(st.integers(1, 50), max_size=3, unique=True)


def _spans(rows: list[int]) -> OtlpMessage:
    """Ordinary requests writing ``rows`` of orders (the rows the hostile changes name)."""
    counter = iter(range(1, 2**30))
    traces = [
        good_trace(
            next(counter).to_bytes(16, "big"), lambda: next(counter).to_bytes(8, "big"), row, NOW - (n + 1) * 100 * MS
        )
        for n, row in enumerate(rows)
    ]
    return OtlpMessage(
        [([("service.name", ("s", "shop"))], [[s for t in traces for s in t.spans]])], traces, "otlp_proto"
    )


@fuzz(
    st.lists(changes(NOW // MS), min_size=1, max_size=4), _requests, st.booleans(), examples=150, long_examples=25_000
)
def test_hostile_row_changes_never_escape_and_are_passed_on_or_refused(
    records: list[Change], rows: list[int], spans_first: bool
) -> None:
    """See the module docstring."""
    run = Run({})
    spans = _spans(rows)
    batch = [run.record(c.topic, c.key, c.value) for c in records]
    span_record = run.record(SPANS, None, spans.encode()) if rows else None
    if span_record is not None:
        batch = [span_record, *batch] if spans_first else [*batch, span_record]
    run.step(batch)
    run.settle()

    assert run.processor_errors() == {}
    assert not [
        (d.stage, d.reason, d.error[:200]) for d in run.dead if d.stage == "entities" or d.reason.startswith("internal")
    ]
    passed = {(c.topic, c.offset) for c in run.changes}
    for change, record in zip(records, [r for r in batch if r is not span_record], strict=True):
        dead = run.dead_at(record.topic, record.offset)
        if change.tombstone:
            assert not dead and (record.topic, record.offset) not in passed
        elif change.valid:
            assert not dead, [(d.reason, d.error[:200]) for d in dead]
            assert (record.topic, record.offset) in passed, "a valid row change was not passed on"
        else:
            assert dead or (record.topic, record.offset) in passed, "an invalid row change vanished"
            assert all(d.reason for d in dead)
    for c in run.changes:  # nothing over the bound reaches the internal topic
        for image in (c.before, c.after):
            for value in (image or {}).values():
                assert (
                    not isinstance(value, str)
                    or len(value.encode("utf-8", "surrogatepass")) <= ATTRIBUTE_BYTES
                    or (value == UNAVAILABLE)
                )
    accessed = {a.trace_id for a in run.accesses}
    assert {t.hex for t in spans.traces} <= accessed
    assert run.chain.committable_everywhere()
