"""Hostile content inside valid messages, at decode: what raised or cost a whole message before issue 31.

Numbers past Python's int-string limit (4300 digits) in statement parameters and row values are kept as their
text; one attribute past ``decode.max_attribute_bytes`` is cut and counted while the message's other traces are
kept; a row value past it is replaced by Debezium's unavailable placeholder and counted, a key past it refuses
the change.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from processors.api.telemetry import Telemetry
from processors.model.events import Scalar
from processors.model.span import Span
from processors.sql.values import UNAVAILABLE, compare
from streamer.decode import DecodeError, decode_row_change
from streamer.decode.config import DecodeConfig
from streamer.decode.literals import literal_params
from streamer.decode.registry import DECODERS, Record
from tests.fuzz.strategies import NOW, OtlpMessage, SpanSpec, TraceSpec, Value, good_trace

HUGE = "9" * 5_000  # past the int-string limit


def _message(encoding: str, *extra: tuple[str, Value], name: str = "hostile") -> tuple[OtlpMessage, TraceSpec]:
    """A message of one ordinary request and one DB span holding ``extra`` attributes (the hostile trace)."""
    counter = iter(range(1, 1_000))

    def ids() -> bytes:
        return next(counter).to_bytes(8, "big")

    good = good_trace(b"\x01" * 16, ids, 8812, NOW - 10**9)
    hostile = SpanSpec(
        b"\x02" * 16,
        ids(),
        b"",
        name,
        3,
        NOW - 10**9,
        NOW - 10**9 + 10**6,
        0,
        [
            ("db.system.name", ("s", "postgresql")),
            ("db.query.text", ("s", "SELECT * FROM orders WHERE id = %s")),
            *extra,
        ],
    )
    spans = [*good.spans, hostile]
    return OtlpMessage([([("service.name", ("s", "shop"))], [spans])], [good], encoding), TraceSpec(
        b"\x02" * 16, [hostile]
    )


def _decode(encoding: str, data: bytes, **config: Any) -> tuple[list[Span], Telemetry]:
    telemetry = Telemetry("decode")
    decode = DECODERS[f"{encoding}.traces"](DecodeConfig(**config), telemetry)
    return list(decode(Record("otlp_spans", 0, 0, None, data))), telemetry


def _by_trace(spans: list[Span], trace: TraceSpec) -> list[Span]:
    return [s for s in spans if s.trace_id == trace.hex]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"({HUGE},)", (HUGE,)),
        (f"('paid', -{HUGE})", ("paid", "-" + HUGE)),
        (f"[{HUGE}, 1]", (HUGE, 1)),
        (f"('a', {HUGE}, {{'k': 1}})", ("a", HUGE, '{"k":1}')),
        ("(Decimal('12.50'), 8812, datetime.date(2024, 1, 1))", ("12.50", 8812, "datetime.date(2024, 1, 1)")),
    ],
)
def test_statement_parameters_python_cannot_read_are_kept_as_text(text: str, expected: tuple[Scalar, ...]) -> None:
    """A ``db.statement.parameters`` repr holding an integer past the int-string limit (or a value Python's literals
    cannot express) keeps every value: the integer as its digits, which compare as the number they write."""
    assert literal_params(text) == (expected, ())
    if HUGE in text:
        assert compare(int("9" * 4_000), HUGE) == 1  # the stored digits are above the bound integer


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
def test_span_detail_with_a_huge_integer_parameter_is_read_without_raising(encoding: str) -> None:
    """The span detail is read lazily, when the trace closes, outside the per-record guard: it must not raise (it
    raised ValueError: Exceeds the limit (4300 digits) for integer string conversion)."""
    message, hostile = _message(encoding, ("db.statement.parameters", ("s", f"({HUGE},)")))
    spans, _ = _decode(encoding, message.encode())
    [span] = _by_trace(spans, hostile)
    assert span.db is not None and span.db.params == (HUGE,)


def test_json_query_parameter_past_the_int_string_limit_keeps_the_message() -> None:
    """A ``db.query.parameter.<key>`` intValue of 5000 digits is kept as its text; the message's other trace is
    decoded (the whole message was refused, otlp_json_invalid)."""
    message, hostile = _message("otlp_json", ("db.query.parameter.0", ("s", "")))
    doc = json.loads(message.encode())
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][-1]
    span["attributes"][-1]["value"] = {"intValue": HUGE}
    spans, _ = _decode("otlp_json", json.dumps(doc).encode())
    [decoded] = _by_trace(spans, hostile)
    assert decoded.db is not None and decoded.db.params == (HUGE,)
    assert len(spans) == 4
    raw = json.dumps(doc).replace(f'"intValue": "{HUGE}"', f'"intValue": {HUGE}').encode()  # a JSON number
    spans, _ = _decode("otlp_json", raw)
    assert _by_trace(spans, hostile)[0].db.params == (HUGE,)  # type: ignore[union-attr]


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
@pytest.mark.parametrize("size", [65_537, 1_048_576])
def test_an_oversize_attribute_is_cut_and_the_other_traces_are_kept(encoding: str, size: int) -> None:
    """One attribute over ``decode.max_attribute_bytes`` (and a span name over it) is cut at a character boundary
    and counted (``truncated_attributes``); the span and every other trace of the message are kept (by default the
    whole message was dead-lettered, oversize_attribute)."""
    message, hostile = _message(encoding, ("db.query.parameter.0", ("s", "é" * size)), name="n" * size)
    spans, telemetry = _decode(encoding, message.encode())
    [good] = message.good
    assert len(_by_trace(spans, good)) == 3
    [span] = _by_trace(spans, hostile)
    assert span.db is not None
    [param] = span.db.params
    assert isinstance(param, str) and param == "é" * (65_536 // 2)
    assert span.name == "n" * 65_536
    assert telemetry.dropped["truncated_attributes"] == 2


def test_oversize_dlq_stays_an_option() -> None:
    """``decode.oversize = "dlq"`` still refuses the message whole, for those who want it."""
    message, _ = _message("otlp_proto", ("db.query.parameter.0", ("s", "x" * 70_000)))
    with pytest.raises(DecodeError, match="oversize_attribute"):
        _decode("otlp_proto", message.encode(), oversize="dlq")


def _change(after: dict[str, Any], *, key: bytes | None = b'{"id": 7}', raw: str = "") -> bytes:
    source = {"ts_ms": NOW // 10**6, "schema": "public", "table": "orders", "txId": 9, "lsn": 77}
    text = json.dumps({"before": None, "after": after, "source": source, "op": "c", "ts_ms": NOW // 10**6})
    return text.replace('"__raw__"', raw).encode()


def _row_changes(key: bytes | None, value: bytes) -> tuple[Any, Telemetry]:
    telemetry = Telemetry("decode.debezium")
    decode = DECODERS["debezium"](DecodeConfig(), telemetry)
    return decode(Record("shop.public.orders", 0, 5, key, value)), telemetry


def test_a_megabyte_column_is_replaced_by_the_unavailable_placeholder_and_counted() -> None:
    """A row value past the bound becomes Debezium's own placeholder for a value it did not send (unknown to every
    comparison) and is counted (``oversize_values``); the row change and its other columns pass (the megabyte went
    on to the internal topic, past Kafka's default message size)."""
    (change,), telemetry = _row_changes(
        b'{"id": 7}', _change({"id": 7, "status": "paid", "note": "x" * 2**20, "tags": ["é" * 40_000]})
    )
    assert change.after == {"id": 7, "status": "paid", "note": UNAVAILABLE, "tags": UNAVAILABLE}
    assert telemetry.dropped["oversize_values"] == 2


def test_a_key_past_the_bound_refuses_the_change() -> None:
    """A key value past the bound names no row the daemon can key: the change is refused with a reason."""
    with pytest.raises(DecodeError, match="debezium_oversize_key"):
        decode_row_change(
            json.dumps({"id": "k" * 70_000}).encode(), _change({"id": 1}), topic="t", partition=0, offset=0
        )


def test_a_row_integer_past_the_int_string_limit_is_kept_as_text() -> None:
    """A JSON integer literal of 5000 digits (json.loads refuses it: the change was dead-lettered as invalid JSON)
    is kept as its digits."""
    (change,), _ = _row_changes(b'{"id": 7}', _change({"id": 7, "amount": "__raw__"}, raw=HUGE))
    assert change.after == {"id": 7, "amount": HUGE}
    (change,), _ = _row_changes(b'{"id": %s}' % HUGE.encode(), _change({"id": "__raw__"}, raw=HUGE))
    assert change.key == (("id", HUGE),) and change.entity_key == "orders:" + HUGE


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, encoded by hand (upb will not build what it cannot parse)."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _deep(depth: int) -> bytes:
    """An AnyValue: ``depth`` arrays, each holding the next, around a string."""
    value = _field(1, b"deep")
    for _ in range(depth):
        value = _field(5, _field(1, value))  # AnyValue.array_value { values: [value] }
    return value


@pytest.mark.parametrize(("depth", "kept"), [(48, True), (300, False)])
def test_a_span_nested_past_upbs_depth_limit_costs_only_itself(depth: int, kept: bool) -> None:
    """An attribute nested deeper than upb parses from the message's root (100 levels; the collector's limit is
    far higher) made upb refuse the whole message (otlp_proto_invalid). The message is read span by span: a span
    that parses on its own is kept, one that does not is left out and counted (``unreadable_spans``), and every
    other trace of the message is kept."""
    message, hostile = _message("otlp_proto")
    deep = SpanSpec(hostile.trace_id, b"\x09" * 8, b"", "deep", 1, NOW - 10**9, NOW - 10**9 + 10**6)
    one = TracesData.FromString(OtlpMessage([([("service.name", ("s", "shop"))], [[deep]])], [], "otlp_proto").encode())
    rs = one.resource_spans[0]
    # The span's bytes with one more attribute (a repeated field may be appended to an encoded message), in a
    # ResourceSpans appended to the message's: a message upb cannot parse whole, which it would not build.
    span = rs.scope_spans[0].spans[0].SerializeToString() + _field(
        9, _field(1, b"http.route") + _field(2, _deep(depth))
    )
    data = message.encode() + _field(1, _field(1, rs.resource.SerializeToString()) + _field(2, _field(2, span)))
    with pytest.raises(ProtoDecodeError, match="MaxDepth"):
        TracesData.FromString(data)  # upb refuses it whole
    spans, telemetry = _decode("otlp_proto", data)
    [good] = message.good
    assert len(_by_trace(spans, good)) == 3
    assert len(_by_trace(spans, hostile)) == 1 + kept  # the hostile DB span, and the deep one if it parsed alone
    assert telemetry.dropped["unreadable_spans"] == (0 if kept else 1)


def test_a_row_value_nested_past_the_bound_is_replaced_and_counted() -> None:
    """A row value nested deeper than 32 objects and arrays (Debezium sends scalars, small structs and arrays of at
    most 6 dimensions) is replaced by the placeholder and counted: an incident carrying it as evidence could not be
    serialized (pydantic: Maximum serialization depth exceeded). A 6-dimensional array is kept."""
    deep: Any = 1
    for i in range(400):
        deep = [deep] if i % 2 else {"k": deep}
    cube: Any = 1
    for _ in range(6):
        cube = [cube, cube]
    (change,), telemetry = _row_changes(b'{"id": 7}', _change({"id": 7, "doc": deep, "cube": cube}))
    assert change.after == {"id": 7, "doc": UNAVAILABLE, "cube": cube}
    assert telemetry.dropped["oversize_values"] == 1
