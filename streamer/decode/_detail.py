"""A span's ``SpanDetail`` (its attribute- and event-derived fields), read from its ``DetailSpan`` (its attributes,
events and links as their bytes, ``streamer.decode._lite``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from sys import intern
from typing import Any, cast

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from processors.model.span import NO_DETAIL, SpanDetail
from streamer.decode._attrs import (
    EXCEPTION_EVENT,
    EXCEPTION_KEYS,
    INTERNED_SLOTS,
    MAX_DEPTH,
    NO_FIELDS,
    OWN_SLOTS,
    QUERY_PARAM,
    SPAN_SLOTS,
    TEXT_SLOTS,
    DecodeOptions,
    DecodeStats,
    Extractor,
    is_db,
    sampling_of,
)
from streamer.decode._lite import KEPT_ATTRIBUTE_BYTES as _KEPT_BYTES
from streamer.decode._lite import KeptAttributes, Shared, skipped

# A value read from a span's attributes or events takes at most this many times the span's encoded size as text
# (a control character inside a string in an array: 1 byte on the wire, 6 as JSON), plus a little.
TEXT_PER_BYTE = 8
TEXT_SLACK = 16


def value_of(av: AnyValue, depth: int = 0) -> Any:
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
        return [value_of(v, depth + 1) for v in av.array_value.values]
    return {kv.key: value_of(kv.value, depth + 1) for kv in av.kvlist_value.values}


def pick(attributes: Iterable[KeyValue], keys: dict[str, int]) -> list[Any] | None:
    """Plain values of the wanted keys by slot, or None when none is present."""
    vals: list[Any] | None = None
    for kv in attributes:
        slot = keys.get(kv.key)
        if slot is not None:
            if vals is None:
                vals = [None] * len(keys)
            vals[slot] = value_of(kv.value)
    return vals


_QUERY_PARAM = QUERY_PARAM.encode()


def _query_params(attributes: Iterable[bytes]) -> Iterator[tuple[str, Any]]:
    """``db.query.parameter.<key>`` attributes (each encoded) as (key, plain value)."""
    for raw in attributes:
        if _QUERY_PARAM in raw:  # only such a key's KeyValue holds these bytes
            kv = KeyValue.FromString(raw)
            if kv.key.startswith(QUERY_PARAM):
                yield kv.key[len(QUERY_PARAM) :], value_of(kv.value)


class SpanExtractor(Extractor):
    """An ``Extractor`` with its options' ``KeptAttributes``."""

    __slots__ = ("kept",)

    def __init__(self, opts: DecodeOptions, stats: DecodeStats | None, kept: KeptAttributes) -> None:
        Extractor.__init__(self, opts, stats)
        self.kept = kept

    def with_stats(self, stats: DecodeStats | None) -> SpanExtractor:
        """This extractor counting into ``stats`` (a message's): its options' tables not looked up again."""
        ext = SpanExtractor.__new__(SpanExtractor)
        ext.keys, ext.limit, ext.quarter, ext.stats, ext.kept = self.keys, self.limit, self.quarter, stats, self.kept
        return ext


SHARED_DETAILS = 4096  # distinct details shared at most (then the cache starts again)
_SHARED_DETAILS: Shared[tuple[Any, ...], SpanDetail] = Shared(SHARED_DETAILS)


def _attribute(ext: SpanExtractor, raw: bytes) -> tuple[int, Any] | None:
    """(slot, value) of the encoded ``KeyValue`` ``raw`` when its key is kept, else None; kept for the next span
    that carries the same bytes when its value was not clipped and is neither a list, a dict nor one a span's own
    (parameters, transaction ids, row versions, idempotency keys)."""
    kv = KeyValue.FromString(raw)  # parses: upb parsed it already, as a part of the whole message
    slot = ext.keys.get(kv.key)
    if slot is None:
        return None
    v, whole = _keptvalue_of(ext, slot, kv.value)
    hit = (slot, v)
    if whole and len(raw) <= _KEPT_BYTES and slot not in OWN_SLOTS and type(v) is not list and type(v) is not dict:
        ext.kept.values.put(raw, hit)
    return hit


def _keptvalue_of(ext: Extractor, slot: int, av: AnyValue) -> tuple[Any, bool]:
    """The value of a kept attribute for its slot, and whether it was not clipped."""
    v = av.string_value or value_of(av)  # bytes become hex text, twice their size: clipped too
    if slot in TEXT_SLOTS and av.WhichOneof("value") == "bytes_value":
        v = av.bytes_value.decode("utf-8", "replace")  # psycopg2's execute_values sends its SQL as bytes
    if type(v) is str:  # the few routes, functions, files and statements: one copy each, not one a span
        if len(v) > ext.quarter:
            return ext.clip(v), False  # a cut is counted for each span: never kept
        if slot in INTERNED_SLOTS:
            v = intern(v)
    return v, True


def span_detail(ext: SpanExtractor, sp: Any, links: list[bytes] | None = None) -> SpanDetail:
    """The attribute- and event-derived fields of the ``DetailSpan`` ``sp``: attributes read from their bytes, only
    those of a kept key (``_attribute``), each distinct one once; a span of no events, links nor trace state whose
    kept attributes (byte for byte) an earlier span had, and that detail shared, is given that detail, and so, in
    one lookup, is one whose attributes (all of them, byte for byte, in order) an earlier such span had when each
    was known then (``KeptAttributes.spans``). ``links``: its links as their bytes, when read already."""
    kept = ext.kept
    attributes = tuple(sp.attributes[:])  # one bytes object each, its hash computed once for every lookup below
    if links is None:  # (a slice of a repeated field is made faster than its items one by one)
        links = sp.links[:]
    plain = not sp.trace_state and not links and not sp.events
    if plain:
        whole = kept.spans.data.get(attributes)
        if whole is not None:
            return whole  # type: ignore[no-any-return]
    prefixes, known, skips = kept.prefixes, kept.values.data, kept.skipped
    seen, bound = skips.data, skips.bound
    parts: list[bytes] = []  # the kept attributes, as their bytes
    hits: list[tuple[int, Any]] = []
    fresh = False  # a kept attribute was read here, not known already
    new = False  # an attribute was not known (kept or skipped) already
    for kv in attributes:
        hit = known.get(kv)
        if hit is None:
            if kv in seen:
                continue
            new = True
            n = len(kv)  # skipped(kv, prefixes), spelt out for a key and a value of under 128 bytes each
            if n > 3 and kv[0] == 10 and (p := kv[1] + 2) < 130 and n > p + 1 and kv[p] == 18 and kv[p + 1] < 128:
                if n == p + 2 + kv[p + 1] and kv[:p] not in prefixes:
                    if n <= _KEPT_BYTES:  # known for the next span that carries it (KeptAttributes.skipped)
                        if len(seen) < bound:  # skips.put(kv, None), spelt out: most such are a URL's, once each
                            seen[kv] = None
                        else:
                            skips.put(kv, None)
                    continue
            elif skipped(kv, prefixes):
                if n <= _KEPT_BYTES:
                    skips.put(kv, None)
                continue
            hit = _attribute(ext, kv)
            if hit is None:
                continue
            fresh = True
        parts.append(kv)
        hits.append(hit)
    same: tuple[bytes, ...] | None = None  # the kept attributes, when each was known
    if plain:
        if not parts:
            if not new:
                _whole(kept, attributes, NO_DETAIL)
            return NO_DETAIL
        if not fresh:
            same = tuple(parts)
            known_detail = kept.details.data.get(same)  # a DB call's: unless query parameters (skipped) are given
            if known_detail is not None and (known_detail.db is None or _QUERY_PARAM not in b"".join(attributes)):
                if not new:
                    _whole(kept, attributes, known_detail)
                return known_detail  # type: ignore[no-any-return]
        return _detail_of(ext, hits, same, attributes, (), (), "")
    events = sp.events
    parsed = map(PbSpan.Event.FromString, events) if events else ()
    linked = tuple([PbSpan.Link.FromString(raw).trace_id.hex() for raw in links]) if links else ()
    return _detail_of(ext, hits, same, attributes, parsed, linked, sp.trace_state)


SPAN_KEY_BYTES = 1024  # a span's attributes in more bytes than this are not a key of ``KeptAttributes.spans``


def _whole(kept: KeptAttributes, attributes: tuple[bytes, ...], detail: SpanDetail) -> None:
    """Know ``detail`` as that of the next span of no events, links nor trace state with these ``attributes``."""
    if sum(map(len, attributes)) <= SPAN_KEY_BYTES:
        kept.spans.put(attributes, detail)


def _detail_of(ext: Extractor, hits: list[tuple[int, Any]], same: tuple[bytes, ...] | None,
               attributes: tuple[bytes, ...], events: Iterable[Any], links: tuple[str, ...],
               trace_state: str) -> SpanDetail:  # fmt: skip
    """A span's detail from its kept attributes' (slot, value)s, its attributes' bytes (for query parameters),
    events, links and trace state; shared when it holds only fields many spans have (and kept for its kept
    attributes' bytes ``same``)."""
    vals: list[Any] | None = None
    if hits:
        vals = [None] * SPAN_SLOTS
        for slot, v in hits:
            vals[slot] = v
    fields = NO_FIELDS if vals is None else ext.span_fields(vals)
    db = None
    if vals and is_db(vals):  # most DB spans have no db.query.parameter.*: one search for them all
        if _QUERY_PARAM in b"".join(attributes):
            db, same = ext.db_call(vals, _query_params(attributes)), None  # not a detail of its kept attributes
        else:
            db = ext.db_call(vals, ())
    exc_type = exc_message = exc_stack = ""
    for ev in events:
        if ev.name == EXCEPTION_EVENT:
            exc = pick(ev.attributes, EXCEPTION_KEYS)
            if exc is not None:
                exc_type, exc_message, exc_stack = ext.text(exc[0]), ext.text(exc[1]), ext.text(exc[2])
            break
    if vals is None and not exc_type and not exc_message and not exc_stack and not links and not trace_state:
        return NO_DETAIL
    sampling = sampling_of(trace_state, vals)
    if db is not None and same is not None:  # a DB call of no value of its own (``same``: none was read): kept
        detail = SpanDetail(fields[0], fields[1], "", "", fields[2], fields[3], fields[4], db, sampling=sampling)
        if sum(map(len, same)) <= (ext.limit - TEXT_SLACK) // TEXT_PER_BYTE:  # none cut
            cast(SpanExtractor, ext).kept.details.put(same, detail)  # for the next span of these kept attributes
        return detail
    if db is None and not (exc_type or exc_message or exc_stack or links or fields[5]):  # a route, a code location:
        key = (*fields, sampling)  # the same few for most spans, one shared tuple each (open traces hold them all)
        shared = _SHARED_DETAILS.data.get(key)
        if shared is None:
            shared = _SHARED_DETAILS.put(key, SpanDetail(fields[0], fields[1], "", "", fields[2], fields[3], fields[4],
                                                         sampling=sampling))  # fmt: skip
        if same is not None and sum(map(len, same)) <= (ext.limit - TEXT_SLACK) // TEXT_PER_BYTE:  # none cut
            cast(SpanExtractor, ext).kept.details.put(same, shared)  # a DetailSpan's: see span_detail
        return shared
    return SpanDetail(fields[0], fields[1], exc_type, exc_message, fields[2], fields[3], fields[4], db, links,
                      fields[5], exc_stack, sampling)  # fmt: skip
