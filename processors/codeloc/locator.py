"""The code locator: the function, file and line behind a DB span whose trace names no code, and how it knew.

Auto-instrumentation records no ``code.*``; the accesses (``processors.pipeline.accesses``) then ask the locator,
which reads the service's checkout once (:class:`CheckoutIndex`) and tries, strongest first:

``stacktrace``
    An ``exception.stacktrace`` recorded on the DB span or on one of its ancestors in the same service (Python or
    Java): a failed statement is the innermost frame inside the checkout (the code that issued it); the request's
    other statements are the outermost such frame (the handler the request was in).
``route``
    The request's ``http.route`` and method (its server span) map to the handler the checkout declares for them
    (Flask / FastAPI decorators, Django ``urlpatterns``); the line is where the handler passes the statement.
``statement``
    Each statement's shape (``processors.codeloc.statements``) names the functions that can issue it; a function
    that is (or calls into) an issuer of *every* statement of the request is its handler: one such function is the
    answer, several are candidates.

Ambiguity is never resolved by a guess: two or more candidates give no function, file or line, only
``candidates`` (at most ``max_candidates`` names). Requests are cached by (checkout, service, method, route,
statements) in a counted LRU, so each request shape is located once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from processors.api.telemetry import Telemetry
from processors.codeloc.config import CodeLocConfig
from processors.codeloc.index import CheckoutIndex, Function
from processors.codeloc.routes import request_of
from processors.codeloc.stacktrace import Frame, frames
from processors.codeloc.statements import normalise, orm_issues, shape_of
from processors.model.events import SpanKind
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.state.lru import CountedLRU

_MAX_DEPTH = 64
_LIBRARY_DIRS = frozenset({"site-packages", "dist-packages", "lib-python"})


@dataclass(frozen=True, slots=True)
class Site:
    """Where the code is, and how that is known (``located_by``); ambiguous: only ``candidates``."""

    function: str
    file: str
    line: int
    located_by: str  # code_attributes | stacktrace | route | statement
    candidates: tuple[str, ...] = ()


Issuers = dict[str, int]  # function -> line that passes the statement


class CodeLocator:
    """See the module docstring."""

    def __init__(self, config: CodeLocConfig, root: Path, telemetry: Telemetry) -> None:
        self.config = config
        self.root = root
        self.telemetry = telemetry.declare(
            "max_files", "max_file_bytes", "unparsable", "unreadable", "locate_error", "missing_checkout"
        )
        self._indexes: dict[Path, CheckoutIndex | None] = {}
        self._paths: dict[str, Path] = {}  # configured checkout ("" = the root) -> its resolved path
        self._requests: CountedLRU[tuple[object, ...], tuple[Site | None, ...]] = CountedLRU(
            config.max_cached_requests, telemetry, "max_cached_requests"
        )
        self._issuers: CountedLRU[tuple[Path, str], Issuers] = CountedLRU(
            config.max_cached_requests, telemetry, "max_cached_statements"
        )
        self._frames: CountedLRU[tuple[Path, Frame], tuple[str, str, int] | None] = CountedLRU(
            config.max_cached_requests, telemetry, "max_cached_frames"
        )

    def prepare(self) -> None:
        """Read every configured checkout now (the root's and each service's)."""
        for service in ("", *self.config.services):
            self.checkout(service)

    def checkout(self, service: str) -> CheckoutIndex | None:
        """The index of ``service``'s checkout, built on first use (None when the directory is missing)."""
        configured = self.config.services.get(service)
        path = self._paths.get(configured or "")
        if path is None:
            path = self._paths[configured or ""] = (
                (self.root / configured).resolve() if configured else self.root.resolve()
            )
        if path not in self._indexes:
            if not path.is_dir():
                self.telemetry.drop("missing_checkout")
                self._indexes[path] = None
            else:
                self._indexes[path] = CheckoutIndex.build(path, max_files=self.config.max_files,
                                                          max_file_bytes=self.config.max_file_bytes,
                                                          telemetry=self.telemetry,
                                                          exclude=self.config.exclude)  # fmt: skip
        return self._indexes[path]

    def sites(self, trace: ClosedTrace, spans: Sequence[Span]) -> dict[str, Site]:
        """The site of each of the trace's DB ``spans`` (those whose spans name no code), by span id."""
        by_id = {s.span_id: s for s in trace.spans}
        groups: dict[str, list[Span]] = {}
        for span in spans:
            groups.setdefault(_request(span, by_id).span_id, []).append(span)
        out: dict[str, Site] = {}
        for request_id, members in groups.items():
            request = by_id[request_id]
            index = self.checkout(request.resource.service)
            if index is None:
                continue
            try:
                located = self._request_sites(index, request, members, by_id)
            except Exception:  # a location is an addition: failing costs it, not the access
                self.telemetry.drop("locate_error", len(members))
                continue
            for span, site in zip(members, located, strict=True):
                if site is None:
                    self.telemetry.count("unlocated")
                    continue
                self.telemetry.count("ambiguous" if site.candidates else f"located_by_{site.located_by}")
                out[span.span_id] = site
        return out

    # -- one request -----------------------------------------------------------------------------------------
    def _request_sites(self, index: CheckoutIndex, request: Span, spans: list[Span],
                       by_id: dict[str, Span]) -> list[Site | None]:  # fmt: skip
        stack = [self._stack(index, span, by_id) for span in spans]
        if any(stack):
            fallback = self._by_shape(index, request, spans)
            return [
                self._from_stack(frames_, span) if frames_ else fallback[i]
                for i, (span, frames_) in enumerate(zip(spans, stack, strict=True))
            ]
        return list(self._by_shape(index, request, spans))

    def _by_shape(self, index: CheckoutIndex, request: Span, spans: list[Span]) -> tuple[Site | None, ...]:
        method, route = request_of(request.route, request.name) if request.kind == SpanKind.SERVER else ("", "")
        texts = tuple(span.db.statement if span.db is not None else "" for span in spans)
        key = (index.root, request.resource.service, method, route, texts)  # texts as sent: no parameters in them
        cached = self._requests.get(key)
        if cached is None:
            cached = self._locate(index, method, route, texts)
            self._requests.put(key, cached)
        return cached

    def _locate(self, index: CheckoutIndex, method: str, route: str, texts: tuple[str, ...]) -> tuple[Site | None, ...]:
        issuers = [self._issuers_of(index, t) if t else {} for t in texts]
        handlers = _handlers(index, method, route) if route else []
        how = "route"
        if len(handlers) > 1:  # the statements decide between them, else they are candidates
            handlers = [h for h in handlers if all(not i or index.callees(h, self.config.call_depth) & set(i)
                                                   for i in issuers)] or handlers  # fmt: skip
        if not handlers:
            how, handlers = "statement", self._entries(index, issuers)
        if not handlers:
            return tuple(None for _ in texts)
        if len(handlers) > 1:
            names = tuple(sorted(handlers)[: self.config.max_candidates])
            return tuple(Site("", "", 0, how, names) for _ in texts)
        entry = index.functions[handlers[0]]
        return tuple(Site(entry.name, entry.file, i.get(entry.name, entry.line), how) for i in issuers)

    def _issuers_of(self, index: CheckoutIndex, text: str) -> Issuers:
        key = (index.root, text)
        found = self._issuers.get(key)
        if found is None:
            found = _issuers(index, text, self.config.call_depth)
            self._issuers.put(key, found)
        return found

    def _entries(self, index: CheckoutIndex, issuers: list[Issuers]) -> list[str]:
        """The functions that issue, or call into an issuer of, every statement that has issuers: the outermost
        one when one is, else the innermost one when one is, else all of the outermost (candidates)."""
        reach: set[str] | None = None
        for found in issuers:
            if not found:
                continue
            reached = set(found).union(*(_callers(index, f, self.config.call_depth) for f in found))
            reach = reached if reach is None else reach & reached
        if not reach:
            return []
        outer = [f for f in reach if not index.callers.get(f, set()) & (reach - {f})]
        if len(outer) == 1:
            return outer
        inner = [f for f in reach if not (index.callees(f, 1) - {f}) & reach]
        return inner if len(inner) == 1 else sorted(outer or reach)

    # -- stack traces ----------------------------------------------------------------------------------------
    def _stack(self, index: CheckoutIndex, span: Span, by_id: dict[str, Span]) -> list[tuple[str, str, int]]:
        """The checkout's frames (function, file, line), innermost first, of the nearest stack trace recorded on
        ``span`` or an ancestor of its service."""
        node: Span | None = span
        for _ in range(_MAX_DEPTH):
            if node is None or node.resource.service != span.resource.service:
                return []
            text = node.detail.exception_stacktrace
            if text:
                found = [site for f in frames(text) if (site := self._frame_site(index, f))]
                if found:
                    return found
            node = by_id.get(node.parent_id)
        return []

    def _frame_site(self, index: CheckoutIndex, frame: Frame) -> tuple[str, str, int] | None:
        key = (index.root, frame)
        if key in self._frames:
            return self._frames.get(key)
        site = _frame_site(index, frame, self.config.source_map)
        self._frames.put(key, site)
        return site

    @staticmethod
    def _from_stack(found: list[tuple[str, str, int]], span: Span) -> Site:
        function, file, line = found[0] if span.is_error else found[-1]
        return Site(function, file, line, "stacktrace")


def _request(span: Span, by_id: dict[str, Span]) -> Span:
    """The span of the request ``span`` belongs to: its nearest SERVER ancestor in the same service, else the
    outermost ancestor of that service."""
    node = span
    for _ in range(_MAX_DEPTH):
        parent = by_id.get(node.parent_id)
        if node.kind == SpanKind.SERVER or parent is None or parent.resource.service != span.resource.service:
            return node
        node = parent
    return node


def _handlers(index: CheckoutIndex, method: str, route: str) -> list[str]:
    found: set[str] = set()
    for r in index.routes:
        if r.pattern == route and (not method or not r.methods or method in r.methods):
            if r.handler in index.functions:
                found.add(r.handler)
            elif method and f"{r.handler}.{method.lower()}" in index.functions:  # a class-based view
                found.add(f"{r.handler}.{method.lower()}")
    return sorted(found)


def _issuers(index: CheckoutIndex, text: str, depth: int) -> Issuers:
    """The functions that pass ``text`` (by text, else by shape, else through the ORM; see ``statements``)."""
    norm = normalise(text)
    found = {f.name: s.line for f in index.functions.values() for s in f.statements if s.text == norm}
    if found:
        return found
    shape = shape_of(text)
    if shape is None:
        return {}
    found = {f.name: s.line for f in index.functions.values() for s in f.statements if s.shape == shape}
    if found or not shape.tables:
        return found
    models = set().union(*(index.tables_models(t) for t in shape.tables))
    naming = {f.name for f in index.functions.values() if models & f.names}
    found = {}
    for f in index.functions.values():
        via = (
            shape.kind == "update"
            and bool(shape.columns & f.assigned)
            and bool(_callers(index, f.name, depth) & naming)
        )
        if orm_issues(shape, models, f.names, f.calls, f.assigned, caller_names_model=via):
            found[f.name] = f.line
    return found


def _callers(index: CheckoutIndex, name: str, depth: int) -> set[str]:
    """The functions that call ``name``, ``depth`` calls up."""
    found: set[str] = set()
    frontier = {name}
    for _ in range(depth):
        frontier = {c for f in frontier for c in index.callers.get(f, ())} - found
        found |= frontier
    return found


def _frame_site(index: CheckoutIndex, frame: Frame, source_map: dict[str, str]) -> tuple[str, str, int] | None:
    """A frame inside the checkout as (function, file, line); None for a library's frame or one not found."""
    if frame.owner:  # Java: the class's file under its package path
        local = index.find_file(frame.owner.rpartition(".")[0].replace(".", "/") + "/" + frame.file, source_map)
        return (f"{frame.owner}.{frame.function}", local, frame.line) if local else None
    if _LIBRARY_DIRS & set(Path(frame.file).parts):
        return None
    local = index.find_file(frame.file, source_map)
    fn: Function | None = index.function_at(local, frame.line) if local else None
    if fn is None or fn.name.rsplit(".", 1)[-1] != frame.function:
        return None
    return fn.name, fn.file, frame.line
