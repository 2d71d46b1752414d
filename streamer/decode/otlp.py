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
from typing import Any

from google.protobuf.message import DecodeError as _ProtoDecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
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
    OWN_SLOTS,
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
from streamer.decode._lite import KEPT_ATTRIBUTE_BYTES, DetailTraces, Shared, SizedTraces, kept_attributes, skipped
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


_QUERY_PARAM = QUERY_PARAM.encode()


def _query_params(attributes: Iterable[bytes]) -> Iterator[tuple[str, Any]]:
    """``db.query.parameter.<key>`` attributes (each encoded) as (key, plain value)."""
    for raw in attributes:
        if _QUERY_PARAM in raw:  # only such a key's KeyValue holds these bytes
            kv = KeyValue.FromString(raw)
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


def _salvage(data: bytes, stats: DecodeStats | None) -> tuple[Any, bytes] | None:
    """A ``TracesData`` (and its bytes) of the spans of ``data`` that parse one by one, when upb refused the message
    whole; None when its framing does not hold either. A span (or a resource) upb cannot parse is left out and
    counted (``unreadable_spans``): nested deeper than upb's depth limit (the collector's is far higher) or holding a
    string that is not UTF-8. The other spans of the message are kept, as with any other hostile value."""
    try:
        lite = SizedTraces.FromString(data)
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


def _attribute(ext: _Extractor, raw: bytes) -> tuple[int, Any] | None:
    """(slot, value) of the encoded ``KeyValue`` ``raw`` when its key is kept, else None; kept for the next span
    that carries the same bytes when its value was not clipped and is neither a list, a dict nor one a span's own
    (parameters, transaction ids, row versions, idempotency keys)."""
    kv = KeyValue.FromString(raw)  # parses: upb parsed it already, as a part of the whole message
    slot = ext.keys.get(kv.key)
    if slot is None:
        return None
    av = kv.value
    v = av.string_value or _value(av)  # bytes become hex text, twice their size: clipped too
    if slot in TEXT_SLOTS and av.WhichOneof("value") == "bytes_value":
        v = av.bytes_value.decode("utf-8", "replace")  # psycopg2's execute_values sends its SQL as bytes
    if type(v) is str:  # the few routes, functions, files and statements: one copy each, not one a span
        if len(v) > ext.quarter:
            return slot, ext.clip(v)  # a cut is counted for each span: never kept
        if slot in INTERNED_SLOTS:
            v = intern(v)
    hit = (slot, v)
    if len(raw) <= KEPT_ATTRIBUTE_BYTES and slot not in OWN_SLOTS and type(v) is not list and type(v) is not dict:
        ext.kept.values.put(raw, hit)
    return hit


def _span_detail(ext: _Extractor, sp: Any) -> SpanDetail:
    """The attribute- and event-derived fields of the ``DetailSpan`` ``sp``: attributes read from their bytes, only
    those of a kept key (``_attribute``), each distinct one once; a span of no events, links nor trace state whose
    kept attributes (byte for byte) an earlier span had, and that detail shared, is given that detail."""
    kept = ext.kept
    prefixes, known = kept.prefixes, kept.values.data
    events, pb_links, trace_state = sp.events, sp.links, sp.trace_state
    parts: list[bytes] = []  # the kept attributes, as their bytes
    hits: list[tuple[int, Any]] = []
    fresh = False  # an attribute was read here, not known already
    for kv in sp.attributes:
        hit = known.get(kv)
        if hit is None:
            n = len(kv)  # skipped(kv, prefixes), spelt out for a key and a value of under 128 bytes each
            if n > 3 and kv[0] == 10 and (p := kv[1] + 2) < 130 and n > p + 1 and kv[p] == 18 and kv[p + 1] < 128:
                if n == p + 2 + kv[p + 1] and kv[:p] not in prefixes:
                    continue
            elif skipped(kv, prefixes):
                continue
            hit = _attribute(ext, kv)
            if hit is None:
                continue
            fresh = True
        parts.append(kv)
        hits.append(hit)
    same: tuple[bytes, ...] | None = None  # the kept attributes, when each was known
    if not events and not pb_links and not trace_state:
        if not parts:
            return NO_DETAIL
        if not fresh:
            same = tuple(parts)
            known_detail = kept.details.data.get(same)
            if known_detail is not None:
                return known_detail  # type: ignore[no-any-return]
    vals: list[Any] | None = None
    if hits:
        vals = [None] * SPAN_SLOTS
        for slot, v in hits:
            vals[slot] = v
    fields = NO_FIELDS if vals is None else ext.span_fields(vals)
    db = ext.db_call(vals, _query_params(sp.attributes)) if vals and is_db(vals) else None
    exc_type = exc_message = exc_stack = ""
    if events:
        for raw in events:
            ev = PbSpan.Event.FromString(raw)
            if ev.name == EXCEPTION_EVENT:
                exc = _pick(ev.attributes, EXCEPTION_KEYS)
                if exc is not None:
                    exc_type, exc_message, exc_stack = ext.text(exc[0]), ext.text(exc[1]), ext.text(exc[2])
                break
    links = tuple([PbSpan.Link.FromString(raw).trace_id.hex() for raw in pb_links]) if pb_links else ()
    if vals is None and not exc_type and not exc_stack and not links and not trace_state:
        return NO_DETAIL
    sampling = sampling_of(trace_state, vals)
    if db is None and not (exc_type or exc_message or exc_stack or links or fields[5]):  # a route, a code location:
        key = (*fields, sampling)  # the same few for most spans, one shared tuple each (open traces hold them all)
        shared = _SHARED_DETAILS.data.get(key)
        if shared is None:
            shared = _SHARED_DETAILS.put(key, SpanDetail(fields[0], fields[1], "", "", fields[2], fields[3], fields[4],
                                                         sampling=sampling))  # fmt: skip
        if same is not None and sum(map(len, same)) <= (ext.limit - _TEXT_SLACK) // _TEXT_PER_BYTE:  # none cut
            kept.details.put(same, shared)
        return shared
    return SpanDetail(fields[0], fields[1], exc_type, exc_message, fields[2], fields[3], fields[4], db, links,
                      fields[5], exc_stack, sampling)  # fmt: skip


SHARED_DETAILS = 4096  # distinct details shared at most (then the cache starts again)
SHARED_RESOURCES = 1024  # distinct resources (by their encoded bytes and the attribute bound)
_SHARED_DETAILS: Shared[tuple[Any, ...], SpanDetail] = Shared(SHARED_DETAILS)
_RESOURCES: Shared[tuple[int, bytes], Resource] = Shared(SHARED_RESOURCES)


def shared_resets() -> int:
    """How many times the shared-value caches of this process started again (a monotonic count)."""
    return Shared.total


class _Extractor(Extractor):
    __slots__ = ("kept",)

    def __init__(self, opts: DecodeOptions, stats: DecodeStats | None) -> None:
        super().__init__(opts, stats)
        self.kept = kept_attributes(opts)


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
        self.ext = _Extractor(opts, None)

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
    ext = _Extractor(opts, stats)
    reader = _reader(opts)
    detail = DetailTraces.FromString(data).items  # each span's attributes, events and links as their bytes
    small = (opts.max_attribute_bytes - _TEXT_SLACK) // _TEXT_PER_BYTE  # a span of this many bytes is read lazily
    sized = SizedTraces.FromString(data).items if len(data) > small else None
    kinds, statuses, unspecified, unset, quarter = KINDS, STATUSES, SpanKind.UNSPECIFIED, StatusCode.UNSET, ext.quarter
    hexed: dict[bytes, str] = {}  # trace and span id → hex, once per message
    out: list[Span] = []
    append = out.append
    for i, rs in enumerate(msg.resource_spans):
        resource = _resource(ext, rs.resource)
        for j, ss in enumerate(rs.scope_spans):
            raw_spans = None if sized is None else sized[i].items[j].items
            eager = raw_spans is not None and max(map(len, raw_spans), default=0) > small
            for k, (sp, lite) in enumerate(zip(ss.spans, detail[i].items[j].items, strict=True)):
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
                    append(Span(*core, **_as_kwargs(_span_detail(ext, lite))))
                else:
                    append(lazy_span(*core, reader, lite))
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
