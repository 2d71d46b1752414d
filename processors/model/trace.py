"""A closed trace: the spans of one trace, complete as far as event time can tell (stage 1 closes it).

Every closed trace is read by many processors (graph rows, accesses, CALLS, each detector), and most of them asked
the same questions of its spans: which span has which id, which is the root, which spans are DB or CLIENT spans,
whether any failed. ``ClosedTrace.facts`` answers them from one pass over the spans, made on first use and kept
with the trace (a trace is read and dropped: nothing holds a closed trace once its processors are done).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processors.model.events import SpanKind, StatusCode
from processors.model.sampling import UNKNOWN, Sampling
from processors.model.span import Span

_SERVER = SpanKind.SERVER
_CLIENT = SpanKind.CLIENT
_ERROR = StatusCode.ERROR


class TraceFacts:
    """What several processors read of one trace's spans, from one pass over them (lists keep the spans' order).

    ``by_id``: span id -> span (the last one, were an id there twice); ``unique``: no span id is there twice;
    ``root``: the first span without a parent, else the earliest (None: no spans); ``start_ns`` / ``end_ns``: the
    earliest start and latest end; ``error``: a span has status ERROR; ``exception``: the first exception type
    recorded; ``db``: the spans with a DB call; ``clients``: the CLIENT spans; ``requests``: the server spans and
    the spans without a parent (``processors.pipeline.requests``); ``servers``: the SERVER span under each parent
    span id (the last one); ``children``, ``by_end`` and ``sampling`` are made on first use (``sampling`` from the
    first span that states one, noted in the pass: every closed trace's sampling is read, and most spans state none).
    """

    __slots__ = ("_by_end", "_children", "_sampling", "_stated", "by_id", "clients", "db", "end_ns", "error",
                 "exception", "requests", "root", "servers", "spans", "start_ns", "unique")  # fmt: skip

    def __init__(self, spans: tuple[Span, ...]) -> None:
        self.spans = spans
        by_id: dict[str, Span] = {}
        servers: dict[str, Span] = {}
        db: list[Span] = []
        clients: list[Span] = []
        requests: list[Span] = []
        root: Span | None = None
        earliest = spans[0] if spans else None
        start_ns = end_ns = 0
        if earliest is not None:
            start_ns, end_ns = earliest.start_ns, earliest.end_ns
        error = False
        exception = ""
        stated: Sampling | None = None  # the first span's sampling that states one
        for s in spans:
            by_id[s.span_id] = s
            detail = s.detail
            kind = s.kind
            if s.start_ns < start_ns:
                earliest, start_ns = s, s.start_ns
            if s.end_ns > end_ns:
                end_ns = s.end_ns
            parent = s.parent_id
            if parent:
                if kind == _SERVER:
                    requests.append(s)
                    servers[parent] = s
                elif kind == _CLIENT:
                    clients.append(s)
            else:
                requests.append(s)
                if root is None:
                    root = s
                if kind == _CLIENT:
                    clients.append(s)
            if detail.db is not None:
                db.append(s)
            if s.status == _ERROR:
                error = True
            if not exception and detail.exception_type:
                exception = detail.exception_type
            if stated is None and detail.sampling.source:
                stated = detail.sampling
        self.by_id = by_id
        self.unique = len(by_id) == len(spans)
        self.root = root if root is not None else earliest
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.error = error
        self.exception = exception
        self.db = db
        self.clients = clients
        self.requests = requests
        self.servers = servers
        self._children: dict[str, list[Span]] | None = None
        self._by_end: dict[str, list[Span]] | None = None
        self._sampling: Sampling | None = None
        self._stated = stated

    @property
    def children(self) -> dict[str, list[Span]]:
        """Parent span id -> its child spans, in the trace's order (the spans without a parent under "")."""
        children = self._children
        if children is None:
            children = self._children = {}
            for s in self.spans:
                children.setdefault(s.parent_id, []).append(s)
        return children

    @property
    def by_end(self) -> dict[str, list[Span]]:
        """Parent span id -> its child spans, the latest end first (equal ends in the trace's order); spans without
        a parent are not there (what ``processors.pipeline.critical_path`` walks)."""
        by_end = self._by_end
        if by_end is None:
            by_end = self._by_end = {}
            for s in self.spans:
                if s.parent_id:
                    by_end.setdefault(s.parent_id, []).append(s)
            for kids in by_end.values():
                if len(kids) > 1:
                    kids.sort(key=_end, reverse=True)
        return by_end

    @property
    def sampling(self) -> Sampling:
        """The sampling the root span states, else the first span's that states one, else unknown."""
        sampling = self._sampling
        if sampling is None:
            root = self.root
            if root is not None and root.sampling.source:
                sampling = root.sampling
            else:
                sampling = self._stated if self._stated is not None else UNKNOWN
            self._sampling = sampling
        return sampling


def _end(span: Span) -> int:
    return span.end_ns


@dataclass(frozen=True, slots=True)
class ClosedTrace:
    """A trace whose spans are (as far as event time can tell) complete."""

    trace_id: str
    spans: tuple[Span, ...]
    late: bool = False  # reassembled after it had closed once
    forced: bool = False  # closed early by the open-trace bound
    # The input partition the trace came from ("otlp_spans/3"; the first one when its spans came from several):
    # windowed aggregates keep one contribution per input partition, so that replicas add up
    # (processors.pipeline.calls).
    part: str = ""
    _facts: TraceFacts | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def facts(self) -> TraceFacts:
        """What the processors read of the spans, from one pass over them (made on first use, then kept)."""
        facts = self._facts
        if facts is None:
            facts = TraceFacts(self.spans)
            object.__setattr__(self, "_facts", facts)
        return facts

    @property
    def root(self) -> Span:
        """The root span, or the earliest span when the root is missing."""
        root = self.facts.root
        if root is None:
            raise ValueError("a trace without spans has no root")
        return root

    @property
    def start_ns(self) -> int:
        facts = self.facts
        if facts.root is None:
            raise ValueError("a trace without spans has no start")
        return facts.start_ns

    @property
    def end_ns(self) -> int:
        facts = self.facts
        if facts.root is None:
            raise ValueError("a trace without spans has no end")
        return facts.end_ns
