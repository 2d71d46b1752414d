"""The row accesses of a closed trace: each DB span analysed into per-row reads and writes, stamped with its request.

The code site of an access is the ``code.function.name`` / ``code.file.path`` / ``code.line.number`` of its span
or of the nearest ancestor that has them (instrumented drivers record no code attributes on the DB span itself);
where no span names it (auto-instrumentation records no ``code.*``), the code locator (``processors.codeloc``)
finds it in the service's checkout, and the access says how (``located_by``). Where the spans delimit the trace's
transactions (``processors.sql.transactions``), a row lock released before the write it seemed to guard guards
nothing, and the writes of a rolled-back transaction made no change. Every access then carries its request (the
root span): route, interval, outcome and span links, which is what the collision detector judges in stage 2, where
the rest of the trace is not at hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from processors.model.events import ACCESS_FIELDS, Access, DbOperation, LockMode, access_values, new_access
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.sql import SqlAccessExtractor
from processors.sql.control import ROLLBACK, transaction_control
from processors.sql.made import RequestValues, SiteValues
from processors.sql.transactions import transactions

if TYPE_CHECKING:
    from processors.codeloc import CodeLocator

_MAX_DEPTH = 64


def function_of(span: Span, by_id: dict[str, Span]) -> tuple[str, str, int]:
    """code.function.name / code.file.path / code.line.number of the span or its nearest ancestor that has them."""
    seen = 0
    node: Span | None = span
    while node is not None and seen < _MAX_DEPTH:
        if function := node.code_function:
            return function, node.code_file, node.code_line
        node = by_id.get(node.parent_id)
        seen += 1
    return "", "", 0


_REQUEST = ("route", "request_start_ns", "request_end_ns", "trace_error", "trace_exception", "trace_status", "links",
            "trace_sampling")  # fmt: skip
_AT = tuple(ACCESS_FIELDS.index(name) for name in _REQUEST)
_SITE = ("function", "file", "line", "located_by", "candidates")  # consecutive fields: stamped as one slice
_SITE_AT = ACCESS_FIELDS.index(_SITE[0])
assert ACCESS_FIELDS[_SITE_AT : _SITE_AT + len(_SITE)] == _SITE


def request_values(trace: ClosedTrace) -> RequestValues:
    """The values of the trace's request (root span) every access of it carries, in ``_REQUEST`` order: route,
    interval and outcome (what the collision detector judges), the trace's span links and sampling."""
    facts = trace.facts
    root = trace.root
    links = tuple(sorted({t for s in trace.spans for t in s.links}))
    return (root.route or root.name, root.start_ns, max(root.end_ns, facts.end_ns), facts.error, facts.exception,
            root.http_status, links, facts.sampling.probability)  # fmt: skip


def with_request(trace: ClosedTrace, accesses: list[Access], sites: list[SiteValues] | None = None) -> list[Access]:
    """Stamp each access with its request (``request_values``), and with its code site's values when given (one
    per access). (Built positionally: ``dataclasses.replace`` of 33 fields costs a visible share of stage 1.)"""
    request = request_values(trace)
    stamped = []
    end = _SITE_AT + len(_SITE)
    for i, a in enumerate(accesses):
        values = list(access_values(a))
        for at, value in zip(_AT, request, strict=True):
            values[at] = value
        if sites is not None:
            values[_SITE_AT:end] = sites[i]
        stamped.append(new_access(*values))
    return stamped


_HELD = (LockMode.FOR_UPDATE, LockMode.FOR_SHARE)
_READ = DbOperation.READ  # (an enum's member read off its class is a Python-level lookup: once, here)


def _rolled_back(trace: ClosedTrace, accesses: list[Access], silent: Sequence[Span] | None = None) -> bool:
    """Whether a write of ``accesses`` may be in a rolled-back transaction: the trace has a ROLLBACK span (among
    ``silent`` when given: the DB spans that made no access, which a ROLLBACK statement never makes)."""
    return any(a.operation is not _READ and not a.error for a in accesses) and any(
        s.db is not None and transaction_control(s.db.statement) == ROLLBACK
        for s in (trace.facts.db if silent is None else silent)
    )


def within_transactions(
    trace: ClosedTrace, accesses: list[Access], silent: Sequence[Span] | None = None
) -> list[Access]:
    """What the trace's transactions (``processors.sql.transactions``) change about its accesses: a row lock taken
    in a transaction that ended before the trace's later write of that row began does not guard that write (the
    lock is read as none); a write in a transaction a ROLLBACK span ended made no change (it counts as failed).
    ``silent``: the trace's DB spans that made no access, where given (only they can be a ROLLBACK)."""
    if not any(a.keyed and a.lock in _HELD for a in accesses) and not _rolled_back(trace, accesses, silent):
        return accesses  # nothing a transaction changes: no row lock, no write a ROLLBACK span may have undone
    txs = transactions(trace.facts.db)  # (only DB spans are in a transaction)
    if not txs:
        return accesses
    later_writes: dict[str, list[Access]] = {}
    for a in accesses:
        if a.operation is not _READ:
            later_writes.setdefault(a.entity, []).append(a)
    out = []
    for a in accesses:
        tx = txs.get(a.span_id)
        if tx is not None and tx.rolled_back and a.operation is not _READ and not a.error:
            a = replace(a, error=True)
        elif tx is not None and a.lock in _HELD and a.keyed:
            writes = [txs.get(w.span_id) for w in later_writes.get(a.entity, ()) if w.start_ns >= a.end_ns]
            if writes and all(w is not None and w.service == tx.service and w.ordinal > tx.ordinal for w in writes):
                a = replace(a, lock=LockMode.NONE)  # the lock was released (at commit) before the write
        out.append(a)
    return out


_UNLOCATED: SiteValues = ("", "", 0, "", ())


def accesses_of(trace: ClosedTrace, extractor: SqlAccessExtractor, locator: CodeLocator | None = None) -> list[Access]:
    """Every row access the trace's DB spans made, with code sites (from ``code.*``, else from ``locator``) and
    the request; transactions as ``within_transactions`` reads them."""
    db_spans = trace.facts.db
    if not db_spans:
        return []
    by_id = trace.facts.by_id
    named: dict[str, SiteValues] = {}
    unnamed: list[Span] = []
    for span in db_spans:
        function, file, line = function_of(span, by_id)
        if function:
            named[span.span_id] = (function, file, line, "code_attributes", ())
        else:
            unnamed.append(span)
    if unnamed and locator is not None:
        for span_id, found in locator.sites(trace, unnamed).items():
            named[span_id] = (found.function, found.file, found.line, found.located_by, found.candidates)
    request = request_values(trace)
    accesses: list[Access] = []
    silent: list[Span] = []  # the DB spans that made no access: transaction control (BEGIN, ROLLBACK, ...) among them
    for span in db_spans:  # each access made once, with its site and request
        made = extractor.accesses(span, site=named.get(span.span_id, _UNLOCATED), request=request)
        if made:
            accesses.extend(made)
        else:
            silent.append(span)
    return within_transactions(trace, accesses, silent) if accesses else accesses
