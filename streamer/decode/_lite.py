"""Cheap second parses of a ``TracesData`` message that upb has parsed (and so checked) whole.

``SizedTraces`` keeps each span as its bytes: it sizes every span, and reads a message whose spans upb cannot all
parse, one by one. ``ScopedTraces`` keeps each ``ScopeSpans`` as its bytes: a scope no larger than the size a
span is looked at holds no span that large, so only a larger scope's spans are sized (``SizedScope``: its spans as
their bytes). ``DetailTraces`` is what a span is decoded from (upb's parse of the whole message only checks
it: walking both costs a Python object at each level of each, twice): of each span its core fields, and what its
``SpanDetail`` is read from: its attributes, events and links each as its encoded bytes, its trace state; and each
resource as its encoded bytes (as often as the field is given: upb merges them, as their concatenation parses),
the key of its decoded ``Resource``. A span's attributes are then read from their bytes (``KeptAttributes``): a key
the detail does not keep is skipped by its encoded bytes alone, without upb's per-attribute Python objects, and a
kept attribute seen before (the same key and value, byte for byte) is not read again.
"""

from __future__ import annotations

import functools
from typing import Any, Generic, TypeVar

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from streamer.decode._attrs import DecodeOptions, span_keys

_F = descriptor_pb2.FieldDescriptorProto
_FIELDS: dict[str, tuple[tuple[str, int, int, str], ...]] = {
    # (name, number, type, message type): every field repeated unless named in _SINGLE
    "TracesData": (("items", 1, _F.TYPE_MESSAGE, "ResourceSpans"),),
    "ResourceSpans": (("items", 2, _F.TYPE_MESSAGE, "ScopeSpans"), ("resource", 1, _F.TYPE_BYTES, "")),
    "ScopeSpans": (("items", 2, _F.TYPE_BYTES, ""),),
    "ScopedTraces": (("items", 1, _F.TYPE_MESSAGE, "ScopedResourceSpans"),),
    "ScopedResourceSpans": (("items", 2, _F.TYPE_BYTES, ""),),
    "DetailTraces": (("items", 1, _F.TYPE_MESSAGE, "DetailResourceSpans"),),
    "DetailResourceSpans": (("items", 2, _F.TYPE_MESSAGE, "DetailScopeSpans"), ("resources", 1, _F.TYPE_BYTES, "")),
    "DetailScopeSpans": (("items", 2, _F.TYPE_MESSAGE, "DetailSpan"),),
    "DetailSpan": (  # the OTLP ``Span``'s numbers and wire types (an enum read as the int32 it is on the wire)
        ("trace_id", 1, _F.TYPE_BYTES, ""),
        ("span_id", 2, _F.TYPE_BYTES, ""),
        ("trace_state", 3, _F.TYPE_STRING, ""),
        ("parent_span_id", 4, _F.TYPE_BYTES, ""),
        ("name", 5, _F.TYPE_STRING, ""),
        ("kind", 6, _F.TYPE_INT32, ""),
        ("start_time_unix_nano", 7, _F.TYPE_FIXED64, ""),
        ("end_time_unix_nano", 8, _F.TYPE_FIXED64, ""),
        ("attributes", 9, _F.TYPE_BYTES, ""),
        ("events", 11, _F.TYPE_BYTES, ""),
        ("links", 13, _F.TYPE_BYTES, ""),
        ("status", 15, _F.TYPE_MESSAGE, "DetailStatus"),
    ),
    "DetailStatus": (("code", 3, _F.TYPE_INT32, ""),),
}
_SINGLE = frozenset(
    {"resource", "trace_state", "name", "trace_id", "span_id", "parent_span_id", "kind", "start_time_unix_nano"}
    | {"end_time_unix_nano", "status", "code"}
)


def _lite_classes() -> tuple[Any, Any, Any, Any, Any]:
    """(``SizedTraces``, its ``ScopeSpans``, ``ScopedTraces``, ``DetailTraces``, its ``DetailSpan``): see the
    module's text. Their strings are read only
    from messages upb has parsed as the OTLP ``TracesData`` (which checks that each is UTF-8)."""
    fd = descriptor_pb2.FileDescriptorProto(name="trace_repro_lite_traces.proto", package="trace_repro_lite")
    for name, fields in _FIELDS.items():
        message = fd.message_type.add(name=name)
        for field, number, kind, type_name in fields:
            label = _F.LABEL_OPTIONAL if field in _SINGLE else _F.LABEL_REPEATED
            f = message.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                f.type_name = f".trace_repro_lite.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    find = pool.FindMessageTypeByName
    return tuple(message_factory.GetMessageClass(find(f"trace_repro_lite.{name}"))
                 for name in ("TracesData", "ScopeSpans", "ScopedTraces", "DetailTraces", "DetailSpan"))  # fmt: skip


SizedTraces, SizedScope, ScopedTraces, DetailTraces, DetailSpan = _lite_classes()


def _check_class() -> Any:
    """``CheckTraces``: the OTLP ``TracesData`` whose ``ResourceSpans.resource`` is plain bytes. Parsing a message
    with it checks everything upb's parse as ``TracesData`` checks (framing, UTF-8, nesting depth from the root)
    except inside its resources, which ``streamer.decode.otlp`` checks once for each distinct resource: a message
    of one trace (the collector's kafka exporter) carries a dozen resource attributes and about one span, and the
    attributes cost most of upb's parse."""
    pool = descriptor_pool.DescriptorPool()  # its own pool: the same full names as the generated classes'
    files = [common_pb2.DESCRIPTOR, resource_pb2.DESCRIPTOR, trace_pb2.DESCRIPTOR]
    protos = [descriptor_pb2.FileDescriptorProto() for _ in files]
    for file, proto in zip(files, protos, strict=True):
        file.CopyToProto(proto)
    [spans] = [m for m in protos[-1].message_type if m.name == "ResourceSpans"]
    [resource] = [f for f in spans.field if f.name == "resource"]
    resource.type = _F.TYPE_BYTES
    resource.ClearField("type_name")
    for proto in protos:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("opentelemetry.proto.trace.v1.TracesData"))


CheckTraces = _check_class()


def skipped(kv: bytes, prefixes: dict[bytes, int]) -> bool:
    """Whether the encoded ``KeyValue`` ``kv`` is exactly one key field (of under 128 bytes) and one value field (of
    under 16,384 bytes), in that order, and its key is not one of ``prefixes`` (encoded key fields, see
    ``key_prefixes``). A ``KeyValue`` of any other form (fields repeated or out of order) is not skipped here: it is
    parsed whole, where the last key given wins."""
    n = len(kv)
    if n < 4 or kv[0] != 10 or (p := kv[1] + 2) >= 130 or n < p + 2 or kv[p] != 18:
        return False
    size = kv[p + 1]
    if size < 128:
        whole = n == p + 2 + size
    else:
        whole = n > p + 2 and kv[p + 2] < 128 and n == p + 3 + (size & 127 | kv[p + 2] << 7)
    return whole and kv[:p] not in prefixes


def key_prefixes(keys: dict[str, int]) -> dict[bytes, int]:
    """The encoded key field (tag, length, UTF-8 key) of each key of under 128 bytes → its slot."""
    out: dict[bytes, int] = {}
    for key, slot in keys.items():
        raw = key.encode()
        if len(raw) < 128:
            out[b"\n" + bytes((len(raw),)) + raw] = slot
    return out


K = TypeVar("K")
V = TypeVar("V")


class Shared(Generic[K, V]):
    """Decoded values that many spans share (a service's resource, a route's detail, a kept attribute): one object
    each, so that open traces hold one copy and a message skips their decoding. At most ``bound`` entries, then it
    starts again (a reset is counted, in ``resets`` and in every cache's ``Shared.total``: the decoder reports them
    as ``dropped{component=decode, reason=shared_cache_reset}``)."""

    __slots__ = ("bound", "data", "resets")
    total = 0  # resets of every cache of this process

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.data: dict[K, V] = {}
        self.resets = 0

    def put(self, key: K, value: V) -> V:
        if len(self.data) >= self.bound:
            self.data.clear()
            self.resets += 1
            Shared.total += 1
        self.data[key] = value
        return value


KEPT_ATTRIBUTES = 4096  # distinct kept attributes (by their encoded bytes), for each set of decode options
KEPT_ATTRIBUTE_BYTES = 256  # an attribute encoded in more bytes is read again in each span
KNOWN_SPANS = 4096  # distinct spans' attributes (all of them, see KeptAttributes) known, then it starts again
SKIPPED_ATTRIBUTES = 4096  # distinct skipped attributes known (by their encoded bytes), then the set starts again


class KeptAttributes:
    """A set of options' kept keys as encoded key fields (``key_prefixes``), the kept attributes read so far
    (encoded ``KeyValue`` → (slot, value)), the skipped ones seen so far (an attribute of a key no span field reads,
    server.address or http.method, repeats byte for byte in most spans: one dict lookup instead of its framing read
    again, ``streamer.decode._detail.span_detail``; at most ``SKIPPED_ATTRIBUTES`` of up to ``KEPT_ATTRIBUTE_BYTES``
    bytes, then it starts again, a reset counted as every ``Shared``'s), the shared details of spans of no
    events, links nor trace state (their kept attributes' bytes → ``SpanDetail``), and the details of such spans
    by all of their attributes' bytes, in order, when each was known (kept or skipped) already: a span that
    repeats another's attributes is then read in one lookup (``streamer.decode._detail.span_detail``)."""

    __slots__ = ("details", "prefixes", "skipped", "spans", "values")

    def __init__(self, keys: dict[str, int]) -> None:
        self.prefixes = key_prefixes(keys)
        self.values: Shared[bytes, tuple[int, Any]] = Shared(KEPT_ATTRIBUTES)
        self.skipped: Shared[bytes, None] = Shared(SKIPPED_ATTRIBUTES)
        self.details: Shared[tuple[bytes, ...], Any] = Shared(KEPT_ATTRIBUTES)
        self.spans: Shared[tuple[bytes, ...], Any] = Shared(KNOWN_SPANS)


@functools.lru_cache(maxsize=16)
def kept_attributes(opts: DecodeOptions) -> KeptAttributes:
    """The ``KeptAttributes`` of ``opts`` (a value read under one set of options is not another's)."""
    return KeptAttributes(span_keys(opts))
