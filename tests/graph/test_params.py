"""The parameter header's text: the same whichever way it is assembled, and the fallbacks' checks."""

from __future__ import annotations

import json
import math
from typing import Any

from falkordb.helpers import stringify_param_value
from hypothesis import given
from hypothesis import strategies as st

from sinks.graph.params import header, literal, render


def test_the_header_joined_with_its_query_is_the_header_then_the_query() -> None:
    params = {"rows": [["a\x00", "b"]], "cutoff": 1.5}
    text, replaced = render(params, "RETURN 1")
    assert text == 'CYPHER `rows`=[["a\ufffd","b"]] `cutoff`=1.5 RETURN 1' == header(params) + "RETURN 1"
    assert replaced == 1
    assert render({}, "RETURN 1") == ("RETURN 1", 0)


def test_a_value_whose_json_has_an_escape_or_an_object_takes_the_clients_text() -> None:
    for value in (["\x01"], [{"k": 1}], {"k": "v"}):
        assert literal(value) == str(stringify_param_value(value)) != json.dumps(value, separators=(",", ":"))
    for value in (["{x}", '{"x"}', "a\\b", "\\", "u", "é"], [1.5, None, True]):  # a brace, a backslash: JSON's
        assert literal(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_PLAIN = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | _TEXT, st.lists, max_leaves=10)
_FLOATS = st.recursive(st.floats(allow_nan=False, allow_infinity=False) | _TEXT, st.lists, max_leaves=10)


@given(_PLAIN)
def test_a_value_without_floats_is_json_s_text_or_the_client_s(value: Any) -> None:
    """Without floats the text is exactly what json's encoder writes, or the client when it has an escape or what
    may be an object's first key (``{"``, inside a string too: the client's text is read as the same value)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if "\\u" in text or '{"' in text:
        text = str(stringify_param_value(value))
    assert literal(value) == text


@given(_FLOATS)
def test_floats_are_the_same_numbers_as_json_writes(value: Any) -> None:
    """With floats the text may spell an exponent otherwise (``1e-7``), never another number."""
    text = literal(value)
    if "\\u" not in json.dumps(value, ensure_ascii=False):
        assert json.loads(text) == value


def test_nan_and_infinity_are_null_and_counted_and_text_with_their_names_stays_text() -> None:
    assert render({"v": [1.5, math.nan, [math.inf, -math.inf]]}) == ("CYPHER `v`=[1.5,null,[null,null]] ", 3)
    assert render({"v": ["NaN", "-Infinity", 2.5]}) == ('CYPHER `v`=["NaN","-Infinity",2.5] ', 0)
