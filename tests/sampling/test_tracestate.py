"""Reading the sampling a span carries: the tracestate ``ot`` entry (OTel spec "TraceState: Probability Sampling"),
the older ``p`` value, and Jaeger's sampler attributes; through both OTLP decoders, hostile text reading as unknown."""

from __future__ import annotations

import json

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from processors.model.sampling import UNKNOWN, Sampling, from_jaeger, from_tracestate, span_sampling
from streamer.decode import decode_traces_json, decode_traces_proto

TWO_56 = float(1 << 56)


@pytest.mark.parametrize(
    ("tracestate", "probability"),
    [
        ("ot=th:0", 1.0),  # the spec's "always sampled"
        ("ot=th:8", 0.5),  # threshold 0x80000000000000: half of the 56-bit range rejected
        ("ot=th:c", 0.25),
        ("ot=th:c0", 0.25),  # trailing zeros may be left out: the same threshold
        ("ot=th:fd70a4", 1 - 0xFD70A400000000 / TWO_56),  # the spec's ~1% example
        ("ot=th:ffffffffffffff", 1 / TWO_56),  # 14 digits: the smallest probability
        ("ot=th:8;rv:9b8233f7e3a151", 0.5),  # an explicit randomness value beside it
        ("vendor=abc,ot=rv:9b8233f7e3a151;th:c", 0.25),  # another vendor's member first; sub-keys in any order
        ("ot=p:2", 0.25),  # the older power-of-two draft: 2**-2
        ("ot=p:63", 0.0),  # p:63 = never
    ],
)
def test_tracestate_states_its_probability(tracestate: str, probability: float) -> None:
    """The spec's examples give their probability, 1 - th / 2**56."""
    found = from_tracestate(tracestate)
    assert found.probability == pytest.approx(probability, rel=1e-12)
    assert found.source in ("tracestate", "tracestate_p")


@pytest.mark.parametrize(
    "tracestate",
    ["", "ot=rv:9b8233f7e3a151", "ot=th:", "ot=th:FF", "ot=th:123456789abcdef", "ot=th:xyz", "ot=p:64", "ot=p:-1",
     "rojo=00f067aa0ba902b7", "ot", "ot=th:8" .rjust(5000, " ") , "=,=;;:,ot=;th", "ot=th:\x00", "ot=p:٣"],
)  # fmt: skip
def test_no_or_malformed_threshold_is_unknown(tracestate: str) -> None:
    """No threshold, a malformed one (uppercase, too long, not hex) or one past the read bound: unknown, no error."""
    assert from_tracestate(tracestate) == UNKNOWN


def test_unknown_is_not_one() -> None:
    """Unknown weighs 1 (a kept trace represents itself) but is shown as unknown, never as 1."""
    assert UNKNOWN.label == "unknown" and UNKNOWN.weight == 1.0
    assert from_tracestate("ot=th:0").label == "1"
    assert from_tracestate("ot=th:c").weight == 4.0


@pytest.mark.parametrize(
    ("kind", "param", "expected"),
    [
        ("const", 1, Sampling(1.0, "jaeger")),
        ("const", True, Sampling(1.0, "jaeger")),
        ("probabilistic", 0.1, Sampling(0.1, "jaeger")),
        ("probabilistic", "0.25", Sampling(0.25, "jaeger")),
        ("probabilistic", 7.0, Sampling(None, "jaeger:probabilistic")),  # not a probability
        ("probabilistic", float("nan"), Sampling(None, "jaeger:probabilistic")),
        ("ratelimiting", 2.0, Sampling(None, "jaeger:ratelimiting")),  # traces per second: no probability
        (None, 0.5, UNKNOWN),
        (["const"], 1, UNKNOWN),
    ],
)
def test_jaeger_sampler_attributes(kind: object, param: object, expected: Sampling) -> None:
    """``sampler.type`` / ``sampler.param`` as Jaeger clients set them."""
    assert from_jaeger(kind, param) == expected


def test_tracestate_wins_over_jaeger_attributes() -> None:
    assert span_sampling("ot=th:8", "const", 1) == Sampling(0.5, "tracestate")
    assert span_sampling("", "probabilistic", 0.5) == Sampling(0.5, "jaeger")


def _message(trace_state: str, attributes: dict[str, AnyValue] | None = None) -> trace_pb2.TracesData:
    msg = trace_pb2.TracesData()
    rs = msg.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="checkout")))
    sp = rs.scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.name, sp.kind = b"\x01" * 16, b"\x02" * 8, "GET /cart", 2
    sp.start_time_unix_nano, sp.end_time_unix_nano, sp.trace_state = 1, 2, trace_state
    for k, v in (attributes or {}).items():
        sp.attributes.append(KeyValue(key=k, value=v))
    return msg


@pytest.mark.parametrize(
    ("trace_state", "attributes", "expected"),
    [
        ("ot=th:c", None, Sampling(0.25, "tracestate")),
        ("", None, UNKNOWN),
        ("", {"sampler.type": AnyValue(string_value="probabilistic"), "sampler.param": AnyValue(double_value=0.1)},
         Sampling(0.1, "jaeger")),
        ("ot=th:" + "f" * 300, None, UNKNOWN),
    ],
)  # fmt: skip
def test_both_decoders_read_the_span_sampling(
    trace_state: str, attributes: dict[str, AnyValue] | None, expected: Sampling
) -> None:
    """The protobuf and the JSON decoders give the span the sampling its tracestate and attributes state."""
    from google.protobuf.json_format import MessageToDict

    msg = _message(trace_state, attributes)
    [from_proto] = decode_traces_proto(msg.SerializeToString())
    doc = MessageToDict(msg)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0].update(traceId="01" * 16, spanId="02" * 8)  # OTLP/JSON: hex
    [from_json] = decode_traces_json(json.dumps(doc).encode())
    assert from_proto.sampling == expected
    assert from_json.sampling == expected
    assert from_proto == from_json


def test_json_trace_state_that_is_not_text_reads_as_unknown() -> None:
    """A hostile ``traceState`` (a number, an object) costs nothing: the span is kept, its sampling unknown."""
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "01" * 16, "spanId": "02" * 8, "name": "x", "traceState": {"ot": "th:0"}}]}]}]}  # fmt: skip
    [span] = decode_traces_json(json.dumps(doc).encode())
    assert span.sampling == UNKNOWN
