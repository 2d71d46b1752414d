"""A message's resources are checked once each (``streamer.decode.otlp._checked``), not in every message's parse.

What upb's parse of the whole ``TracesData`` refused must still be refused, and read span by span (``_salvage``)
with the same counts, whether the hostile resource is new or came before (its bytes in the resource cache, or
refused then): a string that is not UTF-8, nesting past upb's depth limit counted from the message's root (not from
the resource), framing that does not hold inside the resource, and a resource given in two pieces that parse only
when joined.
"""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, TracesData

from streamer.decode.otlp import DecodeStats, decode_traces_proto
from tests.decode.test_hostile_content import _deep, _field

EDGE = 49  # arrays around a resource attribute's value: a Resource parses alone, not inside a TracesData


def _attribute(value: bytes) -> bytes:
    """A resource's encoded ``attributes`` field: key ``k``, the encoded AnyValue ``value``."""
    return _field(1, _field(1, b"k") + _field(2, value))


def _spans(trace: int, service: str) -> bytes:
    """An encoded ``ResourceSpans`` of one span of trace ``trace``, of service ``service`` (no resource if empty)."""
    rs = ResourceSpans()
    if service:
        rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=service)))
    rs.scope_spans.add().spans.append(
        Span(trace_id=trace.to_bytes(16, "big"), span_id=b"\x01" * 8, name="op", kind=2, start_time_unix_nano=1)
    )
    return bytes(rs.SerializeToString())


def _message(*resource: bytes) -> bytes:
    """A message of a good trace (1) and a trace (2) whose resource is given as the pieces ``resource``."""
    hostile = b"".join(_field(1, piece) for piece in resource) + _spans(2, "")
    return _field(1, _spans(1, "shop")) + _field(1, hostile)


UTF8 = _field(1, _field(1, b"service.name") + _field(2, _field(1, b"caf\xe9")))
HOSTILE = {
    "not_utf8": (UTF8,),
    "too_deep": (_attribute(_deep(300)),),
    "too_deep_from_the_root": (_attribute(_deep(EDGE)),),
    "truncated": (_attribute(_field(1, b"text"))[:-2],),
    "a_bad_second_piece": (_attribute(_field(1, b"fine")), UTF8),
    "pieces_whole_only_when_joined": (_attribute(_field(1, b"joined"))[:-3], _attribute(_field(1, b"joined"))[-3:]),
}


def test_the_edge_is_an_edge() -> None:
    """``EDGE`` arrays parse in a resource alone and not in a message: upb counts its depth from the root."""
    Resource.FromString(_attribute(_deep(EDGE)))
    with pytest.raises(ProtoDecodeError):
        TracesData.FromString(_field(1, _field(1, _attribute(_deep(EDGE)))))


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("valid_first", [False, True])
def test_a_hostile_resource_is_refused_first_and_again(case: str, valid_first: bool) -> None:
    """upb refuses the message whole; it is read span by span, its hostile resource left out (its span kept, with
    no service) and counted, unless the resource parses alone (``too_deep_from_the_root``: kept, as upb's span by
    span read kept it). The same the first time, the second (the resource refused before; or, the edge case,
    decoded and shared by its bytes), and after a message whose resources were all checked."""
    data = _message(*HOSTILE[case])
    with pytest.raises(ProtoDecodeError):
        TracesData.FromString(data)
    kept = case == "too_deep_from_the_root"
    if valid_first:
        decode_traces_proto(_field(1, _spans(3, "shop")))
    outcomes = []
    for _ in range(2):
        stats = DecodeStats()
        spans = decode_traces_proto(data, stats=stats)
        outcomes.append([(s.trace_id[-1], s.resource.service) for s in spans])
        assert stats.unreadable_spans == (0 if kept else 1)
        assert stats.spans == 2
    assert outcomes[0] == outcomes[1] == [("1", "shop"), ("2", "")]  # no hostile resource names a service


def test_a_valid_resource_in_pieces_is_the_pieces_merged() -> None:
    """A resource given twice (upb merges the two) decodes as upb reads it, the first time and from the cache."""
    first = bytes(Resource(attributes=[KeyValue(key="x", value=AnyValue(int_value=1))]).SerializeToString())
    second = bytes(
        Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value="pay"))]).SerializeToString()
    )
    data = _message(first, second)
    TracesData.FromString(data)  # upb parses it whole
    for _ in range(2):
        stats = DecodeStats()
        spans = decode_traces_proto(data, stats=stats)
        assert [s.resource.service for s in spans] == ["shop", "pay"]
        assert stats.unreadable_spans == 0
