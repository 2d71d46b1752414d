"""Statement rewrites: each protected form, the refusals, and properties over generated SELECT/UPDATE statements."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.repair.classify import lock_of
from processors.repair.sql_rewrite import (
    CopyParam,
    RewriteError,
    SqlEdit,
    VarParam,
    atomic_update,
    existing_row_query,
    idempotency_guard,
    optimistic,
    parse,
    placeholders,
    render,
    row_lock,
)


def test_row_lock_appends_for_update_after_limit_and_before_semicolon() -> None:
    """FOR UPDATE goes at the very end of the SELECT (after LIMIT), before a trailing semicolon."""
    edit = row_lock("SELECT a FROM t WHERE id = %s ORDER BY a LIMIT 1;")
    assert edit.after == "SELECT a FROM t WHERE id = %s ORDER BY a LIMIT 1 FOR UPDATE;"
    assert edit.insertions == ((48, " FOR UPDATE"),)


def test_row_lock_keeps_the_developers_spelling() -> None:
    """Only the lock is inserted: whitespace and case of the recorded text survive; the canonical form is sqlglot's."""
    edit = row_lock("select a\n  from t\n where id = %s")
    assert edit.after == "select a\n  from t\n where id = %s FOR UPDATE"
    assert edit.canonical == "SELECT a FROM t WHERE id = %s FOR UPDATE"


@pytest.mark.parametrize(
    "statement",
    ["SELECT count(*) FROM t WHERE id = %s", "SELECT DISTINCT a FROM t", "SELECT a FROM t GROUP BY a",
     "SELECT a FROM t WHERE id = %s FOR SHARE", "UPDATE t SET a = 1 WHERE id = %s"],
)  # fmt: skip
def test_row_lock_refuses_what_postgres_cannot_lock(statement: str) -> None:
    """Aggregates, DISTINCT, GROUP BY, an existing lock, or a non-SELECT are refused, not rewritten."""
    with pytest.raises(RewriteError):
        row_lock(statement)


@pytest.mark.parametrize(
    ("statement", "invariants", "after"),
    [
        ("UPDATE inventory SET stock = stock - 1 WHERE sku = %s RETURNING stock", ["stock >= 0"],
         "UPDATE inventory SET stock = stock - 1 WHERE sku = %s AND stock >= 1 RETURNING stock"),
        ("UPDATE inventory SET stock = stock - 3 WHERE sku = %s", ["0 <= stock"],
         "UPDATE inventory SET stock = stock - 3 WHERE sku = %s AND stock >= 3"),
        ("UPDATE seats SET taken = taken + 1 WHERE id = %s", ["taken <= 40", "taken >= 0"],
         "UPDATE seats SET taken = taken + 1 WHERE id = %s AND taken <= 39 AND taken >= -1"),
        ("UPDATE t SET n = n - 1", ["n > 0"], "UPDATE t SET n = n - 1 WHERE n > 1"),
        ("UPDATE t SET n = n - 1 WHERE a = %s OR b = %s", ["n >= 0"],
         "UPDATE t SET n = n - 1 WHERE (a = %s OR b = %s) AND n >= 1"),
        ("UPDATE t SET n = n - 0.5 WHERE id = %s", ["n >= 0 AND n >= 0"],
         "UPDATE t SET n = n - 0.5 WHERE id = %s AND n >= 0.5"),
    ],
)  # fmt: skip
def test_atomic_guard_is_derived_from_the_invariant(statement: str, invariants: list[str], after: str) -> None:
    """The guard bounds the old value so that the new one keeps the invariant (one guard per distinct bound)."""
    edit = atomic_update(statement, invariants)
    assert edit.after == after
    assert edit.new_params == ()


def test_atomic_guard_with_a_placeholder_amount_copies_its_parameter() -> None:
    """``stock = stock - %s``: the guard repeats the amount as a new placeholder bound to the same value."""
    edit = atomic_update("UPDATE inventory SET stock = stock - %s WHERE sku = %s", ["stock >= 0"])
    assert edit.after == "UPDATE inventory SET stock = stock - %s WHERE sku = %s AND stock >= %s"
    assert edit.new_params == ((2, CopyParam(0)),)
    assert lock_of(edit.after) == "atomic"


@pytest.mark.parametrize(
    ("statement", "invariants"),
    [("UPDATE t SET n = %s WHERE id = %s", ["n >= 0"]), ("UPDATE t SET n = n - 1 WHERE id = %s", ["m >= 0"]),
     ("UPDATE t SET n = n - 1 WHERE id = %s", ["n = 0"]), ("SELECT n FROM t", ["n >= 0"])],
)  # fmt: skip
def test_atomic_guard_refusals(statement: str, invariants: list[str]) -> None:
    """No in-place change of a bounded column (or not an UPDATE): no guard can be derived."""
    with pytest.raises(RewriteError):
        atomic_update(statement, invariants)


def test_optimistic_adds_the_version_placeholder_where_it_belongs() -> None:
    """The version check is ANDed before RETURNING; its placeholder is the third, bound to the version read."""
    edit = optimistic("UPDATE orders SET status = %s, version = version + 1 WHERE id = %s RETURNING version", "version")
    assert edit.after == (
        "UPDATE orders SET status = %s, version = version + 1 WHERE id = %s AND version = %s RETURNING version"
    )
    assert edit.new_params == ((2, VarParam("version")),)
    assert lock_of(edit.after) == "optimistic"
    with pytest.raises(RewriteError):
        optimistic(edit.after, "version")


def test_idempotency_guard_adds_the_key_column_and_on_conflict() -> None:
    """The key column and its placeholder are appended; ON CONFLICT goes before RETURNING."""
    edit = idempotency_guard("INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id", "idempotency_key")
    assert edit.after == (
        "INSERT INTO charges (order_id, amount, idempotency_key) VALUES (%s, %s, %s)"
        " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id"
    )
    assert edit.new_params == ((2, VarParam("idempotency_key")),)
    assert lock_of(edit.after) == "upsert"


def test_idempotency_guard_with_the_key_already_inserted_only_adds_on_conflict() -> None:
    """An INSERT that already writes the key only needs the conflict clause, and no new parameter."""
    edit = idempotency_guard("INSERT INTO charges (order_id, idempotency_key) VALUES (%s, %s)", "idempotency_key")
    assert edit.after.endswith("VALUES (%s, %s) ON CONFLICT (idempotency_key) DO NOTHING")
    assert edit.new_params == ()


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO t (a) VALUES (%s), (%s)",
        "INSERT INTO t (a) SELECT 1",
        "INSERT INTO t (a) VALUES (%s) ON CONFLICT DO NOTHING",
        "INSERT INTO t (a) VALUES (%(a)s)",
    ],
)
def test_idempotency_guard_refusals(statement: str) -> None:
    """Multi-row and INSERT ... SELECT, already guarded inserts and named placeholders are refused."""
    with pytest.raises(RewriteError):
        idempotency_guard(statement, "idempotency_key")


def test_existing_row_query_selects_what_the_insert_returned() -> None:
    """The repeat path selects the RETURNING columns by key; without RETURNING there is nothing to answer with."""
    insert = "INSERT INTO public.charges (order_id) VALUES (%s) RETURNING id, amount"
    assert existing_row_query(insert, "idempotency_key") == (
        "SELECT id, amount FROM public.charges WHERE idempotency_key = %s"
    )
    assert existing_row_query("INSERT INTO charges (order_id) VALUES (%s)", "idempotency_key") is None


def test_percent_signs_stay_escaped() -> None:
    """A literal ``%%`` (psycopg's escaped percent) survives the rewrite in both forms."""
    edit = row_lock("SELECT a FROM t WHERE b LIKE 'x%%' AND id = %s")
    assert edit.after == "SELECT a FROM t WHERE b LIKE 'x%%' AND id = %s FOR UPDATE"
    assert edit.canonical == edit.after


def test_identifiers_from_configuration_are_quoted_when_needed() -> None:
    """A configured column that is not a plain lower-case name is quoted, never spliced raw."""
    edit = idempotency_guard("INSERT INTO t (a) VALUES (%s)", "Request Key")
    assert '(a, "Request Key")' in edit.after
    assert 'ON CONFLICT ("Request Key") DO NOTHING' in edit.after


# -- properties --------------------------------------------------------------------------------------------------
_COLUMNS = st.sampled_from(["id", "sku", "status", "amount", "owner_id", '"Mixed Case"'])
_VALUES = st.sampled_from(["%s", "%s", "7", "-2", "'a''b'", "'x%%'", "NULL"])
_GAP = st.sampled_from([" ", "  ", "\n    "])


@st.composite
def _condition(draw: st.DrawFn) -> str:
    column, value = draw(_COLUMNS), draw(_VALUES)
    ops = ["=", "<>", ">=", "<", "LIKE"] if "'" in value else ["=", "<>", ">=", "<"]
    op = "IS" if value == "NULL" else draw(st.sampled_from(ops))
    return f"{column} {op} {value}"


@st.composite
def _where(draw: st.DrawFn) -> tuple[str, bool]:
    """A WHERE clause keyed on ``id = %s``, then more conditions; and whether it stays a plain conjunction."""
    gap = draw(_GAP)
    terms = ["id = %s", *draw(st.lists(_condition(), max_size=3))]
    joins = [draw(st.sampled_from(["AND", "AND", "OR"])) for _ in terms[1:]]
    text = terms[0] + "".join(f"{gap}{j} {t}" for j, t in zip(joins, terms[1:], strict=True))
    if draw(st.booleans()) and len(terms) > 1:
        text = f"({text})"
    return f"WHERE {text}", "OR" not in joins


@st.composite
def selects(draw: st.DrawFn) -> tuple[str, bool]:
    """A single-table SELECT with placeholders, odd spacing, maybe ORDER BY / LIMIT / a semicolon."""
    gap = draw(_GAP)
    columns = ", ".join(draw(st.lists(_COLUMNS, min_size=1, max_size=3, unique=True)))
    table = draw(st.sampled_from(["orders", "public.orders", '"Stock Items"']))
    where, plain = draw(_where())
    tail = draw(st.sampled_from(["", f"{gap}ORDER BY amount", f"{gap}LIMIT %s", f"{gap}ORDER BY id DESC LIMIT 1"]))
    end = draw(st.sampled_from(["", ";", " ;"]))
    return f"SELECT {columns}{gap}FROM {table}{gap}{where}{tail}{end}", plain


@st.composite
def updates(draw: st.DrawFn) -> tuple[str, bool]:
    """An UPDATE with an in-place decrement of ``stock`` and a version bump, maybe RETURNING."""
    gap = draw(_GAP)
    amount = draw(st.sampled_from(["1", "2", "%s"]))
    extra = draw(st.sampled_from(["", ", status = %s", ", note = 'a%%'"]))
    where, plain = draw(_where())
    returning = draw(st.sampled_from(["", f"{gap}RETURNING stock", f"{gap}RETURNING id, version"]))
    sets = f"stock = stock - {amount}{extra}, version = version + 1"
    return f"UPDATE inventory{gap}SET {sets}{gap}{where}{returning}", plain


@settings(max_examples=150, deadline=None)
@given(selects())
def test_row_lock_property(case: tuple[str, bool]) -> None:
    """Any generated SELECT becomes a valid, placeholder-preserving SELECT ... FOR UPDATE the daemon sees as locked."""
    statement, plain = case
    edit = row_lock(statement)
    _check_insertions(statement, edit)
    if plain:
        assert lock_of(edit.after) == "for_update"


@settings(max_examples=150, deadline=None)
@given(updates(), st.sampled_from([["stock >= 0"], ["0 <= stock", "stock < 1000"]]))
def test_atomic_update_property(case: tuple[str, bool], invariants: list[str]) -> None:
    """Any generated decrement gets a valid guard; its placeholders are kept and the daemon sees it as atomic."""
    statement, plain = case
    edit = atomic_update(statement, invariants)
    _check_insertions(statement, edit)
    if plain:
        assert lock_of(edit.after) == "atomic"


@settings(max_examples=150, deadline=None)
@given(updates())
def test_optimistic_property(case: tuple[str, bool]) -> None:
    """Any generated UPDATE gets a valid version check with exactly one new placeholder."""
    statement, plain = case
    edit = optimistic(statement, "version")
    _check_insertions(statement, edit)
    assert [source for _, source in edit.new_params] == [VarParam("version")]
    if plain:
        assert lock_of(edit.after) == "optimistic"


def _check_insertions(before: str, edit: SqlEdit) -> None:
    """Re-parses; keeps every original placeholder; adds exactly the new ones; text and AST rewrites agree."""
    assert render(parse(edit.after))[0] == edit.canonical
    assert placeholders(edit.after) == placeholders(before) + len(edit.new_params)
    assert edit.after.count("%s") - edit.after.count("%%s") == before.count("%s") - before.count("%%s") + len(
        edit.new_params
    )
    rebuilt, shift = before, 0
    for at, text in edit.insertions:  # ascending offsets into ``before``
        rebuilt = rebuilt[: at + shift] + text + rebuilt[at + shift :]
        shift += len(text)
    assert rebuilt == edit.after  # nothing of the recorded statement is lost: the rewrite only inserts
