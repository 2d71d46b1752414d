"""SQL analysis of hostile statements: odd placeholders never raise, numeric literals keep entity keys exact.

SQL analysis runs when a trace closes, in a later batch than the message that brought the statement, so what it
raises cannot be dead-lettered with its record: it must not raise. A statement it cannot analyse is counted with a
reason and gives no access, as an unparseable one does.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from processors.model.events import DbCall, Resource, Scalar, SpanKind, StatusCode
from processors.model.span import Span
from processors.sql import SqlAccessExtractor
from processors.sql.syntax import number


def _span(statement: str, params: tuple[Scalar, ...] = (5,), named: tuple[tuple[str, Scalar], ...] = ()) -> Span:
    return Span(
        "a" * 32,
        "b" * 16,
        "",
        "db",
        SpanKind.CLIENT,
        1,
        2,
        StatusCode.UNSET,
        Resource("shop"),
        db=DbCall("postgresql", statement, params=params, named_params=named),
    )


@pytest.fixture
def ex() -> SqlAccessExtractor:
    return SqlAccessExtractor(key_columns={"orders": ["id"]})


ODD_PLACEHOLDERS = ["$²", "$\u0661", "$" + "7" * 5_000, "$" + "1" * 40, "$0", "$\U0001d7cf"]


@pytest.mark.parametrize("placeholder", ODD_PLACEHOLDERS)
@pytest.mark.parametrize(
    "template",
    [
        "SELECT * FROM orders WHERE id = {} AND a DIV 2",  # postgres refuses DIV: the default dialect reads it
        "SELECT * FROM orders WHERE id = {}",
        "UPDATE orders SET status = {} WHERE id = 1",
        "INSERT INTO orders (id, status) VALUES ({}, 'x')",
        "DELETE FROM orders WHERE id IN ({}, 2)",
    ],
)
def test_odd_placeholders_do_not_raise(ex: SqlAccessExtractor, template: str, placeholder: str) -> None:
    """``$`` followed by a non-ASCII digit or by thousands of digits is no parameter position: analysis goes on (it
    raised ValueError from ``int()``), and such a placeholder binds nothing by position."""
    accesses = ex.accesses(_span(template.format(placeholder)))
    assert "orders:5" not in {a.entity for a in accesses}  # the span's only parameter, 5, is bound by no position


def test_a_non_ascii_digit_is_not_position_one(ex: SqlAccessExtractor) -> None:
    """``$\u0661`` (Arabic-Indic one) is not ``$1``: it does not bind the first parameter as the key."""
    assert [a.entity for a in ex.accesses(_span("SELECT * FROM orders WHERE id = $\u0661 AND a DIV 2"))] != ["orders:5"]
    assert [a.entity for a in ex.accesses(_span("SELECT * FROM orders WHERE id = $1 AND a DIV 2"))] == ["orders:5"]


LITERALS = [
    "1e400",
    "1e401",
    "-1e400",
    "9" * 400,
    "9" * 399 + "8",
    "9" * 5_000,
    "9" * 4_999 + "8",
    "1e-400",
    "1.000000000000000000000001",
    "1",
    "0.1",
    "2e3",
]


def test_numeric_literals_keep_entity_keys_exact_and_distinct(ex: SqlAccessExtractor) -> None:
    """A literal past a float's range or precision names its own row (they were all ``orders:inf``, or the nearest
    float, so every such row was one entity: false collisions); equal numbers still name one row."""
    keys: dict[str, Decimal] = {}
    for literal in LITERALS:
        [access] = ex.accesses(_span(f"SELECT * FROM orders WHERE id = {literal}"))
        value = Decimal(literal)
        assert keys.setdefault(access.entity, value) == value, (access.entity, literal)
        assert "inf" not in access.entity
    [same] = ex.accesses(_span("SELECT * FROM orders WHERE id = 1.0"))
    assert same.entity == "orders:1"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12", 12),
        ("1_000", 1000),
        ("0.5", 0.5),
        ("2e3", 2000.0),
        ("1e400", "1e400"),
        ("9" * 5_000, "9" * 5_000),
        ("0.1000000000000000000001", "0.1000000000000000000001"),
        ("1e999999999999999999999", "1e999999999999999999999"),
    ],
)
def test_number_is_exact(text: str, value: Scalar) -> None:
    """A numeric literal is an int, a float that is exactly it, or its own text; never ``inf`` nor rounded."""
    assert number(text) == value and type(number(text)) is type(value)


def test_hostile_parameters_bind_without_raising(ex: SqlAccessExtractor) -> None:
    """Parameters holding huge digit strings, NaN and text bind into keys and predicates as they are."""
    [access] = ex.accesses(_span("UPDATE orders SET stock = %s WHERE id = %s AND v >= %s", ("NaN", "9" * 5_000, 1e308)))
    assert access.entity == "orders:" + "9" * 5_000
    assert access.set_values == (("stock", "NaN"),)
