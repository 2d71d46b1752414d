"""The calls of a closed trace as hops: (caller service, caller operation, callee), with how each call went.

A call is a CLIENT span. Its caller operation is the operation (route or name) of the request it runs in: its
nearest SERVER (or root) ancestor in the same service. Its callee is the service of its child SERVER span when the
callee answered, the database system for a DB call, else the callee this caller's span name last reached (learned
from answered calls, so a call whose callee never answered joins its hop), else the span's name. A call *timed
out* when it failed with a timeout (its exception or message names a timeout or deadline, or HTTP 408/504).
"""

from __future__ import annotations

from dataclasses import dataclass

from processors.model.events import SpanKind
from processors.model.fast import maker
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.state.lru import CountedLRU

Hop = tuple[str, str, str]  # (service, operation, callee)
_TIMEOUT_WORDS = ("timeout", "timed out", "deadline")


@dataclass(frozen=True, slots=True)
class Call:
    hop: Hop
    version: str
    trace_id: str
    start_ns: int
    end_ns: int
    error: bool
    timeout: bool
    answered: bool

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


_new_call = maker(Call)  # Call(...) at a fraction of the cost (processors.model.fast)


def timed_out(span: Span) -> bool:
    """The span failed with a timeout (see the module docstring)."""
    if not span.is_error:
        return False
    text = f"{span.exception_type} {span.exception_message}".lower()
    return any(w in text for w in _TIMEOUT_WORDS) or span.http_status in (408, 504)


def calls_of(trace: ClosedTrace, learned: CountedLRU[tuple[str, str], str]) -> list[Call]:
    """The trace's calls; ``learned`` maps (service, span name) to the callee answered calls of it reached."""
    facts = trace.facts
    if not facts.clients:
        return []
    by_id = facts.by_id
    answered: dict[str, str] = {}  # client span id -> the callee service its child SERVER span ran in
    for s in facts.servers.values() if "" not in by_id else trace.spans:  # (a span without an id: all of them)
        if s.kind == SpanKind.SERVER and s.parent_id in by_id:
            answered[s.parent_id] = s.resource.service
    out = []
    trace_id = trace.trace_id
    for span in facts.clients:
        resource = span.resource
        service = resource.service
        callee = answered.get(span.span_id)  # None: no server span answered it ("": one without a service did)
        db = span.db
        answer = callee is not None or db is not None
        if callee:
            learned.put((service, span.name), callee)
        else:
            callee = db.system if db is not None else learned.get((service, span.name)) or span.name
        hop = (service, _operation(span, by_id), callee)
        error = span.is_error
        timeout = error and timed_out(span)  # (read only of a failed call: most are not)
        out.append(_new_call(hop, resource.version, trace_id, span.start_ns, span.end_ns, error, timeout, answer))
    return out


def _operation(span: Span, by_id: dict[str, Span]) -> str:
    """The operation of the request ``span`` runs in (its nearest SERVER or root ancestor in its service)."""
    service, node, seen = span.resource.service, span, 0
    while seen < 64:  # a cycle of parent ids (bad input) must not loop
        parent = by_id.get(node.parent_id)
        if parent is None or parent.resource.service != service:
            return node.route or node.name
        if parent.kind == SpanKind.SERVER or not parent.parent_id:
            return parent.route or parent.name
        node, seen = parent, seen + 1
    return node.route or node.name
