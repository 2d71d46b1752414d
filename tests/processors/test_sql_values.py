"""Predicates evaluated on Debezium row images: true, false, or unknown, never guessed."""

from __future__ import annotations

import pytest

from processors.sql.values import UNAVAILABLE, compare, covers, same_value, term_holds

ROW = {"room": 5, "day": "2026-12-01", "on_call": True, "note": None, "price": "12.50", "blob": UNAVAILABLE}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        (("room", "=", "5"), True),  # a parameter printed as text against Debezium's number
        (("room", "<>", 5), False),
        (("room", ">=", 5), True),
        (("room", ">", 5), False),
        (("day", "<", "2026-12-02"), True),  # ISO dates compare as text
        (("on_call", "=", True), True),
        (("on_call", "=", "f"), False),
        (("note", "IS", None), True),
        (("note", "IS NOT", None), False),
        (("note", "=", "x"), False),  # a comparison with NULL is never true
        (("price", "=", 12.5), True),
        (("room", "IN", (1, 5)), True),
        (("room", "IN", (1, 2)), False),
        (("room", "IN", (1, "x")), None),
        (("blob", "=", "x"), None),  # an unchanged TOAST column: Debezium did not send it
        (("missing", "=", 1), None),
        (("day", "=", 20424), None),  # text against a number of days: not comparable
    ],
)
def test_term_on_an_image(term: tuple[str, str, object], expected: bool | None) -> None:
    assert term_holds(term, ROW) is expected


def test_covers_needs_every_term_and_an_exact_where() -> None:
    both = (("room", "=", 5), ("day", "=", "2026-12-01"))
    assert covers(both, True, ROW) is True
    assert covers(both, False, ROW) is None  # the WHERE had a term that was not read: unknown
    assert covers((("room", "=", 6), ("missing", "=", 1)), False, ROW) is False  # one false term decides
    assert covers((), True, ROW) is True  # no WHERE: every row
    assert covers(both, True, None) is False  # no image (an insert's before)


def test_compare_and_same_value() -> None:
    assert compare(3, "4") == 1 and compare("b", "a") == -1 and compare(None, 1) is None
    assert same_value(None, None) is True and same_value(None, 1) is False and same_value("x", 1) is None
