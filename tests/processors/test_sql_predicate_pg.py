"""WHERE predicates evaluated on Debezium row images, checked against the real PostgreSQL.

Each predicate runs as ``SELECT (<predicate>) FROM (SELECT <the row's values, typed>) AS t`` on the shared
PostgreSQL, and the same statement, as a span would carry it, is extracted and evaluated on the row's image as
Debezium gives it (``decimal.handling.mode=string``: numerics as strings; timestamps as epoch micros, with a time
zone as ISO text; dates as epoch days). Where the evaluator decides, its answer must be PostgreSQL's (TRUE, FALSE or
NULL); where PostgreSQL raises an error, the evaluator must say undecidable; cases marked ``DECIDE`` must be decided.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.model.span import DbCall, Resource, Span, SpanKind, StatusCode
from processors.sql import SqlAccessExtractor
from processors.sql.pgsemantics import Undecidable
from processors.sql.predicate import evaluate
from processors.sql.predicate_text import where_text

TS = datetime(2026, 12, 1, 10, 30, 15)
TZ = datetime(2026, 12, 1, 10, 30, 15, tzinfo=UTC)
# column: (PostgreSQL type, value given to PostgreSQL, value in the Debezium image)
COLUMNS: dict[str, tuple[str, Any, Any]] = {
    "a": ("int", 9, 9),
    "b": ("int", -7, -7),
    "n": ("numeric", Decimal("12.50"), "12.50"),
    "f": ("float8", 2.25, 2.25),
    "s": ("text", "HeLLo", "HeLLo"),
    "t": ("text", "a%b", "a%b"),
    "flag": ("bool", True, True),
    "x": ("int", None, None),
    "ts": ("timestamp", TS, int((TS - datetime(1970, 1, 1)).total_seconds() * 1_000_000)),  # MicroTimestamp
    "tsi": ("timestamp", TS, TS.isoformat()),  # a converter that gives ISO text
    "tz": ("timestamptz", TZ, "2026-12-01T10:30:15Z"),  # ZonedTimestamp
    "d": ("date", TS.date(), (TS.date() - datetime(1970, 1, 1).date()).days),  # Date: epoch days
}
DECIDE, MAY = True, False

CASES: list[tuple[str, tuple[Any, ...], bool]] = [
    # arithmetic: integer division truncates toward zero, % takes the dividend's sign
    ("a %% 3 = 0", (), DECIDE),
    ("b %% 3 = -1", (), DECIDE),
    ("b / 2 = -3", (), DECIDE),
    ("mod(b, -4) = -3", (), DECIDE),
    ("a / 0 = 1", (), MAY),  # division by zero: an error
    ("a %% %s = %s", (4, 1), DECIDE),
    ("n * 2 = 25", (), DECIDE),
    ("n / 4 = 3.125", (), DECIDE),
    ("n %% 5 = 2.5", (), DECIDE),
    ("f + 0.25 = 2.5", (), DECIDE),
    ("f > 1.5", (), DECIDE),
    ("-a = b - 2", (), DECIDE),
    ("a + b * 2 < 0", (), DECIDE),
    ("x + 1 = 1", (), DECIDE),  # NULL
    # functions
    ("lower(s) = 'hello'", (), DECIDE),
    ("upper(s) LIKE 'HE%%'", (), DECIDE),
    ("abs(b) = 7", (), DECIDE),
    ("coalesce(x, 5) = 5", (), DECIDE),
    ("coalesce(x, a, 1) = 9", (), DECIDE),
    ("nullif(a, 9) IS NULL", (), DECIDE),
    ("length(s) = 5", (), DECIDE),
    ("date_trunc('day', tsi) = '2026-12-01 00:00:00'", (), DECIDE),
    ("date_trunc('month', tsi) = %s", ("2026-12-01T00:00:00",), DECIDE),
    ("date_trunc('hour', tsi) > '2026-12-01 10:00:00'", (), DECIDE),
    ("date_trunc('day', ts) = '2026-12-01'", (), MAY),  # epoch micros or millis: the image does not say
    ("date_trunc('day', tz) = '2026-12-01'", (), MAY),  # the session's time zone decides
    ("md5(s) = 'x'", (), MAY),  # a function the evaluator does not know
    ("%s::INTEGER = a", ("9",), DECIDE),  # SQLAlchemy's typed parameter
    ("a::text = '9'", (), DECIDE),
    ("CAST(n AS INTEGER) = 13", (), MAY),  # '12.50' may be text (an error) or a numeric (13)
    ("CAST(f AS INTEGER) = 2", (), DECIDE),  # double → integer rounds half to even
    ("CAST(%s AS NUMERIC) = 1.5", ("1.5",), DECIDE),
    # IN, ANY, NOT IN
    ("a IN (1, 9, 3)", (), DECIDE),
    ("a IN (%s, %s)", (1, 2), DECIDE),
    ("a NOT IN (1, 2)", (), DECIDE),
    ("a NOT IN (1, NULL)", (), DECIDE),  # NULL
    ("a IN (1, NULL)", (), DECIDE),  # NULL
    ("a IN (9, NULL)", (), DECIDE),
    ("x IN (1, 2)", (), DECIDE),  # NULL
    ("a = ANY(ARRAY[9, 10])", (), DECIDE),
    ("a IN (SELECT 9)", (), MAY),  # a subquery
    # LIKE
    ("s LIKE 'He%%'", (), DECIDE),
    ("s LIKE 'he%%'", (), DECIDE),
    ("s ILIKE 'he%%'", (), DECIDE),
    ("s NOT LIKE '%%z'", (), DECIDE),
    ("s LIKE 'H_LLo'", (), DECIDE),
    ("s LIKE %s", ("%LL%",), DECIDE),
    ("t LIKE 'a\\%%b'", (), DECIDE),
    ("t LIKE 'a!%%b' ESCAPE '!'", (), DECIDE),
    ("s NOT ILIKE %s", ("h_llo",), DECIDE),
    # BETWEEN
    ("a BETWEEN 1 AND 9", (), DECIDE),
    ("a NOT BETWEEN %s AND %s", (10, 20), DECIDE),
    ("n BETWEEN 12 AND 13", (), DECIDE),
    ("x BETWEEN 1 AND 2", (), DECIDE),  # NULL
    # NULL tests and IS [NOT] DISTINCT FROM
    ("x IS NULL", (), DECIDE),
    ("x IS NOT NULL", (), DECIDE),
    ("a IS NULL", (), DECIDE),
    ("x IS DISTINCT FROM NULL", (), DECIDE),
    ("a IS DISTINCT FROM 9", (), DECIDE),
    ("x IS NOT DISTINCT FROM a", (), DECIDE),
    ("a IS DISTINCT FROM x", (), DECIDE),
    ("x = NULL", (), DECIDE),  # NULL
    # three-valued logic
    ("a = 1 OR s = 'HeLLo'", (), DECIDE),
    ("NOT (a = 9)", (), DECIDE),
    ("x = 1 OR a = 9", (), DECIDE),  # TRUE
    ("x = 1 AND a = 9", (), DECIDE),  # NULL
    ("x = 1 OR a = 1", (), DECIDE),  # NULL
    ("x = 1 AND a = 1", (), DECIDE),  # FALSE
    ("NOT (x = 1)", (), DECIDE),  # NULL
    ("(x = 1) IS NOT TRUE", (), DECIDE),
    ("(x = 1) IS FALSE", (), DECIDE),
    ("flag", (), DECIDE),
    ("NOT flag AND a = 9", (), DECIDE),
    ("flag IS TRUE", (), DECIDE),
    ("md5(s) = 'x' OR a = 9", (), DECIDE),  # TRUE whatever the unknown function says
    ("md5(s) = 'x' AND a = 1", (), DECIDE),  # FALSE whatever it says
    ("md5(s) = 'x' AND a = 9", (), MAY),
    # text, numbers and times as the image holds them
    ("n = '12.5'", (), MAY),  # '12.50' and '12.5': equal numerics, unequal texts
    ("n = '12.50'", (), DECIDE),
    ("n * 1 = '12.5'", (), DECIDE),
    ("n = 12.5", (), DECIDE),
    ("a = '9'", (), DECIDE),
    ("s = 'HeLLo'", (), DECIDE),
    ("s <> %s", ("hello",), DECIDE),
    ("t < 'b'", (), MAY),  # '%' against a letter: collations differ
    ("s < 'Hz'", (), MAY),
    ("d = '2026-12-01'", (), MAY),  # epoch days against text
    ("tz = '2026-12-01 10:30:15+00'", (), MAY),  # the image's text may be a timestamp or text
    ("tsi = '2026-12-01 10:30:15'", (), MAY),
    ("ts > '2026-01-01'", (), MAY),
]


def _span(statement: str, params: tuple[Any, ...]) -> Span:
    return Span(trace_id="a" * 32, span_id="b" * 16, parent_id="", name="db", kind=SpanKind.CLIENT, start_ns=1,
                end_ns=2, status=StatusCode.UNSET, resource=Resource("app"),
                db=DbCall(system="postgresql", statement=statement, params=params))  # fmt: skip


def evaluator(predicate: str, params: Sequence[Any], image: dict[str, Any]) -> bool | Undecidable | None:
    """The evaluator's answer for the statement a psycopg span would carry (``%`` written ``%%`` with parameters)."""
    text = predicate if "%s" in predicate else predicate.replace("%%", "%")
    [access] = SqlAccessExtractor().accesses(_span(f"SELECT * FROM t WHERE {text}", tuple(params)))
    assert access.where is not None
    return evaluate(access.where, image)


@pytest.fixture(scope="module")
def pg(postgres_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        yield conn


def postgres(conn: psycopg.Connection[Any], predicate: str, params: Sequence[Any],
             row: dict[str, tuple[str, Any, Any]]) -> bool | str | None:  # fmt: skip
    """PostgreSQL's answer: True, False, None (NULL) or the error's SQLSTATE."""
    columns = ", ".join(f"%s::{kind} AS {name}" for name, (kind, _, _) in row.items())
    sql = f"SELECT ({predicate})::boolean FROM (SELECT {columns}) AS t"
    try:
        found = conn.execute(sql.encode(), [*params, *(v for _, v, _ in row.values())]).fetchone()  # type: ignore[call-overload]
    except psycopg.Error as exc:
        return f"error {exc.sqlstate}"
    assert found is not None
    answer: bool | None = found[0]
    return answer


def check(conn: psycopg.Connection[Any], predicate: str, params: Sequence[Any], row: dict[str, tuple[str, Any, Any]],
          decide: bool, span_params: Sequence[Any] | None = None) -> None:  # fmt: skip
    """The evaluator's answer (with ``span_params`` as the span carries ``params``) is PostgreSQL's."""
    image = {name: img for name, (_, _, img) in row.items()}
    ours = evaluator(predicate, params if span_params is None else span_params, image)
    theirs = postgres(conn, predicate, params, row)
    if isinstance(theirs, str):
        assert isinstance(ours, Undecidable), f"{predicate}: PostgreSQL {theirs}, evaluator {ours!r}"
        return
    if decide:
        assert not isinstance(ours, Undecidable), f"{predicate}: PostgreSQL {theirs}, evaluator {ours!r}"
    if not isinstance(ours, Undecidable):
        assert ours is theirs, f"{predicate} {params}: PostgreSQL {theirs}, evaluator {ours!r}"


@pytest.mark.parametrize(("predicate", "params", "decide"), CASES, ids=[c[0] for c in CASES])
def test_the_evaluator_answers_as_postgresql(pg: psycopg.Connection[Any], predicate: str, params: tuple[Any, ...],
                                             decide: bool) -> None:  # fmt: skip
    """Each predicate of the table: decided as PostgreSQL decides it, or (where allowed) undecidable."""
    check(pg, predicate, params, COLUMNS, decide)


@pytest.mark.parametrize(("predicate", "params"), [c[:2] for c in CASES], ids=[c[0] for c in CASES])
def test_the_predicate_written_back_means_what_the_statement_said(pg: psycopg.Connection[Any], predicate: str,
                                                                 params: tuple[Any, ...]) -> None:  # fmt: skip
    """The text incidents show for a predicate (its tree written back, values in it) is, for PostgreSQL, the same
    predicate: it gives the same answer on the row (or the same error)."""
    text = predicate if "%s" in predicate else predicate.replace("%%", "%")
    [access] = SqlAccessExtractor().accesses(_span(f"SELECT * FROM t WHERE {text}", params))
    assert access.where is not None
    written = where_text(access.where)
    if "…" in written:
        return  # a part the evaluator does not read is not written back
    original = postgres(pg, predicate, params, COLUMNS)
    again = postgres(pg, written.replace("%", "%%"), (), COLUMNS)
    assert again == original, f"{predicate} written back as {written}"


def test_what_the_image_cannot_tell_is_undecidable_not_false() -> None:
    """A column missing from the image, a TOAST placeholder, a parameter the span did not carry: undecidable."""
    image = {name: img for name, (_, _, img) in COLUMNS.items()}
    assert isinstance(evaluator("missing = 1", (), image), Undecidable)
    assert isinstance(evaluator("s = 'x'", (), {**image, "s": "__debezium_unavailable_value"}), Undecidable)
    unbound = evaluator("a = %s", (), image)
    assert isinstance(unbound, Undecidable) and unbound.reason == "unbound_parameter"
    assert evaluator("a = 1 AND a = %s", (), image) is False  # one FALSE conjunct decides even so


_INTS = st.integers(min_value=-(10**6), max_value=10**6)
_SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


@_SETTINGS
@given(a=_INTS, b=_INTS.filter(bool), delta=st.integers(-1, 1), op=st.sampled_from(["%%", "/"]))
def test_integer_division_and_modulo_as_postgresql(pg: psycopg.Connection[Any], a: int, b: int, delta: int,
                                                   op: str) -> None:  # fmt: skip
    """``a / b`` and ``a % b`` on integers of either sign, against a value at or next to the right one."""
    near = int(a / b) if op == "/" else a - b * int(a / b)
    row = {"a": ("bigint", a, a)}
    check(pg, f"a {op} %s = %s", (b, near + delta), row, DECIDE)


_LIKE_TEXT = st.text(alphabet="ab%_\\", max_size=6)


@_SETTINGS
@given(text=_LIKE_TEXT, pattern=_LIKE_TEXT, fold=st.booleans(), negate=st.booleans())
def test_like_as_postgresql(pg: psycopg.Connection[Any], text: str, pattern: str, fold: bool, negate: bool) -> None:
    """LIKE and ILIKE with wildcards, escapes and a trailing escape (an error in PostgreSQL)."""
    op = ("NOT " if negate else "") + ("ILIKE" if fold else "LIKE")
    stored = text.upper() if fold else text
    check(pg, f"s {op} %s", (pattern,), {"s": ("text", stored, stored)}, MAY)


_MIXED = st.text(alphabet="aB1 .-:T", max_size=5)


@_SETTINGS
@given(stored=_MIXED, bound=_MIXED, op=st.sampled_from(["=", "<>", "<", ">=", "IS DISTINCT FROM"]))
def test_text_comparisons_as_postgresql(pg: psycopg.Connection[Any], stored: str, bound: str, op: str) -> None:
    """Text that may read as numbers or times: decided only where every reading agrees, and then as PostgreSQL."""
    check(pg, f"s {op} %s", (bound,), {"s": ("text", stored, stored)}, MAY)


@_SETTINGS
@given(stored=st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-1000, max_value=1000),
       bound=st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-1000, max_value=1000),
       op=st.sampled_from(["=", "<", ">=", "*  2 >", "- 1 <>", "%% 3 ="]))  # fmt: skip
def test_numerics_as_debezium_strings_as_postgresql(pg: psycopg.Connection[Any], stored: Decimal, bound: Decimal,
                                                    op: str) -> None:  # fmt: skip
    """A numeric column (Debezium's string) in arithmetic and comparisons with a ``Decimal`` parameter (on the span,
    its text): arithmetic makes both numbers; a bare comparison of two texts is decided where text and numbers
    agree."""
    decide = not op[0].isalpha() and op[0] not in "=<>"
    check(pg, f"n {op} %s", (bound,), {"n": ("numeric", stored, str(stored))}, decide, span_params=(str(bound),))
