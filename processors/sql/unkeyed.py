"""A predicate access's binding (a statement that names no row by its key): its WHERE terms, SET values and WHERE
tree with one span's parameters. A span without parameters (what stock instrumentation records) binds nothing, so
its binding is a function of the statement's shape alone: made once per shape and shared by every such access, and
the WHERE's text for people (``predicate_text``) is then written once too. That cache is process-wide and bounded
(``NO_PARAMS_SHAPES``); each time it starts again is counted (:func:`resets`, reported by the extractor as
``dropped{component=sql, reason=shared_cache_reset}``, as the decoder's shared caches are)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from processors.model.events import Predicate, Scalar
from processors.sql.binding import bind_sets, bind_terms
from processors.sql.predicate import bind_where
from processors.sql.predicate_text import forget_shared, share_where
from processors.sql.shape import Shape

# (predicates, exact, set values, set expressions, bound WHERE tree, unbound terms)
Bound = tuple[
    tuple[tuple[str, str, Any], ...],
    bool,
    tuple[tuple[str, Scalar], ...],
    tuple[str, ...],
    Predicate | None,
    tuple[tuple[str, str], ...],
]
NO_PARAMS_SHAPES = 1024  # shapes whose parameterless binding is kept at most (then the cache starts again)
_NO_PARAMS: dict[int, tuple[Shape, Bound]] = {}  # by the shape's identity (held, so its id is not reused)
_RESETS = [0]  # how many times _NO_PARAMS started again


def resets() -> int:
    """How many times the parameterless-binding cache of this process started again (a monotonic count)."""
    return _RESETS[0]


def bind_scope(shape: Shape, params: tuple[Scalar, ...], named: Mapping[str, Scalar]) -> Bound:
    """The shape's binding with the span's parameters; ``exact`` when the WHERE is wholly known, as its terms or as
    a tree with every part evaluable and bound."""
    if not params and not named:
        hit = _NO_PARAMS.get(id(shape))
        if hit is not None and hit[0] is shape:
            return hit[1]
    predicates, exact, unbound = bind_terms(shape.predicates, params, named)
    sets, exprs = bind_sets(shape.set_values, params, named)
    where = None if shape.where is None else bind_where(*shape.where, params, named)
    exact = (exact and shape.exact) or (where is not None and not shape.undecidable and all(where[1]))
    if not shape.exact:
        unbound = ()
    bound = (predicates, exact, sets, exprs, where, unbound)
    if not params and not named:
        if len(_NO_PARAMS) >= NO_PARAMS_SHAPES:
            _NO_PARAMS.clear()
            forget_shared()
            _RESETS[0] += 1
        _NO_PARAMS[id(shape)] = (shape, bound)
        if where is not None:
            share_where(where)
    return bound


__all__ = ["NO_PARAMS_SHAPES", "Bound", "bind_scope", "resets"]
