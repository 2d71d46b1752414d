"""Query parameters encoded by ``sinks.graph.params`` reach the real FalkorDB as the same values as the client's own
encoding gives: untrusted text stays data whichever path encodes it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from falkordb import FalkorDB, Graph
from falkordb.helpers import stringify_param_value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinks.graph import schema
from sinks.graph.params import header, literal, positional

# Text as production sends it: any code point but NUL (which ends FalkorDB's query text, whoever encodes it).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
# (NaN and infinity have no literal: they are sent as null, see test_what_falkordb_cannot_hold_is_replaced_not_refused.)
NUMBERS = st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5), max_leaves=12)


@pytest.fixture(scope="module")
def graph(falkordb_url: str) -> Iterator[Graph]:
    host, port = falkordb_url.removeprefix("redis://").rsplit(":", 1)
    g = FalkorDB(host=host, port=int(port)).select_graph(f"params_{uuid.uuid4().hex[:8]}")
    g.query("RETURN 1")
    try:
        yield g
    finally:
        g.delete()


def _returned(graph: Graph, text: str) -> Any:
    return graph.query(text + "RETURN $v").result_set[0][0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_same_value_as_the_clients_encoding(graph: Graph, value: Any) -> None:
    ours = _returned(graph, header({"v": value}))
    assert ours == _returned(graph, f"CYPHER v={stringify_param_value(value)} ")
    if isinstance(value, str):
        assert ours == value


@pytest.mark.parametrize(
    "value",
    ['quote " backslash \\ newline \n tab \t', "\x01\x1f\x7f", "a\\u0041", "\\", '{"k": 1}', "ünï 漢字 😀", "$v"],
)
def test_hostile_text_stays_text(graph: Graph, value: str) -> None:
    assert _returned(graph, header({"v": value})) == value
    assert _returned(graph, header({"v": [value, [value]]})) == [value, [value]]


def test_a_value_sent_the_clients_way_keeps_its_booleans(graph: Graph) -> None:
    value = [False, "{", True]  # `{"` in its JSON: sent as the client writes it, `False` and `True`
    assert literal(value) == stringify_param_value(value)
    assert _returned(graph, header({"v": value})) == value


def test_plain_values_take_the_json_path() -> None:
    assert literal(["a", 1, None, True, 1.5, ["b"]]) == '["a",1,null,true,1.5,["b"]]'
    # What JSON cannot say as FalkorDB reads it goes the client's way.
    assert literal("\x01") == stringify_param_value("\x01")
    assert literal({"k": "v"}) == stringify_param_value({"k": "v"})
    assert literal(float("inf")) == "null"  # no literal (the client writes `inf`, which FalkorDB cannot parse)


def test_parameter_names_are_quoted_or_refused(graph: Graph) -> None:
    assert _returned(graph, header({"v": 1})) == 1
    assert graph.query(header({"a name": 2}) + "RETURN $`a name`").result_set[0][0] == 2
    for bad in ("", "x` RETURN 1 //"):
        with pytest.raises(ValueError, match="backtick"):
            header({bad: 1})


def test_rows_of_maps_go_as_lists() -> None:
    statement, rows = positional(schema.UPSERTS["windows"], [{"id": "w1", "start": 1}, {"id": "w2", "end": 4}])
    assert rows == [["w1", 1, None], ["w2", None, 4]]
    assert "r." not in statement
    assert statement == schema.UPSERTS["windows"].replace("r.id", "r[0]").replace("r.start", "r[1]").replace(
        "r.end", "r[2]"
    )
    assert positional("UNWIND $rows AS r RETURN r.gone", [{"id": 1}])[0] == "UNWIND $rows AS r RETURN null"


def test_positional_rows_write_what_map_rows_write(graph: Graph) -> None:
    rows = [{"key": 'svc:op "x"', "service": "svc", "name": 'op "x"\n'}, {"key": "svc:b", "service": "svc"}]
    graph.query(schema.UPSERTS["services"], {"rows": [{"name": "svc"}]})
    statement, sent = positional(schema.UPSERTS["operations"], rows)
    graph.query(header({"rows": sent}) + statement)
    got = graph.query("MATCH (o:Operation) RETURN o.key, o.service, o.name ORDER BY o.key").result_set
    assert got == [["svc:b", "svc", None], ['svc:op "x"', "svc", 'op "x"\n']]
