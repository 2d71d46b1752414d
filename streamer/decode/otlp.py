"""OTLP traces and logs → ``Span`` / ``LogRecord`` events: protobuf here, the collector's ``otlp_json`` in
``streamer.decode.otlp_json`` (re-exported).

Hot path: a span's core fields (ids, name, kind, times, status) are read when it is decoded, its attributes and
events on first use (``processors.model.span.lazy_span``); each attribute is skipped by its key alone, only the
few kept keys have their value read, and a ``db.statement.parameters`` tuple repr is parsed without ``ast``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from sys import intern
from typing import Any, Generic, TypeVar

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError as _ProtoDecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from processors.model.events import LogRecord, Resource, SpanKind, StatusCode
from processors.model.span import DETAIL_FIELDS, NO_DETAIL, Span, SpanDetail, lazy_span
from streamer.decode._attrs import (
    DEFAULT_OPTIONS,
    EXCEPTION_EVENT,
    EXCEPTION_KEYS,
    INTERNED_SLOTS,
    KINDS,
    LOG_KEYS,
    MAX_DEPTH,
    NO_FIELDS,
    QUERY_PARAM,
    RESOURCE_KEYS,
    SPAN_SLOTS,
    STATUSES,
    TEXT_SLOTS,
    DecodeOptions,
    DecodeStats,
    Extractor,
    is_db,
    sampling_of,
)
from streamer.decode.errors import DecodeError
from streamer.decode.otlp_json import decode_logs_json, decode_traces_json

__all__ = [
    "DecodeOptions",
    "DecodeStats",
    "decode_logs_json",
    "decode_logs_proto",
    "decode_traces_json",
    "decode_traces_proto",
]


def _value(av: AnyValue, depth: int = 0) -> Any:
    """An ``AnyValue`` as a plain value: arrays/kvlists → lists/dicts, bytes → hex, unset → None."""
    s = av.string_value
    if s:
        return s
    which = av.WhichOneof("value")
    if which == "string_value":
        return s
    if which == "int_value":
        return av.int_value
    if which == "bool_value":
        return av.bool_value
    if which == "double_value":
        return av.double_value
    if which == "bytes_value":
        return av.bytes_value.hex()
    if which is None or depth >= MAX_DEPTH:
        return None
    if which == "array_value":
        return [_value(v, depth + 1) for v in av.array_value.values]
    return {kv.key: _value(kv.value, depth + 1) for kv in av.kvlist_value.values}


def _pick(attributes: Iterable[KeyValue], keys: dict[str, int]) -> list[Any] | None:
    """Plain values of the wanted keys by slot, or None when none is present."""
    vals: list[Any] | None = None
    for kv in attributes:
        slot = keys.get(kv.key)
        if slot is not None:
            if vals is None:
                vals = [None] * len(keys)
            vals[slot] = _value(kv.value)
    return vals


def _query_params(attributes: Iterable[KeyValue]) -> Iterator[tuple[str, Any]]:
    """``db.query.parameter.<key>`` attributes as (key, plain value)."""
    for kv in attributes:
        if kv.key.startswith(QUERY_PARAM):
            yield kv.key[len(QUERY_PARAM) :], _value(kv.value)


def _parse(msg: Any, data: bytes, opts: DecodeOptions) -> None:
    """Bounds-check ``data`` and parse it into ``msg``."""
    if not data:
        raise DecodeError("empty_value", "empty message value")
    if len(data) > opts.max_message_bytes:
        raise DecodeError("oversize_message", f"{len(data)} bytes > {opts.max_message_bytes}")
    try:
        msg.ParseFromString(data)
    except _ProtoDecodeError as exc:
        raise DecodeError("otlp_proto_invalid", str(exc)) from exc


def _bad_id(what: str, value: bytes) -> DecodeError:
    return DecodeError("otlp_invalid_id", f"{what} has {len(value)} bytes: {value[:32].hex()}")


def _lite_pool() -> Any:
    """``TracesData`` with each span kept as its bytes: a cheap second parse that sizes every span (and reads a
    message whose spans upb cannot all parse, one by one: ``_salvage``)."""
    fd = descriptor_pb2.FileDescriptorProto(name="trace_repro_lite_traces.proto", package="trace_repro_lite")
    field = descriptor_pb2.FieldDescriptorProto
    for name, number, kind, type_name in (
        ("TracesData", 1, field.TYPE_MESSAGE, ".trace_repro_lite.ResourceSpans"),
        ("ResourceSpans", 2, field.TYPE_MESSAGE, ".trace_repro_lite.ScopeSpans"),
        ("ScopeSpans", 2, field.TYPE_BYTES, ""),
    ):
        message = fd.message_type.add(name=name)
        f = message.field.add(name="items", number=number, type=kind)
        f.label = field.LABEL_REPEATED
        if type_name:
            f.type_name = type_name
        if name == "ResourceSpans":  # the Resource, as its bytes too (read again by ``_salvage``)
            message.field.add(name="resource", number=1, type=field.TYPE_BYTES, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("trace_repro_lite.TracesData"))


_SizedTraces = _lite_pool()


def _salvage(data: bytes, stats: DecodeStats | None) -> tuple[Any, bytes] | None:
    """A ``TracesData`` (and its bytes) of the spans of ``data`` that parse one by one, when upb refused the message
    whole; None when its framing does not hold either. A span (or a resource) upb cannot parse is left out and
    counted (``unreadable_spans``): nested deeper than upb's depth limit (the collector's is far higher) or holding a
    string that is not UTF-8. The other spans of the message are kept, as with any other hostile value."""
    try:
        lite = _SizedTraces.FromString(data)
    except _ProtoDecodeError:
        return None
    msg, unreadable = TracesData(), 0
    for lite_rs in lite.items:
        rs = msg.resource_spans.add()
        try:
            rs.resource.MergeFromString(lite_rs.resource)
        except _ProtoDecodeError:
            rs.ClearField("resource")  # its spans are kept, with no service
            unreadable += 1
        for lite_ss in lite_rs.items:
            spans = rs.scope_spans.add().spans
            for raw in lite_ss.items:
                try:
                    spans.add().MergeFromString(raw)  # upb's depth limit counts from the span
                except _ProtoDecodeError:
                    del spans[-1]
                    unreadable += 1
    if stats is not None:
        stats.unreadable_spans += unreadable
    return msg, bytes(msg.SerializeToString())


def _span_detail(ext: Extractor, sp: Any) -> SpanDetail:
    """The attribute- and event-derived fields of the upb ``Span`` ``sp`` (only the kept keys are read)."""
    keys, quarter, clip = ext.keys, ext.quarter, ext.clip
    vals: list[Any] | None = None
    for kv in sp.attributes:
        slot = keys.get(kv.key)
        if slot is not None:
            if vals is None:
                vals = [None] * SPAN_SLOTS
            av = kv.value
            v = av.string_value or _value(av)  # bytes become hex text, twice their size: clipped too
            if slot in TEXT_SLOTS and av.WhichOneof("value") == "bytes_value":
                v = av.bytes_value.decode("utf-8", "replace")  # psycopg2's execute_values sends its SQL as bytes
            if type(v) is str:  # the few routes, functions, files and statements: one copy each, not one a span
                v = clip(v) if len(v) > quarter else intern(v) if slot in INTERNED_SLOTS else v
            vals[slot] = v
    fields = NO_FIELDS if vals is None else ext.span_fields(vals)
    db = ext.db_call(vals, _query_params(sp.attributes)) if vals and is_db(vals) else None
    exc_type = exc_message = exc_stack = ""
    events = sp.events
    if events:
        for ev in events:
            if ev.name == EXCEPTION_EVENT:
                exc = _pick(ev.attributes, EXCEPTION_KEYS)
                if exc is not None:
                    exc_type, exc_message, exc_stack = ext.text(exc[0]), ext.text(exc[1]), ext.text(exc[2])
                break
    pb_links = sp.links
    links = tuple([link.trace_id.hex() for link in pb_links]) if pb_links else ()
    trace_state = sp.trace_state
    if vals is None and not exc_type and not exc_stack and not links and not trace_state:
        return NO_DETAIL
    sampling = sampling_of(trace_state, vals)
    if db is None and not (exc_type or exc_message or exc_stack or links or fields[5]):  # a route, a code location:
        key = (*fields, sampling)  # the same few for most spans, one shared tuple each (open traces hold them all)
        shared = _SHARED_DETAILS.data.get(key)
        if shared is None:
            shared = _SHARED_DETAILS.put(key, SpanDetail(fields[0], fields[1], "", "", fields[2], fields[3], fields[4],
                                                         sampling=sampling))  # fmt: skip
        return shared
    return SpanDetail(
        fields[0],
        fields[1],
        exc_type,
        exc_message,
        fields[2],
        fields[3],
        fields[4],
        db,
        links,
        fields[5],
        exc_stack,
        sampling,
    )


K = TypeVar("K")
V = TypeVar("V")


class _Shared(Generic[K, V]):
    """Decoded values that many spans share (a service's resource, a route's detail): one object each, so that
    open traces hold one copy and a message skips their decoding. At most ``bound`` entries, then it starts again
    (a reset is counted: ``dropped{component=decode, reason=shared_cache_reset}``, see :func:`shared_resets`)."""

    __slots__ = ("bound", "data", "resets")

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.data: dict[K, V] = {}
        self.resets = 0

    def put(self, key: K, value: V) -> V:
        if len(self.data) >= self.bound:
            self.data.clear()
            self.resets += 1
        self.data[key] = value
        return value


SHARED_DETAILS = 4096  # distinct details shared at most (then the cache starts again)
SHARED_RESOURCES = 1024  # distinct resources (by their encoded bytes and the attribute bound)
_SHARED_DETAILS: _Shared[tuple[Any, ...], SpanDetail] = _Shared(SHARED_DETAILS)
_RESOURCES: _Shared[tuple[int, bytes], Resource] = _Shared(SHARED_RESOURCES)


def shared_resets() -> int:
    """How many times the shared-value caches of this process started again (a monotonic count)."""
    return _SHARED_DETAILS.resets + _RESOURCES.resets


def _resource(ext: Extractor, pb: Any) -> Resource:
    """The ``Resource`` of the upb resource ``pb``: each distinct one decoded once (and shared) unless decoding it
    cut a value, so a cut is counted for every message that carries it, as without the cache."""
    key = (ext.limit, pb.SerializeToString())
    resource = _RESOURCES.data.get(key)
    if resource is None:
        stats = ext.stats
        cut = 0 if stats is None else stats.truncated_attributes
        resource = ext.resource(_pick(pb.attributes, RESOURCE_KEYS))
        if stats is None or stats.truncated_attributes == cut:
            _RESOURCES.put(key, resource)
    return resource


class _ProtoDetail:
    """``SpanDetailReader`` of spans decoded here: reads a kept upb ``Span`` on first use.

    Only spans too small to hold a value that ``clip`` would cut are read lazily (see ``decode_traces_proto``),
    so a late read never counts a truncation nor refuses anything: it gives what an eager read would have.
    """

    __slots__ = ("ext",)

    def __init__(self, opts: DecodeOptions) -> None:
        self.ext = Extractor(opts, None)

    def span_detail(self, source: Any) -> SpanDetail:
        return _span_detail(self.ext, source)


@functools.lru_cache(maxsize=16)
def _reader(opts: DecodeOptions) -> _ProtoDetail:
    return _ProtoDetail(opts)


# A value read from a span's attributes or events takes at most this many times the span's encoded size as text
# (a control character inside a string in an array: 1 byte on the wire, 6 as JSON), plus a little.
_TEXT_PER_BYTE = 8
_TEXT_SLACK = 16


def decode_traces_proto(
    data: bytes, opts: DecodeOptions = DEFAULT_OPTIONS, stats: DecodeStats | None = None
) -> list[Span]:
    """Decode ``TracesData`` protobuf bytes (same bytes as ``ExportTraceServiceRequest``) into spans.

    The whole message is parsed (and refused) here, span by span when upb refuses it whole (``_salvage``); each
    span's core fields are read here and the rest
    (``SpanDetail``: attributes by key, the exception event, links) on first use, from the kept upb span. A span
    whose encoded size could hold a value over ``max_attribute_bytes`` is read here instead, so truncations are
    counted in ``stats`` before this returns, exactly as an eager decoder counts them.
    """
    msg = TracesData()
    try:
        _parse(msg, data, opts)
    except DecodeError as exc:
        salvaged = _salvage(data, stats) if exc.reason == "otlp_proto_invalid" else None
        if salvaged is None:
            raise
        msg, data = salvaged
    ext = Extractor(opts, stats)
    reader = _reader(opts)
    small = (opts.max_attribute_bytes - _TEXT_SLACK) // _TEXT_PER_BYTE  # a span of this many bytes is read lazily
    sized = _SizedTraces.FromString(data).items if len(data) > small else None
    kinds, statuses, unspecified, unset, quarter = KINDS, STATUSES, SpanKind.UNSPECIFIED, StatusCode.UNSET, ext.quarter
    hexed: dict[bytes, str] = {}  # trace and span id → hex, once per message
    out: list[Span] = []
    append = out.append
    for i, rs in enumerate(msg.resource_spans):
        resource = _resource(ext, rs.resource)
        for j, ss in enumerate(rs.scope_spans):
            raw_spans = None if sized is None else sized[i].items[j].items
            eager = raw_spans is not None and max(map(len, raw_spans), default=0) > small
            for k, sp in enumerate(ss.spans):
                trace_id, span_id, parent_id = sp.trace_id, sp.span_id, sp.parent_span_id
                if len(trace_id) != 16:
                    raise _bad_id("trace_id", trace_id)
                if len(span_id) != 8:
                    raise _bad_id("span_id", span_id)
                if parent_id and len(parent_id) != 8:
                    raise _bad_id("parent_span_id", parent_id)
                if sp.links:
                    for link in sp.links:
                        if len(link.trace_id) != 16:
                            raise _bad_id("link trace_id", link.trace_id)
                trace_hex = hexed.get(trace_id)
                if trace_hex is None:
                    trace_hex = hexed[trace_id] = trace_id.hex()
                name = sp.name
                name = ext.clip(name) if len(name) > quarter else intern(name)  # a few names, each span's copy kept
                span_hex = hexed.get(span_id)  # a parent's id is its children's parent id: one string for both
                if span_hex is None:
                    span_hex = hexed[span_id] = span_id.hex()
                parent_hex = hexed.get(parent_id) if parent_id else ""
                if parent_hex is None:
                    parent_hex = hexed[parent_id] = parent_id.hex()
                core = (
                    trace_hex,
                    span_hex,
                    parent_hex,
                    name,
                    kinds.get(sp.kind, unspecified),
                    sp.start_time_unix_nano,
                    sp.end_time_unix_nano,
                    statuses.get(sp.status.code, unset),
                    resource,
                )
                if eager and raw_spans is not None and len(raw_spans[k]) > small:
                    append(Span(*core, **_as_kwargs(_span_detail(ext, sp))))
                else:
                    append(lazy_span(*core, reader, sp))
    if stats is not None:
        stats.spans += len(out)
    return out


def _as_kwargs(detail: SpanDetail) -> dict[str, Any]:
    return {f: getattr(detail, f) for f in DETAIL_FIELDS}


def decode_logs_proto(
    data: bytes, opts: DecodeOptions = DEFAULT_OPTIONS, stats: DecodeStats | None = None
) -> list[LogRecord]:
    """Decode ``LogsData`` protobuf bytes (same bytes as ``ExportLogsServiceRequest``) into log records."""
    msg = LogsData()
    _parse(msg, data, opts)
    ext = Extractor(opts, stats)
    text = ext.text
    out: list[LogRecord] = []
    for rl in msg.resource_logs:
        resource = _resource(ext, rl.resource)
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                trace_id, span_id = lr.trace_id, lr.span_id
                if trace_id and len(trace_id) != 16:
                    raise _bad_id("trace_id", trace_id)
                if span_id and len(span_id) != 8:
                    raise _bad_id("span_id", span_id)
                attrs = _pick(lr.attributes, LOG_KEYS) or [None, None]
                out.append(
                    LogRecord(
                        time_ns=lr.time_unix_nano or lr.observed_time_unix_nano,
                        resource=resource,
                        severity_number=lr.severity_number,
                        severity_text=text(lr.severity_text),
                        body=text(_value(lr.body)),
                        event_name=text(lr.event_name or attrs[0]),
                        trace_id=trace_id.hex(),
                        span_id=span_id.hex(),
                        exception_type=text(attrs[1]),
                    )
                )
    if stats is not None:
        stats.log_records += len(out)
    return out
