"""A query's parameters as the ``CYPHER name=value ...`` header FalkorDB reads, encoded in C where that is exact.

The falkordb client builds that header in Python, value by value (``stringify_param_value``): on the bench's graph
writes that was a third of the daemon's client-side time. JSON's text is FalkorDB's literal for lists, strings,
numbers, ``true``/``false`` and ``null``, with two exceptions: FalkorDB reads no ``\\uXXXX`` escape (it keeps the
six characters; JSON writes one for a control character other than ``\\b \\f \\n \\r \\t``), and a map's keys are
identifiers, not strings. So a value is encoded by ``json`` (one C call) unless its text has a ``\\u`` or an object
(``{"``) in it, or JSON has no text for it (NaN, infinity, bytes): then by the client's own function. Either way
FalkorDB receives the same value (``tests/graph/test_params_live.py`` round-trips both through the real server).

Rows of maps go as lists (:func:`positional`): one statement text per key set, with each ``r.<key>`` read as
``r[i]``; a row without the key gives ``null``, as a map without it does.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from falkordb.helpers import stringify_param_value

_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False, separators=(",", ":"))
_ROW_FIELD = re.compile(r"(?<![\w.$`])r\.([A-Za-z_]\w*)")  # `r.key` in a statement that reads its rows as `r`


def literal(value: Any) -> str:
    """``value`` as FalkorDB's parameter literal."""
    try:
        text: str = _JSON.encode(value)
    except (TypeError, ValueError):  # NaN, infinity, bytes or another type JSON has no text for
        return str(stringify_param_value(value))
    if "\\u" in text or '{"' in text:  # outside a string a `"` never follows `{` but as an object's first key
        return str(stringify_param_value(value))
    return text


def header(params: Mapping[str, Any]) -> str:
    """The ``CYPHER`` header of ``params``, to put before the query text (each name in backticks, as the client
    writes it; a name FalkorDB cannot read that way is refused, as the client refuses it)."""
    if not params:
        return ""
    for name in params:
        if not name or "`" in name:
            raise ValueError(f"query parameter name {name!r}: empty or with a backtick")
    return "CYPHER " + " ".join([f"`{name}`={literal(value)}" for name, value in params.items()]) + " "


@functools.lru_cache(maxsize=256)
def _positional(statement: str, keys: tuple[str, ...]) -> str:
    index = {key: i for i, key in enumerate(keys)}
    return _ROW_FIELD.sub(lambda m: f"r[{index[m[1]]}]" if m[1] in index else "null", statement)


def positional(statement: str, rows: Sequence[Any]) -> tuple[str, Sequence[Any]]:
    """``statement`` and ``rows`` with each row a list, when the rows are maps (``UNWIND $rows AS r`` and ``r.key``
    only, like every statement of ``schema.UPSERTS``); other rows unchanged."""
    if not rows or not isinstance(rows[0], Mapping):
        return statement, rows
    keys = tuple(dict.fromkeys([key for row in rows for key in row]))
    return _positional(statement, keys), [[row.get(key) for key in keys] for row in rows]
