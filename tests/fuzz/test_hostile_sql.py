"""SQL analysis, parameter parsing and value comparison on hostile input, below the stages (cheap: most of the
long run's examples).

Properties: a DB span's statement (from the grammar) with any parameters gives accesses or a counted reason, never
an exception, and every access crosses the internal topic (encode, then decode and validate); a parameters repr
parses without raising into scalars Python can print; two literals name one row only when they are one number (no
false collisions: ``1e400`` and ``1e401`` were both ``inf``); comparisons and invariants over hostile row values are
answers (True / False / unknown), never exceptions, and ``compare`` is antisymmetric.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from hypothesis import strategies as st

from processors.lib.invariants import Invariant
from processors.model.events import Access, DbCall, Resource, Scalar, SpanKind, StatusCode
from processors.model.span import Span
from processors.sql import SqlAccessExtractor
from processors.sql.pgsemantics import Undecidable, arith, cast, holds, like
from processors.sql.predicate import evaluate
from processors.sql.predicate_text import where_text
from processors.sql.values import compare, covers, same_value
from streamer.decode import internal
from streamer.decode.literals import MAX_INT_DIGITS, literal_params
from tests.fuzz.profiles import fuzz
from tests.fuzz.strategies import PARAMETER_TEXTS, ROW_VALUES, STATEMENTS, constants, texts

_SCALARS = st.one_of(
    constants([v for v in ROW_VALUES if v is None or isinstance(v, str | int | float | bool)]),
    st.integers(),
    st.floats(),
    texts(big=False),
)
_KEYS = {"orders": ["id"], "inventory": ["sku"], "t": ["id", "version"]}
_HOSTILE_IMAGE = {"id": "9" * 5000, "status": "%_\\", "stock": 1e308, "amount": "1e999999", "version": None,
                  "sku": "__debezium_unavailable_value", "on_call": "t", "x" * 64: -(2**63)}  # fmt: skip
_COUNTED = {"cache_hits", "cache_misses", "parse_fallback"}  # events that are no outcome


@fuzz(
    STATEMENTS,
    st.one_of(
        PARAMETER_TEXTS.map(literal_params),
        st.tuples(
            st.lists(_SCALARS, max_size=4).map(tuple),
            st.lists(st.tuples(st.sampled_from(["name", "id", "\u0661", ":id", ""]), _SCALARS), max_size=2).map(tuple),
        ),
    ),
    st.booleans(),
    examples=200,
    long_examples=40_000,
)
def test_statements_give_accesses_or_a_counted_reason(
    statement: str, params: tuple[tuple[Scalar, ...], tuple[tuple[str, Scalar], ...]], keyed: bool
) -> None:
    """See the module docstring."""
    ex = SqlAccessExtractor(key_columns=_KEYS if keyed else None)
    span = Span(
        "a" * 32,
        "b" * 16,
        "",
        "db",
        SpanKind.CLIENT,
        1,
        2,
        StatusCode.UNSET,
        Resource("shop"),
        db=DbCall("postgresql", statement, params=params[0], named_params=params[1]),
    )
    accesses = ex.accesses(span)
    outcomes = {k for k, n in ex.counters.items() if n and k not in _COUNTED}
    assert accesses or outcomes
    for access in accesses:
        decoded = internal.decode(internal.encode_access(access))
        assert decoded.entity == access.entity and decoded.statement == access.statement  # type: ignore[union-attr]
        assert isinstance(decoded, Access) and repr(decoded.where) == repr(access.where)  # (NaN is no NaN)
        hash(decoded)  # its WHERE tree comes back as tuples: accesses are kept in sets and dict keys
        if decoded.where is not None:  # evaluated on a hostile image: an answer or undecidable, never an exception
            assert isinstance(evaluate(decoded.where, _HOSTILE_IMAGE), bool | Undecidable | None)
            assert covers(decoded.predicates, decoded.exact, _HOSTILE_IMAGE, decoded.where) in (True, False, None)
            assert isinstance(where_text(decoded.where), str)


@fuzz(PARAMETER_TEXTS, examples=200, long_examples=10_000)
def test_parameter_text_parses_to_printable_scalars(text: str) -> None:
    """Any ``db.statement.parameters`` text parses (or is empty) into scalars whose text Python can write."""
    positional, named = literal_params(text)
    for value in (*positional, *(v for _, v in named)):
        assert value is None or isinstance(value, str | int | float | bool)
        if isinstance(value, int):
            assert len(str(abs(value))) <= MAX_INT_DIGITS


_DIGITS = st.text("0123456789", min_size=1, max_size=5).map(lambda d: d.lstrip("0") or "0")
_NUMBERS = st.one_of(
    st.tuples(
        _DIGITS,
        st.sampled_from(["", ".0", ".5", ".000000000000000000000001"]),
        st.sampled_from(["", "e400", "e401", "e-400", "e308", "e309", "E+2", "e0"]),
    ).map("".join),
    st.integers(1, 6_000).map(lambda n: "9" * n),
    st.integers(1, 6_000).map(lambda n: "1" + "0" * n),
)


@fuzz(_NUMBERS, _NUMBERS, examples=200, long_examples=15_000)
def test_two_literals_name_one_row_only_when_they_are_one_number(a: str, b: str) -> None:
    """No false collisions: the entity keys of ``WHERE id = a`` and ``WHERE id = b`` are equal only when ``a`` and
    ``b`` are the same number."""
    ex = SqlAccessExtractor(key_columns=_KEYS)

    def key(literal: str) -> str:
        [access] = ex.accesses(
            Span(
                "a" * 32,
                "b" * 16,
                "",
                "db",
                SpanKind.CLIENT,
                1,
                2,
                StatusCode.UNSET,
                Resource("shop"),
                db=DbCall("postgresql", f"SELECT 1 FROM orders WHERE id = {literal}"),
            )
        )
        return access.entity

    if key(a) == key(b):
        assert Decimal(a) == Decimal(b), (a[:40], b[:40])


_ROW = st.dictionaries(
    st.sampled_from(["stock", "amount", "status"]), st.one_of(constants(ROW_VALUES), _SCALARS), max_size=3
)
_INVARIANTS = [
    Invariant(t)
    for t in [
        "stock >= 0",
        "stock < amount OR NOT status = 'x'",
        "-stock <= amount",
        "stock IS NOT NULL AND amount >= -1",
    ]
]


def _number(value: Any) -> Decimal | None:
    try:
        d = Decimal(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
    except (InvalidOperation, ValueError):
        return None
    return d if d is not None and d.is_finite() else None


@fuzz(_SCALARS, _SCALARS, _ROW, examples=300, long_examples=10_000)
def test_comparisons_and_invariants_answer(bound: Scalar, stored: Scalar, row: dict[str, Any]) -> None:
    """Comparisons of bound parameters with stored values, predicates over row images and invariants give an
    answer or unknown, never an exception; ``compare`` is antisymmetric."""
    c = compare(bound, stored)
    assert c in (-1, 0, 1, None)
    back = compare(stored, bound)
    assert (c is None) == (back is None) and (c is None or back == -c)
    assert same_value(bound, stored) in (True, False, None)
    terms = [(column, op, bound) for column in row for op in ("=", "<>", ">", "<=", "IS", "IN")]
    terms = [(c_, op, (v, stored)) if op == "IN" else (c_, op, v) for c_, op, v in terms]
    assert covers(terms, True, row) in (True, False, None)
    for invariant in _INVARIANTS:
        assert invariant.holds(row) in (True, False, None)


_WHERES = [
    "a % %s = 0", "a / %s < 1 OR -a * 2 <> %s", "lower(a) LIKE %s ESCAPE ''", "a BETWEEN %s AND 1e400",
    "coalesce(a, %s) IS DISTINCT FROM abs(a)", "date_trunc('week', a) = %s", "CAST(a AS INTEGER) IN (%s)",
    "a::float8 >= %s", "length(a::text) = %s", "nullif(a, %s) IS NOT TRUE",
]  # fmt: skip


def _tree(where: str) -> Any:
    span = Span("a" * 32, "b" * 16, "", "db", SpanKind.CLIENT, 1, 2, StatusCode.UNSET, Resource("shop"),
                db=DbCall("postgresql", f"SELECT * FROM t WHERE {where}", params=(0,)))  # fmt: skip
    [access] = SqlAccessExtractor().accesses(span)
    assert access.where is not None
    return access.where[0]


_TREES = [_tree(where) for where in _WHERES]


@fuzz(_SCALARS, _SCALARS, examples=300, long_examples=10_000)
def test_predicates_over_hostile_values_answer(stored: Scalar, bound: Scalar) -> None:
    """PostgreSQL's semantics over hostile values (huge integers, NaN, infinities, odd text): every operator, cast
    and function gives a value, NULL or undecidable, never an exception; so does every WHERE tree."""
    for op in ("=", "<>", "<", ">="):
        assert isinstance(holds(op, stored, bound), bool | Undecidable | None)
    for op in ("+", "-", "*", "/", "%"):
        arith(op, stored, bound)
    for kind in ("int", "num", "float", "text", "bool", "timestamp"):
        cast(kind, stored)
    assert isinstance(like(stored, bound, "\\", True), bool | Undecidable | None)
    for tree in _TREES:
        truth = evaluate((tree, ((bound,),) * 2), {"a": stored})
        assert isinstance(truth, bool | Undecidable | None)
