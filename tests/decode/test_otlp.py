"""OTLP traces decoding: spans made by the real OpenTelemetry SDK, encoded by its own OTLP encoder."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError as ProtoDecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource as SdkResource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util.types import Attributes

from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.span import Span
from streamer.decode import (
    DecodeError,
    DecodeOptions,
    DecodeStats,
    decode_traces_json,
    decode_traces_proto,
)

CHECKOUT = Resource(service="checkout", version="1.4.2", environment="prod", revision="9f1c2e7" + "0" * 33)
INVENTORY = Resource(service="inventory", version="0.9.0", environment="staging", revision="")
UPDATE_SQL = "UPDATE orders SET status = %s WHERE id = %s"


def _provider(exporter: InMemorySpanExporter, attributes: Attributes) -> trace.Tracer:
    provider = TracerProvider(resource=SdkResource.create(attributes))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("tests.decode")


def _record_spans(tmp_dir: Path | None = None) -> list[ReadableSpan]:
    """Spans of a failed checkout (server + DB children) and of an inventory service, via the SDK."""
    exporter = InMemorySpanExporter()
    checkout = _provider(
        exporter,
        {
            "service.name": "checkout",
            "service.version": "1.4.2",
            "deployment.environment.name": "prod",
            "vcs.ref.head.revision": CHECKOUT.revision,
        },
    )
    inventory = _provider(
        exporter, {"service.name": "inventory", "service.version": "0.9.0", "deployment.environment": "staging"}
    )
    legacy_attributes = {
        "db.system": "postgresql",
        "db.statement": "SELECT stock FROM items WHERE id = %s FOR UPDATE",
        "db.sql.table": "items",
        "db.name": "shop",
        "db.operation": "SELECT",
        "code.function": "reserve",
        "code.namespace": "shop.stock",
        "code.filepath": "/app/shop/stock.py",
        "code.lineno": 17,
        "http.status_code": 200,
    }
    with (
        inventory.start_as_current_span("reserve", kind=trace.SpanKind.SERVER) as reserve,
        inventory.start_as_current_span("SELECT items", kind=trace.SpanKind.CLIENT, attributes=legacy_attributes),
    ):
        pass
    with (
        pytest.raises(ValueError, match="card declined"),
        checkout.start_as_current_span(
            "POST /orders/{id}/pay",
            kind=trace.SpanKind.SERVER,
            attributes={
                "http.request.method": "POST",
                "url.path": "/orders/8812/pay",
                "http.route": "/orders/{id}/pay",
                "http.response.status_code": 500,
                "app.idempotency_key": "idem-8812-1",
            },
            links=[trace.Link(reserve.get_span_context())],
        ),
    ):
        with checkout.start_as_current_span(
            "UPDATE orders",
            kind=trace.SpanKind.CLIENT,
            attributes={
                "db.system.name": "postgresql",
                "db.query.text": UPDATE_SQL,
                "db.statement.parameters": "('paid', 8812)",
                "db.namespace": "shop",
                "db.collection.name": "orders",
                "db.operation.name": "UPDATE",
                "db.transaction.id": 771,
                "db.row.version": "3",
                "code.function.name": "shop.payments.pay",
                "code.file.path": "/app/shop/payments.py",
                "code.line.number": 42,
                "server.address": "db",
            },
        ):
            pass
        with checkout.start_as_current_span(
            "SELECT orders",
            kind=trace.SpanKind.CLIENT,
            attributes={
                "db.system.name": "postgresql",
                "db.query.text": "SELECT status FROM orders WHERE status = $1 AND id = $2",
                "db.query.parameter.1": "8812",
                "db.query.parameter.0": "paid",
            },
        ):
            pass
        with checkout.start_as_current_span(
            "SELECT customers",
            kind=trace.SpanKind.CLIENT,
            attributes={
                "db.system.name": "postgresql",
                "db.query.text": "SELECT * FROM customers WHERE name = :name",
                "db.query.parameter.name": "alice",
            },
        ):
            pass
        if tmp_dir is not None:
            with checkout.start_as_current_span(
                "hostile",
                attributes={
                    "db.system.name": "postgresql",
                    "db.query.text": "SELECT 1",
                    "db.statement.parameters": f"__import__('os').system('touch {tmp_dir}/pwned')",
                },
            ):
                pass
        raise ValueError("card declined")
    return list(exporter.get_finished_spans())


def _encode(spans: list[ReadableSpan]) -> bytes:
    return bytes(encode_spans(spans).SerializeToString())


def _ids(span: ReadableSpan) -> dict[str, Any]:
    """The fields of a decoded span that come straight from the SDK span."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent else "",
        "name": span.name,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
    }


def _expected(spans: list[ReadableSpan]) -> dict[str, Span]:
    by_name = {s.name: s for s in spans}
    reserve_ctx = by_name["reserve"].get_span_context()
    assert reserve_ctx is not None
    return {
        "reserve": Span(**_ids(by_name["reserve"]), kind=SpanKind.SERVER, status=StatusCode.UNSET, resource=INVENTORY),
        "SELECT items": Span(
            **_ids(by_name["SELECT items"]),
            kind=SpanKind.CLIENT,
            status=StatusCode.UNSET,
            resource=INVENTORY,
            http_status=200,
            code_function="shop.stock.reserve",
            code_file="/app/shop/stock.py",
            code_line=17,
            db=DbCall(
                system="postgresql",
                statement="SELECT stock FROM items WHERE id = %s FOR UPDATE",
                namespace="shop",
                collection="items",
                operation="SELECT",
            ),
        ),
        "POST /orders/{id}/pay": Span(
            **_ids(by_name["POST /orders/{id}/pay"]),
            kind=SpanKind.SERVER,
            status=StatusCode.ERROR,
            resource=CHECKOUT,
            route="/orders/{id}/pay",
            http_status=500,
            exception_type="ValueError",
            exception_message="card declined",
            links=(format(reserve_ctx.trace_id, "032x"),),
            idempotency_key="idem-8812-1",
            exception_stacktrace=str(by_name["POST /orders/{id}/pay"].events[0].attributes["exception.stacktrace"]),
        ),
        "UPDATE orders": Span(
            **_ids(by_name["UPDATE orders"]),
            kind=SpanKind.CLIENT,
            status=StatusCode.UNSET,
            resource=CHECKOUT,
            code_function="shop.payments.pay",
            code_file="/app/shop/payments.py",
            code_line=42,
            db=DbCall(
                system="postgresql",
                statement=UPDATE_SQL,
                namespace="shop",
                collection="orders",
                operation="UPDATE",
                params=("paid", 8812),
                tx_id="771",
                row_version="3",
            ),
        ),
        "SELECT orders": Span(
            **_ids(by_name["SELECT orders"]),
            kind=SpanKind.CLIENT,
            status=StatusCode.UNSET,
            resource=CHECKOUT,
            db=DbCall(
                system="postgresql",
                statement="SELECT status FROM orders WHERE status = $1 AND id = $2",
                params=("paid", "8812"),
            ),
        ),
        "SELECT customers": Span(
            **_ids(by_name["SELECT customers"]),
            kind=SpanKind.CLIENT,
            status=StatusCode.UNSET,
            resource=CHECKOUT,
            db=DbCall(
                system="postgresql",
                statement="SELECT * FROM customers WHERE name = :name",
                named_params=(("name", "alice"),),
            ),
        ),
    }


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _collector_json(message: Any, **kwargs: Any) -> bytes:
    """OTLP/JSON as the collector's ``otlp_json`` writes it: protobuf JSON mapping, but hex ids."""
    doc = MessageToDict(message, **kwargs)

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"):
                    node[key] = _b64_to_hex(value)
                else:
                    fix(value)
        elif isinstance(node, list):
            for item in node:
                fix(item)

    fix(doc)
    return json.dumps(doc).encode()


def test_proto_decodes_every_field() -> None:
    """Every field of SDK-made spans (current and older conventions, DB, links, two resources) round-trips."""
    spans = _record_spans()
    stats = DecodeStats()
    decoded = decode_traces_proto(_encode(spans), DecodeOptions(), stats)
    assert {s.name: s for s in decoded} == _expected(spans)
    assert len(decoded) == len(spans) == stats.spans
    assert stats.truncated_attributes == 0


def test_json_matches_proto() -> None:
    """The collector's otlp_json (hex ids) decodes to exactly the spans the protobuf gives."""
    spans = _record_spans()
    from_proto = decode_traces_proto(_encode(spans))
    assert decode_traces_json(_collector_json(encode_spans(spans))) == from_proto
    snake = _collector_json(encode_spans(spans), preserving_proto_field_name=True)
    assert decode_traces_json(snake) == from_proto


def test_json_collector_style_numbers() -> None:
    """Enums as numbers and int64 values as JSON numbers (as some writers emit them) are accepted."""
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "checkout"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5B8EFFF798038103D269B633813FC60C",
                                "spanId": "eee19b7ec3c1b174",
                                "parentSpanId": "",
                                "name": "GET /items",
                                "kind": 2,
                                "startTimeUnixNano": 1544712660000000000,
                                "endTimeUnixNano": "1544712661000000000",
                                "status": {"code": 2},
                                "attributes": [
                                    {"key": "http.response.status_code", "value": {"intValue": "503"}},
                                    {"key": "code.line.number", "value": {"intValue": 7}},
                                    {"key": "app.idempotency_key", "value": {"intValue": "12"}},
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    (span,) = decode_traces_json(json.dumps(doc).encode())
    assert span == Span(
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="eee19b7ec3c1b174",
        parent_id="",
        name="GET /items",
        kind=SpanKind.SERVER,
        start_ns=1544712660000000000,
        end_ns=1544712661000000000,
        status=StatusCode.ERROR,
        resource=Resource(service="checkout"),
        http_status=503,
        code_line=7,
        idempotency_key="12",
    )


def test_configured_attribute_names() -> None:
    """The transaction id, row version and idempotency key attribute names come from DecodeOptions."""
    exporter = InMemorySpanExporter()
    tracer = _provider(exporter, {"service.name": "checkout"})
    attributes = {"db.system.name": "mysql", "db.query.text": "SELECT 1", "app.tx": "tx-9", "app.ver": 4, "idem": "k"}
    with tracer.start_as_current_span("q", attributes=attributes):
        pass
    opts = DecodeOptions(tx_id_attribute="app.tx", row_version_attribute="app.ver", idempotency_key_attribute="idem")
    (span,) = decode_traces_proto(_encode(list(exporter.get_finished_spans())), opts)
    assert span.db == DbCall(system="mysql", statement="SELECT 1", tx_id="tx-9", row_version="4")
    assert span.idempotency_key == "k"


def test_hostile_statement_parameters_are_not_executed(tmp_path: Path) -> None:
    """A db.statement.parameters value that is code is neither run nor fatal: the span decodes, params empty."""
    spans = _record_spans(tmp_path)
    decoded = {s.name: s for s in decode_traces_proto(_encode(spans))}
    assert decoded["hostile"].db == DbCall(system="postgresql", statement="SELECT 1")
    assert not (tmp_path / "pwned").exists()
    assert {s.name: s for s in decode_traces_json(_collector_json(encode_spans(spans)))} == decoded


def test_statement_parameter_shapes() -> None:
    """Lists, dicts, single values and non-scalars in db.statement.parameters decode to scalars."""
    exporter = InMemorySpanExporter()
    tracer = _provider(exporter, {"service.name": "s"})
    for name, params in [
        ("list", "['a', 1, 2.5, None, True]"),
        ("dict", "{'status': 'paid', 'id': 8812}"),
        ("nested", "((1, 2), b'x')"),
        ("broken", "('paid', "),
    ]:
        attributes = {"db.system.name": "postgresql", "db.query.text": "Q", "db.statement.parameters": params}
        with tracer.start_as_current_span(name, attributes=attributes):
            pass
    dbs = {s.name: s.db for s in decode_traces_proto(_encode(list(exporter.get_finished_spans())))}
    assert dbs["list"] == DbCall("postgresql", "Q", params=("a", 1, 2.5, None, True))
    assert dbs["dict"] == DbCall("postgresql", "Q", named_params=(("status", "paid"), ("id", 8812)))
    assert dbs["nested"] == DbCall("postgresql", "Q", params=("(1, 2)", "b'x'"))
    assert dbs["broken"] == DbCall("postgresql", "Q")


def test_oversize_attribute_is_truncated_and_counted() -> None:
    """An extracted string over max_attribute_bytes is cut at a UTF-8 boundary and counted; others are kept."""
    exporter = InMemorySpanExporter()
    tracer = _provider(exporter, {"service.name": "s"})
    attributes = {"http.route": "é" * 50, "code.file.path": "x" * 64, "url.full": "y" * 1000}
    with tracer.start_as_current_span("big", attributes=attributes):
        pass
    data = _encode(list(exporter.get_finished_spans()))
    opts = DecodeOptions(max_attribute_bytes=64)
    for decode, payload in (
        (decode_traces_proto, data),
        (decode_traces_json, _collector_json(trace_pb2.TracesData.FromString(data))),
    ):
        stats = DecodeStats()
        (span,) = decode(payload, opts, stats)
        assert span.route == "é" * 32
        assert span.code_file == "x" * 64
        assert stats.truncated_attributes == 1


def test_oversize_message_rejected() -> None:
    """A value larger than max_message_bytes is rejected before parsing."""
    data = _encode(_record_spans())
    with pytest.raises(DecodeError) as err:
        decode_traces_proto(data, DecodeOptions(max_message_bytes=100))
    assert err.value.reason == "oversize_message"


@pytest.mark.parametrize("decode", [decode_traces_proto, decode_traces_json])
def test_empty_value_rejected(decode: Any) -> None:
    """An empty Kafka value is an empty_value error for both encodings."""
    with pytest.raises(DecodeError) as err:
        decode(b"")
    assert err.value.reason == "empty_value"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 8, id="length-past-end"),
        pytest.param(b"\xff" * 32, id="invalid-wire-type"),
        pytest.param(bytes(range(256)), id="random"),
    ],
)
def test_garbage_proto_rejected(data: bytes) -> None:
    """Bytes that are not a TracesData message raise otlp_proto_invalid."""
    with pytest.raises(DecodeError) as err:
        decode_traces_proto(data)
    assert err.value.reason == "otlp_proto_invalid"


def test_truncated_proto_rejected() -> None:
    """A message cut short inside a span raises otlp_proto_invalid."""
    data = _encode(_record_spans())
    with pytest.raises(DecodeError) as err:
        decode_traces_proto(data[: len(data) - 5])
    assert err.value.reason == "otlp_proto_invalid"


@pytest.mark.parametrize(
    ("field", "value"),
    [("trace_id", b"\x01" * 15), ("span_id", b"\x01" * 4), ("parent_span_id", b"\x01" * 9), ("trace_id", b"")],
)
def test_corrupt_ids_reject_the_whole_message(field: str, value: bytes) -> None:
    """One span with an id of the wrong length makes the whole message an otlp_invalid_id error."""
    msg = trace_pb2.TracesData.FromString(_encode(_record_spans()))
    setattr(msg.resource_spans[0].scope_spans[0].spans[0], field, value)
    with pytest.raises(DecodeError) as err:
        decode_traces_proto(msg.SerializeToString())
    assert err.value.reason == "otlp_invalid_id"


def test_json_base64_ids_rejected() -> None:
    """OTLP/JSON with base64 ids (protobuf's JSON mapping, not the collector's) is rejected, not misread."""
    data = json.dumps(MessageToDict(encode_spans(_record_spans()))).encode()
    with pytest.raises(DecodeError) as err:
        decode_traces_json(data)
    assert err.value.reason == "otlp_invalid_id"
    assert "traceId" in err.value.message


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "message is not an object"),
        (b'{"resourceSpans": {}}', "resourceSpans is not a list"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [7]}]}]}', "spans[0] is not an object"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"attributes": [1]}]}]}]}', "string key"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),
    ],
)
def test_malformed_json_rejected(data: bytes, where: str) -> None:
    """Malformed OTLP/JSON raises otlp_json_invalid with a message naming what was wrong."""
    with pytest.raises(DecodeError) as err:
        decode_traces_json(data)
    assert err.value.reason == "otlp_json_invalid"
    assert where in err.value.message


def test_json_bad_attribute_value_rejected() -> None:
    """A kept attribute whose AnyValue has the wrong JSON type is an otlp_json_invalid error."""
    span = {
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "attributes": [{"key": "http.route", "value": {"stringValue": 5}}],
    }
    data = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    with pytest.raises(DecodeError) as err:
        decode_traces_json(data)
    assert err.value.reason == "otlp_json_invalid"
    assert "http.route" in err.value.message


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    """Arbitrary bytes either decode to spans or raise DecodeError, never anything else."""
    try:
        spans = decode_traces_proto(data)
    except DecodeError:
        return
    assert all(isinstance(s, Span) for s in spans)


_VALID = _encode(_record_spans())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_corrupted_message_never_crashes(edits: list[tuple[int, int]]) -> None:
    """A real message with a few bytes overwritten either decodes or raises DecodeError (both encodings)."""
    data = bytearray(_VALID)
    for pos, byte in edits:
        data[pos] = byte
    payloads = [(decode_traces_proto, bytes(data))]
    with contextlib.suppress(ProtoDecodeError):  # the corrupted protobuf may not parse at all
        payloads.append((decode_traces_json, _collector_json(trace_pb2.TracesData.FromString(bytes(data)))))
    for decode, payload in payloads:
        try:
            spans = decode(payload)
        except DecodeError:
            continue
        assert all(isinstance(s, Span) for s in spans)


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=30,
)
_KEYS = ["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "attributes", "key", "value", "stringValue"]


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        _JSON_VALUES,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4),
        max_leaves=40,
    )
)
def test_arbitrary_json_never_crashes(doc: Any) -> None:
    """Arbitrary JSON documents either decode to spans or raise DecodeError, never anything else."""
    try:
        spans = decode_traces_json(json.dumps(doc).encode())
    except DecodeError:
        return
    assert all(isinstance(s, Span) for s in spans)


def test_a_statement_sent_as_bytes_is_read_as_text() -> None:
    """psycopg2's ``execute_values`` hands its instrumentation the SQL as ``bytes``, which OTLP carries as
    ``bytes_value``: the statement is its UTF-8 text in both encodings, not hex."""
    exporter = InMemorySpanExporter()
    tracer = _provider(exporter, {"service.name": "checkout"})
    sql = b"INSERT INTO accounts (id, owner, balance) VALUES (60,'f',1),(61,'g',2)"
    with tracer.start_as_current_span("INSERT", kind=trace.SpanKind.CLIENT) as span:
        span.set_attribute("db.system", "postgresql")
        span.set_attribute("db.statement", sql)
    spans = list(exporter.get_finished_spans())
    for decoded in (decode_traces_proto(_encode(spans)), decode_traces_json(_collector_json(encode_spans(spans)))):
        (only,) = decoded
        assert only.db is not None
        assert only.db.statement == sql.decode()
