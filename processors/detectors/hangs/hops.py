"""The calls of a closed trace as hops: (caller service, caller operation, callee), with how each call went.

A call is a CLIENT span. Its caller operation is the operation (route or name) of the request it runs in: its
nearest SERVER (or root) ancestor in the same service. Its callee is the service of its child SERVER span when the
callee answered, the database system for a DB call, else the callee this caller's span name last reached (learned
from answered calls, so a call whose callee never answered joins its hop), else the span's name. A call *timed
out* when it failed with a timeout (its exception or message names a timeout or deadline, or HTTP 408/504).

The detector reads each call's hop and span in one pass over the trace's CLIENT spans (``HangDetector.on_trace``:
no object per call); these are the parts of that pass that are not per call.
"""

from __future__ import annotations

from processors.findings.trace_windows import operation_of as request_operation
from processors.model.events import SpanKind
from processors.model.span import Span
from processors.model.trace import ClosedTrace

Hop = tuple[str, str, str]  # (service, operation, callee)
_TIMEOUT_WORDS = ("timeout", "timed out", "deadline")
_SERVER = SpanKind.SERVER


def timed_out(span: Span) -> bool:
    """The span failed with a timeout (see the module docstring)."""
    if not span.is_error:
        return False
    text = f"{span.exception_type} {span.exception_message}".lower()
    return any(w in text for w in _TIMEOUT_WORDS) or span.http_status in (408, 504)


def answering(trace: ClosedTrace) -> dict[str, Span]:
    """Client span id -> the SERVER span that answered it (its child; the last one, as ``TraceFacts.servers``)."""
    facts = trace.facts
    by_id = facts.by_id
    if "" not in by_id:  # (a client span's id is in by_id: facts.servers answers it as the filter below would)
        return facts.servers
    return {s.parent_id: s for s in trace.spans if s.kind == _SERVER and s.parent_id in by_id}  # (a span without
    # an id: every server span, those without a parent too)


def operation_of(span: Span, by_id: dict[str, Span]) -> str:
    """The operation of the request ``span`` runs in (its nearest SERVER or root ancestor in its service)."""
    service = span.resource.service
    parent = by_id.get(span.parent_id)
    if parent is None or parent.resource.service != service:
        return request_operation(span)
    return operation_above(parent, service, by_id)


def operation_above(parent: Span, service: str, by_id: dict[str, Span]) -> str:
    """:func:`operation_of` a span whose parent ``parent`` runs in its service ``service``: what it is depends on
    the parent and the service only (the same for every sibling in that service, a cycle cut off alike)."""
    if parent.kind == _SERVER or not parent.parent_id:
        return request_operation(parent)
    node, seen = parent, 1
    while seen < 64:  # a cycle of parent ids (bad input) must not loop
        parent_ = by_id.get(node.parent_id)
        if parent_ is None or parent_.resource.service != service:
            return request_operation(node)
        if parent_.kind == _SERVER or not parent_.parent_id:
            return request_operation(parent_)
        node, seen = parent_, seen + 1
    return request_operation(node)
