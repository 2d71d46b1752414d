"""OTLP traces and logs → ``Span`` / ``LogRecord`` events: protobuf here, the collector's ``otlp_json`` in
``streamer.decode.otlp_json`` (re-exported).

Hot path: a span's core fields (ids, name, kind, times, status) and its attributes and events are read when it is
decoded (``streamer.decode._detail``; a span whose detail raises then is left to be read on first use,
``processors.model.span.lazy_span``), both from a lite parse of the message (``streamer.decode._lite``): an
attribute is skipped by its encoded key alone, a kept one read once for all spans that carry it byte for byte.
A ``db.statement.parameters`` tuple repr is parsed without ``ast``.
"""

from __future__ import annotations

import functools
from sys import intern
from typing import Any

from google.protobuf.message import DecodeError as _ProtoDecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from processors.model.events import LogRecord, Resource, SpanKind, StatusCode
from processors.model.span import DETAIL_FIELDS, Span, SpanDetail, lazy_span, read_span
from streamer.decode._attrs import (
    DEFAULT_OPTIONS,
    KINDS,
    LOG_KEYS,
    RESOURCE_KEYS,
    STATUSES,
    DecodeOptions,
    DecodeStats,
    Extractor,
)
from streamer.decode._detail import TEXT_PER_BYTE, TEXT_SLACK, SpanExtractor
from streamer.decode._detail import pick as _pick
from streamer.decode._detail import span_detail as _span_detail
from streamer.decode._detail import value_of as _value
from streamer.decode._lite import (
    CheckTraces,
    DetailTraces,
    ScopedTraces,
    Shared,
    SizedScope,
    SizedTraces,
    kept_attributes,
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


def _parse(cls: Any, data: bytes, opts: DecodeOptions) -> Any:
    """Bounds-check ``data`` and parse it as a message of the class ``cls``."""
    if not data:
        raise DecodeError("empty_value", "empty message value")
    if len(data) > opts.max_message_bytes:
        raise DecodeError("oversize_message", f"{len(data)} bytes > {opts.max_message_bytes}")
    try:
        return cls.FromString(data)
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


SHARED_RESOURCES = 1024  # distinct resources (by their encoded bytes and the attribute bound)
_RESOURCES: Shared[tuple[int, bytes], Resource] = Shared(SHARED_RESOURCES)


def shared_resets() -> int:
    """How many times the shared-value caches of this process started again (a monotonic count)."""
    return Shared.total


CHECKED_RESOURCES = 1024  # distinct resources known to parse (by their encoded bytes), then the set starts again
_CHECKED: Shared[bytes, None] = Shared(CHECKED_RESOURCES)  # (a reset counted, as every Shared's)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 127:
        out.append(n & 127 | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _checked(items: Any) -> list[bytes]:
    """The encoded resource of each ``DetailResourceSpans`` of ``items`` (given as its ``resources``: each time the
    field is given), once each piece has parsed as upb's parse of the whole message would have parsed it
    (``CheckTraces`` left it unchecked), else raise otlp_proto_invalid as that parse would have. upb parses each
    piece at the same depth and merges them (as their concatenation parses): each piece is parsed once as a part of
    a ``TracesData``, so at the depth it has in the message; one that parsed is not parsed again. One that did not
    is parsed again each time it comes: it is refused (salvaged) each time, as before."""
    checked, out = _CHECKED.data, []
    for rs in items:
        pieces = rs.resources[:]
        if len(pieces) == 1 and pieces[0] in checked:  # nearly always: one piece, known to parse
            out.append(pieces[0])
            continue
        joined = b""
        for encoded in pieces:
            if encoded not in checked:
                framed = b"\n" + _varint(len(encoded)) + encoded  # ResourceSpans.resource
                try:
                    TracesData.FromString(b"\n" + _varint(len(framed)) + framed)
                except _ProtoDecodeError as exc:
                    raise DecodeError("otlp_proto_invalid", str(exc)) from exc
                _CHECKED.put(encoded, None)
            joined = joined + encoded if joined else encoded  # one piece (nearly always): no copy
        out.append(joined)
    return out


def _resource(ext: Extractor, encoded: bytes, pb: Any = None) -> Resource:
    """The ``Resource`` of the encoded resource ``encoded`` (``pb``: upb's parse of it, when at hand): each distinct
    one decoded once (and shared) unless decoding it cut a value, so a cut is counted for every message that carries
    it, as without the cache."""
    key = (ext.limit, encoded)
    resource = _RESOURCES.data.get(key)
    if resource is None:
        stats = ext.stats
        cut = 0 if stats is None else stats.truncated_attributes
        if pb is None:
            pb = PbResource.FromString(encoded)  # upb checked it, as a part of the whole message
        resource = ext.resource(_pick(pb.attributes, RESOURCE_KEYS))
        if stats is None or stats.truncated_attributes == cut:
            _RESOURCES.put(key, resource)
    return resource


class _ProtoDetail:
    """``SpanDetailReader`` of spans decoded here: reads a kept ``DetailSpan`` on first use.

    Only spans too small to hold a value that ``clip`` would cut are read by it (see ``decode_traces_proto``),
    so a read never counts a truncation: it gives what an eager read would have.
    """

    __slots__ = ("ext",)

    def __init__(self, opts: DecodeOptions) -> None:
        self.ext = SpanExtractor(opts, None, kept_attributes(opts))

    def span_detail(self, source: Any) -> SpanDetail:
        return _span_detail(self.ext, source)


@functools.lru_cache(maxsize=16)
def _reader_of(opts: DecodeOptions) -> _ProtoDetail:
    return _ProtoDetail(opts)


_last: tuple[DecodeOptions, DecodeStats | None, _ProtoDetail, SpanExtractor] | None = None


def _extractor(opts: DecodeOptions, stats: DecodeStats | None) -> tuple[_ProtoDetail, SpanExtractor]:
    """The reader of ``opts`` and its extractor counting into ``stats``: the previous message's when its options
    and stats are the same objects (a traces decoder's are, ``streamer.decode.registry._Traces``), so a message
    neither hashes the options nor builds an extractor (bench/RESULTS.md)."""
    global _last
    last = _last
    if last is not None and last[0] is opts and last[1] is stats:
        return last[2], last[3]
    reader = _reader_of(opts)
    ext = reader.ext.with_stats(stats)
    _last = (opts, stats, reader, ext)
    return reader, ext


def decode_traces_proto(
    data: bytes, opts: DecodeOptions = DEFAULT_OPTIONS, stats: DecodeStats | None = None
) -> list[Span]:
    """Decode ``TracesData`` protobuf bytes (same bytes as ``ExportTraceServiceRequest``) into spans.

    The whole message is checked (and refused) by upb here, its resources once each (``CheckTraces``,
    ``_checked``), span by span when upb refuses it whole (``_salvage``), and read from a lite parse
    (``DetailTraces``: a one-trace message of the collector's kafka exporter decodes faster so than walking upb's
    objects). Each span's core fields and the rest (``SpanDetail``: attributes by key, the exception event, links)
    are read here, the rest from its ``DetailSpan`` (its attributes, events and links as their bytes): a stage reads
    every span's detail as its message comes (``read_details``), and a span made with its detail holds neither a
    reader nor the message's parse. A span too small to hold a value over ``max_attribute_bytes`` is read by the
    reader's extractor, which counts nothing (none is cut); one whose detail raises is left lazy (``lazy_span``),
    so that the stage refuses that span alone, as it reads it. A larger span is read with ``stats``, so truncations
    are counted before this returns, exactly as an eager decoder counts them (and what raises refuses the message).
    """
    try:
        _parse(CheckTraces, data, opts)  # checks the message but inside its resources: it is read from the lite
        items = DetailTraces.FromString(data).items  # parse, the resources checked there
        resources = _checked(items[:])
    except DecodeError as exc:
        salvaged = _salvage(data, stats) if exc.reason == "otlp_proto_invalid" else None
        if salvaged is None:
            raise
        data = salvaged[1]
        items = DetailTraces.FromString(data).items
        resources = [b"".join(rs.resources) for rs in items]  # each parsed on its own by _salvage
    reader, ext = _extractor(opts, stats)
    lazy_ext = reader.ext  # counts nothing: a small span's values are never cut
    small = (opts.max_attribute_bytes - TEXT_SLACK) // TEXT_PER_BYTE  # a span of this many bytes is read lazily
    scoped = ScopedTraces.FromString(data).items if len(data) > small else None
    kinds, statuses, unspecified, unset, quarter = KINDS, STATUSES, SpanKind.UNSPECIFIED, StatusCode.UNSET, ext.quarter
    hexed: dict[bytes, str] = {}  # trace and span id → hex, once per message
    out: list[Span] = []
    append = out.append
    for i, rs in enumerate(items[:]):  # a slice: a list of the items, made faster than iterating the container
        resource = _resource(ext, resources[i])
        for j, ss in enumerate(rs.items[:]):
            sizes = None  # each span's encoded size, when its scope is larger than a small span
            if scoped is not None and len(raw_scope := scoped[i].items[j]) > small:
                sizes = list(map(len, SizedScope.FromString(raw_scope).items[:]))
                if max(sizes, default=0) <= small:
                    sizes = None
            for k, sp in enumerate(ss.items[:]):
                trace_id, span_id, parent_id = sp.trace_id, sp.span_id, sp.parent_span_id
                if len(trace_id) != 16:
                    raise _bad_id("trace_id", trace_id)
                if len(span_id) != 8:
                    raise _bad_id("span_id", span_id)
                if parent_id and len(parent_id) != 8:
                    raise _bad_id("parent_span_id", parent_id)
                links = sp.links  # (as a slice, a list made faster than iterating it, when there are links)
                if links:
                    links = links[:]
                    for raw in links:
                        link_trace = PbSpan.Link.FromString(raw).trace_id
                        if len(link_trace) != 16:
                            raise _bad_id("link trace_id", link_trace)
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
                kind, status = kinds.get(sp.kind, unspecified), statuses.get(sp.status.code, unset)
                if sizes is not None and sizes[k] > small:
                    detail = _span_detail(ext, sp, links)
                    append(Span(trace_hex, span_hex, parent_hex, name, kind, sp.start_time_unix_nano,
                                sp.end_time_unix_nano, status, resource, **_as_kwargs(detail)))  # fmt: skip
                    continue
                try:  # as the stage would read it now (read_details), without its lazy slot and reader
                    detail = _span_detail(lazy_ext, sp, links)
                except Exception:  # read again, and refused, by the stage: the message's other spans are kept
                    append(lazy_span(trace_hex, span_hex, parent_hex, name, kind, sp.start_time_unix_nano,
                                     sp.end_time_unix_nano, status, resource, reader, sp))  # fmt: skip
                else:
                    append(read_span(trace_hex, span_hex, parent_hex, name, kind, sp.start_time_unix_nano,
                                     sp.end_time_unix_nano, status, resource, detail))  # fmt: skip
    if stats is not None:
        stats.spans += len(out)
    return out


def _as_kwargs(detail: SpanDetail) -> dict[str, Any]:
    return {f: getattr(detail, f) for f in DETAIL_FIELDS}


def decode_logs_proto(
    data: bytes, opts: DecodeOptions = DEFAULT_OPTIONS, stats: DecodeStats | None = None
) -> list[LogRecord]:
    """Decode ``LogsData`` protobuf bytes (same bytes as ``ExportLogsServiceRequest``) into log records."""
    msg = _parse(LogsData, data, opts)
    ext = Extractor(opts, stats)
    text = ext.text
    out: list[LogRecord] = []
    for rl in msg.resource_logs:
        resource = _resource(ext, rl.resource.SerializeToString(), rl.resource)
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
