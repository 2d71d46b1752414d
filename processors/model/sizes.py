"""Approximate memory sizes of events, for the byte bounds of state: cheap (lengths of the big values and a fixed cost
for the rest, never a walk of the objects), so that a bound can be checked at every insertion.

What varies is text: a statement, its parameters, an exception message; a span also counts its encoded size while it
still keeps its wire message. The fixed costs are those of the objects around the text (ids, slots, tuples), about
what ``tracemalloc`` shows for an ordinary span or access.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from processors.model.events import Access
from processors.model.span import Span

SPAN_OVERHEAD_BYTES = 640  # a decoded span's objects besides its text: ids, the detail tuple, its place in a trace
ACCESS_OVERHEAD_BYTES = 768  # an Access's slots and short strings (entity, ids, service, version, route, ...)
WORD = 8
WHERE_BYTES_PER_CHAR = 24  # a predicate access's WHERE tree (tuples of short strings), per character of its statement


def values_bytes(values: Iterable[Any]) -> int:
    """Parameter values: strings and bytes by length, tuples (an IN list) by their items, anything else a word."""
    size = 0
    for v in values:
        kind = type(v)  # exact types first (nearly every value): ``isinstance`` of a union costs more
        if kind is int or v is None:
            size += WORD
        elif kind is str or kind is bytes or isinstance(v, str | bytes):
            size += len(v)
        elif isinstance(v, tuple):
            for x in v:  # (a loop, not ``sum`` over a generator: a predicate access's WHERE values are such tuples)
                size += WORD if type(x) is int or x is None else len(x) if isinstance(x, str | bytes) else WORD
        else:
            size += WORD
    return size


def span_bytes(span: Span) -> int:
    """About the memory ``span`` holds: a fixed cost and its name, plus its encoded size while it keeps its wire
    message (a span read lazily: small by construction), else its detail's text (the statement and its
    parameters, the exception message, ...)."""
    size = SPAN_OVERHEAD_BYTES + len(span.name)
    source = span._source
    if source is not None:
        byte_size = getattr(source, "ByteSize", None)
        return size + (int(byte_size()) if byte_size is not None else 0)
    d = span.detail  # (a span that holds no wire message has its detail)
    size += len(d.route) + len(d.exception_type) + len(d.exception_message) + len(d.code_function)
    size += len(d.code_file) + len(d.idempotency_key) + 32 * len(d.links) + len(d.exception_stacktrace)
    db = d.db
    if db is not None:
        size += len(db.statement) + len(db.namespace) + len(db.collection) + len(db.operation) + len(db.tx_id)
        size += len(db.row_version) + values_bytes(db.params) + values_bytes(v for _, v in db.named_params)
    return size


def access_bytes(a: Access) -> int:
    """About the memory an ``Access`` holds: a fixed cost, its statement, its bound, set and predicate values, and
    the candidate functions of a code location that stayed ambiguous. (The values go through one call: stage 2
    sizes every write twice, into its row's history and out of it.)"""
    size = ACCESS_OVERHEAD_BYTES + len(a.statement) + len(a.trace_exception)
    if a.where is not None:
        size += WHERE_BYTES_PER_CHAR * len(a.statement) + values_bytes(a.where[1])
    return size + values_bytes((*a.params, *[v for _, v in a.set_values], *[p[2] for p in a.predicates], *a.candidates))
