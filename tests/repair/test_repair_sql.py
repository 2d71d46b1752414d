"""Statement rewrites: each protected form, the refusals, and properties over generated SELECT/UPDATE statements."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.repair.classify import lock_of
from processors.repair.sql_edit import CopyParam, RewriteError, SqlEdit, VarParam, parse, placeholders, render
from processors.repair.sql_inserts import (
    equality_columns,
    existing_row_query,
    idempotency_guard,
    inserted_values,
    on_conflict_do_nothing,
    unique_index,
)
from processors.repair.sql_rewrite import atomic_update, implied_invariants, locked_aggregate, optimistic, row_lock


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


def test_share_lock_appends_for_share() -> None:
    """A reader's lock: ``FOR SHARE`` (writers wait, other readers do not)."""
    edit = row_lock("SELECT balance FROM ledger WHERE acct = %s", share=True)
    assert edit.after == "SELECT balance FROM ledger WHERE acct = %s FOR SHARE"
    assert lock_of(edit.after) == "for_share"


@pytest.mark.parametrize(
    ("statement", "after"),
    [
        ("SELECT count(*) FROM doctors WHERE shift = %s AND on_call",
         "SELECT count(*) FROM (SELECT * FROM doctors WHERE shift = %s AND on_call FOR UPDATE) AS doctors"),
        ("select sum(d.hours) from public.doctors d where d.shift = %s;",
         "select sum(d.hours) from (SELECT * FROM public.doctors d where d.shift = %s FOR UPDATE) AS d;"),
        ('SELECT count(*) FROM "On Call"', 'SELECT count(*) FROM (SELECT * FROM "On Call" FOR UPDATE) AS "On Call"'),
    ],
)  # fmt: skip
def test_an_aggregate_locks_its_rows_in_a_subquery(statement: str, after: str) -> None:
    """FOR UPDATE is refused next to an aggregate: the aggregate reads the rows through a subquery that locks them,
    under the table's name or alias (so qualified columns still resolve)."""
    edit = locked_aggregate(statement)
    assert edit.after == after
    assert render(parse(edit.after))[0] == edit.canonical


@pytest.mark.parametrize(
    "statement",
    ["SELECT a FROM t WHERE id = %s", "SELECT count(*) FROM t GROUP BY a", "SELECT count(*) FROM t ORDER BY 1",
     "SELECT count(*) FROM t JOIN u ON u.id = t.id", "SELECT count(*) FROM (SELECT 1) AS s",
     "SELECT count(*) FROM t FOR UPDATE", "UPDATE t SET a = 1"],
)  # fmt: skip
def test_locked_aggregate_refusals(statement: str) -> None:
    """Not an aggregate (lock it directly), grouped or ordered, several tables, a subquery, a lock: refused."""
    with pytest.raises(RewriteError):
        locked_aggregate(statement)


def test_an_insert_conflicts_on_the_columns_its_lookup_pins() -> None:
    """``ON CONFLICT (cols) DO NOTHING`` before RETURNING; the migration is an idempotent unique index on them."""
    insert = "INSERT INTO bookings (room, day, guest) VALUES (%s, %s, %s) RETURNING id"
    lookup = "SELECT id FROM bookings WHERE room = %s AND day = %s"
    columns = equality_columns(lookup)
    assert columns == ["room", "day"]
    edit = on_conflict_do_nothing(insert, columns)
    assert edit.after == (
        "INSERT INTO bookings (room, day, guest) VALUES (%s, %s, %s) ON CONFLICT (room, day) DO NOTHING RETURNING id"
    )
    assert edit.new_params == () and lock_of(edit.after) == "upsert"
    assert unique_index(insert, columns) == (
        "CREATE UNIQUE INDEX IF NOT EXISTS bookings_room_day_key ON bookings(room, day)"
    )
    assert unique_index('INSERT INTO app.t ("Day") VALUES (%s)', ["Day"]) == (
        'CREATE UNIQUE INDEX IF NOT EXISTS "t_Day_key" ON app.t("Day")'
    )
    assert inserted_values(insert, ["day", "room"]) == [1, 0]
    assert existing_row_query(insert, columns) == "SELECT id FROM bookings WHERE room = %s AND day = %s"


@pytest.mark.parametrize(
    ("lookup", "insert"),
    [("SELECT id FROM b WHERE room = %s AND day > %s", "INSERT INTO b (room, day) VALUES (%s, %s)"),
     ("SELECT id FROM b WHERE room = %s OR day = %s", "INSERT INTO b (room, day) VALUES (%s, %s)"),
     ("SELECT id FROM b", "INSERT INTO b (room) VALUES (%s)"),
     ("SELECT id FROM b WHERE room = %s", "INSERT INTO b (day) VALUES (%s)"),
     ("SELECT id FROM b WHERE room = %s", "INSERT INTO b (room) VALUES (%s) ON CONFLICT DO NOTHING")],
)  # fmt: skip
def test_no_unique_key_without_equalities_the_insert_sets(lookup: str, insert: str) -> None:
    """A range, an OR, no WHERE, a column the INSERT does not set, an INSERT already guarded: no conflict clause."""
    with pytest.raises(RewriteError):
        on_conflict_do_nothing(insert, equality_columns(lookup))


@pytest.mark.parametrize(
    ("statement", "guarded"),
    [("UPDATE inventory SET stock = stock - 1 WHERE sku = %s RETURNING stock",
      "UPDATE inventory SET stock = stock - 1 WHERE sku = %s AND stock >= 1 RETURNING stock"),
     ("UPDATE inventory SET stock = stock - %s WHERE sku = %s",
      "UPDATE inventory SET stock = stock - %s WHERE sku = %s AND stock >= %s"),
     ("UPDATE seats SET free = free - 2, sold = sold + 2 WHERE id = %s",
      "UPDATE seats SET free = free - 2, sold = sold + 2 WHERE id = %s AND free >= 2")],
)  # fmt: skip
def test_a_decrement_implies_its_guard(statement: str, guarded: str) -> None:
    """With no invariant configured, a column decremented in place is kept non-negative (increments are not bounded)."""
    assert atomic_update(statement, implied_invariants(statement)).after == guarded


def test_an_increment_implies_nothing() -> None:
    with pytest.raises(RewriteError):
        implied_invariants("UPDATE seats SET sold = sold + 1 WHERE id = %s")


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


@st.composite
def aggregates(draw: st.DrawFn) -> tuple[str, bool]:
    """A single-table aggregate with placeholders and odd spacing, maybe an alias, maybe a semicolon."""
    gap = draw(_GAP)
    function = draw(st.sampled_from(["count(*)", "sum(amount)", "max(id)", "COUNT(1)"]))
    table = draw(st.sampled_from(["orders", "public.orders", '"Stock Items"', "orders o"]))
    where, plain = draw(_where())
    end = draw(st.sampled_from(["", ";"]))
    return f"SELECT {function}{gap}FROM {table}{gap}{where}{end}", plain


@settings(max_examples=150, deadline=None)
@given(aggregates(), st.booleans())
def test_locked_aggregate_property(case: tuple[str, bool], share: bool) -> None:
    """Any generated aggregate becomes a valid, placeholder-preserving aggregate over a locking subquery."""
    statement, _ = case
    edit = locked_aggregate(statement, share=share)
    _check_insertions(statement, edit)
    assert ("FOR SHARE) AS " if share else "FOR UPDATE) AS ") in edit.after


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
