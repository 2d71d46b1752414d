"""An ``Access`` made in one step, with every value: the span's and statement's, its code site's and its request's
(``processors.pipeline.accesses`` knows the last two before the access is made, so no access is made twice)."""

from __future__ import annotations

from typing import Any

from processors.model.events import ACCESS_FIELDS, Access, Keying, Predicate, Scalar, new_access
from processors.model.span import Span
from processors.sql.shape import Shape

SiteValues = tuple[str, str, int, str, tuple[str, ...]]  # an access's function, file, line, located_by, candidates
# Its request's route, request_start_ns, request_end_ns, trace_error, trace_exception, trace_status, links (the
# trace's) and trace_sampling (``processors.pipeline.accesses.request_values``)
RequestValues = tuple[str, int, int, bool, str, int, tuple[str, ...], float | None]
Stamp = tuple[SiteValues, RequestValues]
_POSITIONAL = ("entity", "table", "operation", "lock", "trace_id", "span_id", "service", "version", "start_ns",
               "end_ns", "statement", "params", "set_values", "predicates", "read_version", "tx_id", "error",
               "function", "file", "line", "located_by", "candidates", "idempotency_key", "links", "set_exprs", "route",
               "request_start_ns", "request_end_ns", "trace_error", "trace_exception", "trace_status", "keyed",
               "exact", "where", "keying", "key_candidates", "key_confidence", "filters", "set_columns", "unbound",
               "unbound_key", "trace_sampling")  # fmt: skip
assert _POSITIONAL == ACCESS_FIELDS, "make_access makes an Access by position"
_VALUES = {k: k.value for k in Keying}  # (``Keying.value`` is a Python-level property: read once)


def make_access(span: Span, shape: Shape, entity: str, predicates: tuple[tuple[str, str, Any], ...],
                sets: tuple[tuple[str, Scalar], ...], exprs: tuple[str, ...], stamp: Stamp, *,
                keyed: bool = True, exact: bool = True, where: Predicate | None = None,
                filters: tuple[str, ...] = (), set_columns: tuple[str, ...] = (),
                unbound: tuple[tuple[str, str], ...] = (), unbound_key: bool = False,
                keying: Keying = Keying.BOUND) -> Access:  # fmt: skip
    """The access of ``span``'s statement (of shape ``shape``) to ``entity``, with ``stamp``'s site and request."""
    db = span.db
    assert db is not None
    (function, file, line, located_by, candidates), (route, request_start, request_end, trace_error,
     trace_exception, trace_status, links, sampling) = stamp  # fmt: skip
    r = span.resource
    return new_access(entity, shape.table, shape.operation, shape.lock, span.trace_id, span.span_id, r.service,
                      r.version, span.start_ns, span.end_ns, db.statement, db.params, sets, predicates,
                      db.row_version, db.tx_id, span.is_error, function, file, line, located_by, candidates,
                      span.idempotency_key, links, exprs, route, request_start, request_end, trace_error,
                      trace_exception, trace_status, keyed, exact, where, _VALUES[keying], 1, 1.0, filters,
                      set_columns, unbound, unbound_key, sampling)  # fmt: skip


__all__ = ["RequestValues", "SiteValues", "Stamp", "make_access"]
