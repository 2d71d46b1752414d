"""The span event: its core fields set by the decoder, its attribute-derived detail read on first use.

Decoders build spans with :func:`read_span` (the detail read as the span is decoded), with :func:`lazy_span` (a
:class:`LazySpan`: the detail read from the kept protobuf span the first time it or any detail field is accessed) or
with ``Span(...)`` (everything given). A ``Span``'s ``detail`` is a plain slot, read as fast as a core field; a lazy
span becomes a ``Span`` once its detail is read. A span is immutable, hashable and compares by all of its fields,
like the frozen dataclasses of :mod:`processors.model.events`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import FrozenInstanceError
from typing import Any, NamedTuple, Protocol, cast

from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.sampling import UNKNOWN, Sampling


class SpanDetail(NamedTuple):
    """The attribute- and event-derived fields of a ``Span``: what decoders may read on first use.

    A named tuple, not a dataclass: a lazily read span makes one on first use, and a tuple is made in a tenth
    of the time of a frozen dataclass."""

    route: str = ""  # http.route
    http_status: int = 0  # http.response.status_code / http.status_code
    exception_type: str = ""  # first exception event's exception.type
    exception_message: str = ""
    code_function: str = ""  # code.function.name / code.function
    code_file: str = ""  # code.file.path / code.filepath
    code_line: int = 0  # code.line.number / code.lineno
    db: DbCall | None = None
    links: tuple[str, ...] = ()  # trace ids this span links to
    idempotency_key: str = ""  # configured attribute, e.g. app.idempotency_key
    exception_stacktrace: str = ""  # first exception event's exception.stacktrace (where no code.* is sent)
    sampling: Sampling = UNKNOWN  # tracestate ``ot=th:`` / Jaeger sampler attributes (processors.model.sampling)


NO_DETAIL = SpanDetail()


class SpanDetailReader(Protocol):
    """Reads a span's ``SpanDetail`` from what its decoder kept of the wire message (``source``)."""

    def span_detail(self, source: Any) -> SpanDetail: ...


_CORE = ("trace_id", "span_id", "parent_id", "name", "kind", "start_ns", "end_ns", "status", "resource")
_DETAIL: tuple[str, ...] = SpanDetail._fields
DETAIL_FIELDS = _DETAIL  # SpanDetail's field names, in order
_ERROR = StatusCode.ERROR


class _SpanSlots:
    __slots__ = (*_CORE, "detail", "_reader", "_source")

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: SpanKind
    start_ns: int
    end_ns: int
    status: StatusCode
    resource: Resource
    detail: SpanDetail  # (unset, None, in a LazySpan until it is read)
    _reader: SpanDetailReader | None
    _source: Any


def _read(span: Span) -> SpanDetail:
    """A lazy span's detail, read by its reader and kept; the span is a ``Span`` from then on (its ``detail`` the
    slot) and no longer holds the wire message. What the reader raises leaves the span as it was."""
    reader = span._reader
    assert reader is not None
    detail = reader.span_detail(span._source)
    _set_detail(span, detail)
    _set_source(span, None)
    object.__setattr__(span, "__class__", Span)  # (same slots: LazySpan adds none)
    return detail


# The slots' own setters, which Span.__setattr__ (frozen) does not see.
_set_detail: Callable[[Span, SpanDetail], None] = _SpanSlots.__dict__["detail"].__set__
_set_source: Callable[[Span, Any], None] = _SpanSlots.__dict__["_source"].__set__
_set_trace_id: Callable[[Span, str], None] = _SpanSlots.__dict__["trace_id"].__set__


def share_trace_id(span: Span, trace_id: str) -> None:
    """``span`` holds ``trace_id``, a string equal to its own trace id (it compares and hashes the same): the spans
    of a trace that came in several messages then hold one copy of it, not one a message."""
    if trace_id != span.trace_id:
        raise ValueError(f"{trace_id!r} is not the trace id of {span.span_id!r}")
    _set_trace_id(span, trace_id)


class Span(_SpanSlots):
    """One decoded OTLP span, with only the fields the processors need; frozen.

    The core fields are set when the span is made; the attribute- and event-derived ones (``route`` ...
    ``idempotency_key``, see ``SpanDetail``) may be read by the decoder on first use (``lazy_span``), once.
    Equality, hashing and ``repr`` cover every field, as for a frozen dataclass.
    """

    __slots__ = ()
    __match_args__ = (
        "trace_id", "span_id", "parent_id", "name", "kind", "start_ns", "end_ns", "status", "resource", "route",
        "http_status", "exception_type", "exception_message", "code_function", "code_file", "code_line", "db",
        "links", "idempotency_key", "exception_stacktrace", "sampling",
    )  # fmt: skip

    def __init__(
        self,
        trace_id: str,  # 32 lowercase hex
        span_id: str,  # 16 lowercase hex
        parent_id: str,  # "" for a root span
        name: str,
        kind: SpanKind,
        start_ns: int,
        end_ns: int,
        status: StatusCode,
        resource: Resource,
        route: str = "",
        http_status: int = 0,
        exception_type: str = "",
        exception_message: str = "",
        code_function: str = "",
        code_file: str = "",
        code_line: int = 0,
        db: DbCall | None = None,
        links: tuple[str, ...] = (),
        idempotency_key: str = "",
        exception_stacktrace: str = "",
        sampling: Sampling = UNKNOWN,
    ) -> None:
        detail = SpanDetail(
            route, http_status, exception_type, exception_message, code_function, code_file, code_line, db, links,
            idempotency_key, exception_stacktrace, sampling,
        )  # fmt: skip
        values = (trace_id, span_id, parent_id, name, kind, start_ns, end_ns, status, resource, detail, None, None)
        for slot, value in zip(_SpanSlots.__slots__, values, strict=True):
            object.__setattr__(self, slot, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    # ``detail`` is a slot: the attribute- and event-derived fields (``LazySpan`` reads it on first use). Each field
    # below is a property of it; a loop over many spans reads ``span.detail`` once and its fields from that. (No
    # ``__getattr__`` fallback: a class with one loses the interpreter's fast attribute reads for every field of
    # every span.)
    @property
    def route(self) -> str:
        return self.detail.route

    @property
    def http_status(self) -> int:
        return self.detail.http_status

    @property
    def exception_type(self) -> str:
        return self.detail.exception_type

    @property
    def exception_message(self) -> str:
        return self.detail.exception_message

    @property
    def code_function(self) -> str:
        return self.detail.code_function

    @property
    def code_file(self) -> str:
        return self.detail.code_file

    @property
    def code_line(self) -> int:
        return self.detail.code_line

    @property
    def db(self) -> DbCall | None:
        return self.detail.db

    @property
    def links(self) -> tuple[str, ...]:
        return self.detail.links

    @property
    def idempotency_key(self) -> str:
        return self.detail.idempotency_key

    @property
    def exception_stacktrace(self) -> str:
        return self.detail.exception_stacktrace

    @property
    def sampling(self) -> Sampling:
        return self.detail.sampling

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def is_error(self) -> bool:
        return self.status == _ERROR

    def _key(self) -> tuple[Any, ...]:
        return (self.trace_id, self.span_id, self.parent_id, self.name, self.kind, self.start_ns, self.end_ns,
                self.status, self.resource, self.detail)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Span):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        detail = self.detail
        parts = [f"{n}={getattr(self, n)!r}" for n in _CORE] + [f"{n}={getattr(detail, n)!r}" for n in _DETAIL]
        return f"Span({', '.join(parts)})"

    def __reduce__(self) -> tuple[Any, ...]:
        detail = self.detail
        return Span, tuple(getattr(self, n) for n in _CORE) + tuple(getattr(detail, n) for n in _DETAIL)


class LazySpan(Span):
    """A ``Span`` whose detail is read from what its decoder kept (``lazy_span``) the first time ``detail`` or a
    detail field is read; it is a plain ``Span`` from then on (``_read``)."""

    __slots__ = ()

    @property
    def detail(self) -> SpanDetail:  # type: ignore[override]
        return _read(self)


class _SpanBuilder(_SpanSlots):
    """Fills the slots with plain stores, then becomes a ``Span`` (same layout): a frozen span at a fraction of
    the cost of ``Span.__init__`` (which must go through ``object.__setattr__`` once per slot). Made by calling
    the class (``read_span``): no function call around it."""

    __slots__ = ()

    def __init__(
        self,
        trace_id: str,
        span_id: str,
        parent_id: str,
        name: str,
        kind: SpanKind,
        start_ns: int,
        end_ns: int,
        status: StatusCode,
        resource: Resource,
        detail: SpanDetail | None,
        reader: SpanDetailReader | None = None,
        source: Any = None,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.name = name
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.status = status
        self.resource = resource
        self.detail = detail  # type: ignore[assignment]  # (None: read on first use, by a LazySpan)
        self._reader = reader
        self._source = source
        self.__class__ = Span if detail is not None else LazySpan  # type: ignore[assignment]


def lazy_span(
    trace_id: str,
    span_id: str,
    parent_id: str,
    name: str,
    kind: SpanKind,
    start_ns: int,
    end_ns: int,
    status: StatusCode,
    resource: Resource,
    reader: SpanDetailReader,
    source: Any,
) -> Span:
    """A ``LazySpan``: its ``SpanDetail`` ``reader.span_detail(source)`` makes on first use (decoders only: the
    reader must give the same result whenever it is called; what it raises, it raises at every read)."""
    return cast(Span, _SpanBuilder(trace_id, span_id, parent_id, name, kind, start_ns, end_ns, status, resource, None,
                                   reader, source))  # fmt: skip


# A ``Span`` of these core fields and its ``detail`` read already, made as ``lazy_span`` makes one:
# read_span(trace_id, span_id, parent_id, name, kind, start_ns, end_ns, status, resource, detail).
read_span: Callable[[str, str, str, str, SpanKind, int, int, StatusCode, Resource, SpanDetail], Span] = cast(
    Any, _SpanBuilder
)


def read_details(spans: Iterable[Span]) -> None:
    """Read the detail of ``spans`` now: a span kept for later (in an open trace) then no longer holds what its
    decoder kept of the wire message, which for protobuf is the whole message's parse (~3.5 times its bytes)."""
    for span in spans:
        if span.__class__ is LazySpan:
            _read(span)
