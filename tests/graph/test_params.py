"""The parameter header's text: the same whichever way it is assembled, and the fallbacks' checks."""

from __future__ import annotations

import json

from falkordb.helpers import stringify_param_value

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
