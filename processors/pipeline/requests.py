"""Requests as statistics, regressions and the proof judge count them, and their error signatures.

A *request* is a server span, or a root span (a job run, a client-started trace); its operation is its
``http.route`` or else its name, as the graph's ``Operation`` nodes key it. Its version is its own resource's
``service.version``: a trace that crosses services counts each service's request under that service's version.

A request fails when its span has status ERROR or an HTTP status >= 500. Its *error signature* is
``error:<label>:<exception type>``, or ``error:<label>:HTTP <status>`` for a 5xx without an exception, where the
label is the span name when it reads ``<METHOD> <route>`` and the operation otherwise (``error:POST /split:
ZeroDivisionError``). The exception is the request span's, else the one recorded deepest below it in the same
service; the function the signature happened in is that span's ``code.function.name`` (or its nearest ancestor's).
"""

from __future__ import annotations

from dataclasses import dataclass

from processors.model.events import SpanKind, StatusCode
from processors.model.fast import maker
from processors.model.sampling import UNKNOWN, Sampling
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.model.units import MS_NS

_ERROR = StatusCode.ERROR


def request_label(span: Span) -> str:
    """``<METHOD> <route>`` when the span name says so, else the operation (route or span name)."""
    if span.route and span.name != span.route and span.name.endswith(" " + span.route):
        return span.name
    return span.route or span.name


def error_part(exception: str, http_status: int) -> str:
    """What failed: the exception type, ``HTTP <status>`` for a 5xx without one, else ``error``."""
    if exception:
        return exception
    return f"HTTP {http_status}" if http_status >= 500 else "error"


def error_signature(label: str, exception: str, http_status: int) -> str:
    """``error:<label>:<exception type>`` or ``error:<label>:HTTP <status>`` (or ``:error`` without either)."""
    return f"error:{label}:{error_part(exception, http_status)}"


@dataclass(frozen=True, slots=True)
class Request:
    """One request of one service, as the statistics, the regression detector and the proof judge count it."""

    trace_id: str
    span_id: str
    service: str
    version: str
    revision: str
    operation: str  # http.route or span name: the Operation node's name
    label: str  # "<METHOD> <route>" when known
    start_ns: int
    end_ns: int
    error: bool
    exception: str = ""
    http_status: int = 0
    signature: str = ""  # "" for a request that did not fail
    function: str = ""  # where the error was recorded
    sampling: Sampling = UNKNOWN  # what its span states (processors.model.sampling)
    identified_by: str = ""  # how ``version`` names the build (processors.model.events.Resource.identified_by)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / MS_NS


_new_request = maker(Request)  # Request(...) at a fraction of the cost (processors.model.fast)


def _origin(span: Span, children: dict[str, list[Span]]) -> tuple[str, str]:
    """(exception type, function) of the failure below a request span, in its own service, deepest first."""
    service = span.resource.service
    best: tuple[int, str, str] | None = None  # (depth, exception, function)
    stack: list[tuple[Span, int, str]] = [(span, 0, span.code_function)]
    seen: set[str] = set()
    while stack:
        node, depth, function = stack.pop()
        if node.span_id in seen:
            continue
        seen.add(node.span_id)
        function = node.code_function or function
        wanted = not span.exception_type or node.exception_type == span.exception_type
        if node.exception_type and wanted and (best is None or depth > best[0]):
            best = (depth, node.exception_type, function)
        for kid in children.get(node.span_id, ()):
            if kid.resource.service == service and kid.kind != SpanKind.SERVER:
                stack.append((kid, depth + 1, function))
    if best is None:
        return span.exception_type, span.code_function
    return best[1], best[2]


# The last trace asked about and its requests: the regression statistics and the proof judge both ask, one after
# the other, for every closed trace (the second answer is not computed again). One entry, swapped as one reference.
_last: tuple[ClosedTrace | None, tuple[Request, ...]] = (None, ())


def requests_of(trace: ClosedTrace) -> tuple[Request, ...]:
    """The requests in a closed trace: every server span and the root span."""
    global _last
    last = _last
    if last[0] is trace:
        return last[1]
    found = _requests(trace)
    _last = (trace, found)
    return found


def _requests(trace: ClosedTrace) -> tuple[Request, ...]:
    out: list[Request] = []
    facts = trace.facts
    stated: Sampling | None = None  # the trace's (read once, when a request states none)
    for span in facts.requests:  # the server spans and the spans without a parent, in the trace's order
        d = span.detail
        http_status = d.http_status
        error = span.status == _ERROR or http_status >= 500
        route = d.route
        name = span.name
        label = name if route and name != route and name.endswith(" " + route) else route or name  # request_label
        exception = function = signature = ""
        if error:
            exception, function = _origin(span, facts.children)
            signature = error_signature(label, exception, http_status)
        r = span.resource
        sampling = d.sampling
        if not sampling.source:  # the trace's (Jaeger's attributes: on the root only)
            if stated is None:
                stated = facts.sampling
            sampling = stated
        out.append(_new_request(trace.trace_id, span.span_id, r.service, r.version, r.revision, route or name, label,
                           span.start_ns, span.end_ns, error, exception, http_status, signature, function, sampling,
                           r.identified_by))  # fmt: skip
    return tuple(out)


def site(label: str, function: str) -> str:
    """Where an error happened, as receipts and issues show it: ``<label> in <function>``."""
    return f"{label} in {function}" if function else label


def operation_key_of(service: str, operation: str) -> str:
    """The graph's Operation key from its parts: what ``processors.graph.rows.operation_key`` makes of a span."""
    return f"{service}:{operation}"
