"""A query's parameters as the ``CYPHER name=value ...`` header FalkorDB reads, encoded in C where that is exact.

The falkordb client builds that header in Python, value by value (``stringify_param_value``), a large share of the
daemon's client-side time on graph writes. JSON's text is FalkorDB's literal for lists, strings,
numbers, ``true``/``false`` and ``null``, with two exceptions: FalkorDB reads no ``\\uXXXX`` escape (it keeps the
six characters; JSON writes one for a control character other than ``\\b \\f \\n \\r \\t``), and a map's keys are
identifiers, not strings. So a value is encoded as JSON by pydantic-core (one call, faster than json's C encoder
on a batch's rows, bench/RESULTS.md; the same text but for a float under 1e-4, ``1e-7`` for ``1e-07``, which
FalkorDB reads alike) unless its text has a ``\\u`` or an object (``{"``) in it, or JSON has no text for it (NaN,
infinity, a lone surrogate, a type neither knows): then by ``json`` or the client's own function, as before. Bytes
and dates, which no row holds, go as pydantic-core writes them (UTF-8 text, ISO 8601). Either way FalkorDB receives
the same value (``tests/graph/test_params_live.py`` round-trips them through the real server).

Rows of maps go as lists (:func:`positional`): one statement text per key set, with each ``r.<key>`` read as
``r[i]``; a row without the key gives ``null``, as a map without it does.

**What FalkorDB cannot hold** is replaced, and counted (:func:`render` returns how many), so that the row is written
rather than refused: a NUL ends FalkorDB's query text (it is C text: the header was cut there and refused as a parse
error, which dropped the whole row, e.g. a trace with every kept span), and a lone surrogate cannot be sent as UTF-8
at all; both become U+FFFD. NaN and infinity have no literal and become ``null``. Every other character (control
characters included) travels as itself.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from falkordb.helpers import stringify_param_value
from pydantic_core import PydanticSerializationError, to_json

_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False, separators=(",", ":"))
_ROW_FIELD = re.compile(r"(?<![\w.$`])r\.([A-Za-z_]\w*)")  # `r.key` in a statement that reads its rows as `r`
_SURROGATE = re.compile("[\ud800-\udfff]")
# An object's first key (``{"``), found by the regex engine, which scans for the rare ``{``: ``str``'s own search for
# two characters keys on the ``"`` that every string has: bench/RESULTS.md has the figures.
_OBJECT = re.compile(r'\{"')
_ESCAPE = re.compile(r"\\u")
REPLACEMENT = "\ufffd"


def _finite(value: Any) -> tuple[Any, int]:
    """``value`` with every NaN or infinity (at any depth of lists and maps) as None, and how many there were."""
    if isinstance(value, float):
        return (value, 0) if math.isfinite(value) else (None, 1)
    if isinstance(value, list | tuple):
        items = [_finite(v) for v in value]
        return [v for v, _ in items], sum(n for _, n in items)
    if isinstance(value, dict):
        pairs = {k: _finite(v) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, sum(n for _, n in pairs.values())
    return value, 0


def _literal(value: Any) -> tuple[str, int]:
    try:  # pydantic-core's JSON: json's text but for how a float under 1e-4 is spelt (1e-7, not 1e-07)
        raw = to_json(value)
    except PydanticSerializationError:  # a lone surrogate, or a type it has no text for: json's way
        return _json_literal(value)
    if b"NaN" in raw or b"Infinity" in raw:  # written as JSON has no such literal (or text holding the words)
        return _json_literal(value)
    return _as_read(raw.decode(), value), 0


def _json_literal(value: Any) -> tuple[str, int]:
    """``_literal`` by json's encoder: what pydantic-core does not write as FalkorDB reads it."""
    try:
        text: str = _JSON.encode(value)
    except (TypeError, ValueError):  # NaN, infinity, bytes or another type JSON has no text for
        value, replaced = _finite(value)
        return str(stringify_param_value(value)), replaced
    return _as_read(text, value), 0


def _as_read(text: str, value: Any) -> str:
    """JSON ``text`` of ``value`` when FalkorDB reads it as the same value, else the client's own literal: JSON's
    ``\\u`` escapes and quoted object keys are not its syntax. Outside a string a ``"`` never follows ``{`` but as an
    object's first key; a ``\\u`` needs a ``\\`` (one C scan first)."""
    if ("\\" in text and _ESCAPE.search(text)) or _OBJECT.search(text):
        return str(stringify_param_value(value))
    return text


def literal(value: Any) -> str:
    """``value`` as FalkorDB's parameter literal (NaN and infinity as ``null``)."""
    return _literal(value)[0]


def _storable(text: str) -> tuple[str, int]:
    """``text`` with each NUL and lone surrogate replaced by U+FFFD, and how many there were (a NUL is found by one
    C scan; only text that is not ASCII is checked for surrogates, by encoding it as the client will)."""
    replaced = text.count("\x00") if "\x00" in text else 0  # `in` is a memchr; count, a slower loop
    if replaced:
        text = text.replace("\x00", REPLACEMENT)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text, surrogates = _SURROGATE.subn(REPLACEMENT, text)
            replaced += surrogates
    return text, replaced


def render(params: Mapping[str, Any], query: str = "") -> tuple[str, int]:
    """The ``CYPHER`` header of ``params`` followed by ``query``, and how many values in it were replaced (see the
    module docstring). Each name is in backticks, as the client writes it; a name FalkorDB cannot read that way is
    refused, as the client refuses it. The text is joined once: a statement's header is megabytes, and each copy of
    it costs the writer per span."""
    if not params:
        return query, 0
    parts, replaced = ["CYPHER "], 0
    for name, value in params.items():
        if not name or "`" in name:
            raise ValueError(f"query parameter name {name!r}: empty or with a backtick")
        name, named = _storable(name)
        text, encoded = _literal(value)
        text, stored = _storable(text)
        parts += ("`", name, "`=", text, " ")
        replaced += named + encoded + stored
    parts.append(query)
    return "".join(parts), replaced


def header(params: Mapping[str, Any]) -> str:
    """:func:`render` without the count."""
    return render(params)[0]


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
