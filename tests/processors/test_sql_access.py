"""SqlAccessExtractor: DB client spans → per-row Access events."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.model.events import (
    Access,
    CdcOp,
    DbCall,
    DbOperation,
    LockMode,
    Resource,
    RowChange,
    Scalar,
    SpanKind,
    StatusCode,
)
from processors.model.span import Span
from processors.sql import SqlAccessExtractor, unkeyed
from processors.sql.values import predicate_text

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def db_span(
    statement: str,
    params: tuple[Scalar, ...] = (),
    named: tuple[tuple[str, Scalar], ...] = (),
    *,
    tx_id: str = "",
    row_version: str = "",
    status: StatusCode = StatusCode.UNSET,
) -> Span:
    return Span(
        trace_id=TRACE,
        span_id="00f067aa0ba902b7",
        parent_id="53995c3f42cd8ad8",
        name="UPDATE shop",
        kind=SpanKind.CLIENT,
        start_ns=1_000_000_000,
        end_ns=1_002_000_000,
        status=status,
        resource=Resource(service="checkout", version="1.4.2"),
        code_function="own_function",
        idempotency_key="idem-1",
        links=("a" * 32,),
        db=DbCall(
            system="postgresql",
            statement=statement,
            params=params,
            named_params=named,
            tx_id=tx_id,
            row_version=row_version,
        ),
    )


def one(ex: SqlAccessExtractor, span: Span, **kw: str) -> Access:
    got = ex.accesses(span, **kw)
    assert len(got) == 1, got
    return got[0]


@pytest.fixture
def ex() -> SqlAccessExtractor:
    return SqlAccessExtractor(
        key_columns={"inventory": ["sku"], "orders": ["id"], "payments": ["id"]},
        insert_identity={"charges": ["order_id"]},
    )


def test_psycopg_percent_s_binds_parameters_tuple(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("SELECT * FROM orders WHERE id = %s AND note LIKE 'x%%' AND status = %s", (8812, "new")))
    assert (a.entity, a.table, a.operation, a.lock) == ("orders:8812", "orders", DbOperation.READ, LockMode.NONE)
    assert a.predicates == (("status", "=", "new"),)


def test_psycopg_named_placeholders(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("DELETE FROM orders WHERE id = %(oid)s", named=(("oid", 5),)))
    assert (a.entity, a.operation) == ("orders:5", DbOperation.DELETE)


def test_dollar_params_index_into_params(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("UPDATE orders SET status = $2 WHERE id = $1", (77, "paid")))
    assert a.entity == "orders:77"
    assert a.set_values == (("status", "paid"),)


def test_qmark_params_in_order_of_appearance_not_in_strings(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("UPDATE orders SET note = '?', status = ? WHERE id = ? /* ? */", ("paid", 9)))
    assert a.entity == "orders:9"
    assert a.set_values == (("note", "?"), ("status", "paid"))


def test_colon_named_params(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("SELECT * FROM orders WHERE id = :oid AND status = :st", named=(("oid", 3), ("st", "x"))))
    assert a.entity == "orders:3"
    assert a.predicates == (("status", "=", "x"),)


def test_select_for_update_and_for_share(ex: SqlAccessExtractor) -> None:
    upd = one(ex, db_span("SELECT * FROM orders WHERE id = ? FOR UPDATE", (1,)))
    share = one(ex, db_span("SELECT * FROM orders WHERE id = ? FOR SHARE", (1,)))
    no_key = one(ex, db_span("SELECT * FROM orders WHERE id = ? FOR NO KEY UPDATE SKIP LOCKED", (1,)))
    assert (upd.lock, share.lock, no_key.lock) == (LockMode.FOR_UPDATE, LockMode.FOR_SHARE, LockMode.FOR_UPDATE)


def test_optimistic_update(ex: SqlAccessExtractor) -> None:
    a = one(
        ex,
        db_span("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND version = ?", ("paid", 8812, 3)),
    )
    assert (a.entity, a.operation, a.lock) == ("orders:8812", DbOperation.WRITE, LockMode.OPTIMISTIC)
    assert a.set_values == (("status", "paid"), ("version", "version + 1"))
    assert a.set_exprs == ("version",)
    assert a.predicates == (("version", "=", 3),)


def test_atomic_guarded_in_place_update(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("UPDATE inventory SET stock = stock - $1 WHERE sku = $2 AND stock >= $1", (2, "SKU-9")))
    assert (a.entity, a.lock) == ("inventory:SKU-9", LockMode.ATOMIC)
    assert a.predicates == (("stock", ">=", 2),)
    assert a.set_values == (("stock", "stock - 2"),)


def test_unguarded_in_place_update(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("UPDATE inventory SET stock = stock - 1 WHERE sku = ?", ("SKU-9",)))
    assert (a.entity, a.lock) == ("inventory:SKU-9", LockMode.NONE)
    assert a.set_values == (("stock", "stock - 1"),)
    assert a.set_exprs == ("stock",)


def test_insert_without_key_uses_insert_identity(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("INSERT INTO charges (order_id, amount) VALUES (%s, %s)", (8812, 12.5)))
    assert (a.entity, a.operation, a.lock) == ("charges:order_id=8812", DbOperation.INSERT, LockMode.NONE)
    assert a.set_values == (("order_id", 8812), ("amount", 12.5))
    b = one(ex, db_span("INSERT INTO charges (order_id, amount) VALUES (%s, %s)", (8812, 99)))
    assert b.entity == a.entity  # duplicate charges for one order collide


def test_insert_with_key_column_and_multi_row(ex: SqlAccessExtractor) -> None:
    got = ex.accesses(db_span("INSERT INTO orders (id, status) VALUES (1, 'new'), (?, ?)", (2, "old")))
    assert [a.entity for a in got] == ["orders:1", "orders:2"]
    assert got[1].set_values == (("id", 2), ("status", "old"))


def test_insert_on_conflict_is_upsert(ex: SqlAccessExtractor) -> None:
    stmt = "INSERT INTO payments (amount, idempotency_key) VALUES (?, ?) ON CONFLICT (idempotency_key) DO NOTHING"
    a = one(ex, db_span(stmt, (10, "k-1")))
    assert (a.entity, a.operation, a.lock) == ("payments:idempotency_key=k-1", DbOperation.INSERT, LockMode.UPSERT)
    charge = "INSERT INTO charges (order_id, amount) VALUES (?, ?) ON CONFLICT (order_id) DO UPDATE SET amount = 1"
    assert one(ex, db_span(charge, (5, 1))).entity == "charges:order_id=5"


def test_insert_whose_key_the_database_assigns_is_a_predicate_access(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("INSERT INTO audit (msg, at) VALUES (?, ?)", ("hi", 3)))
    assert (a.entity, a.keyed, a.operation, a.set_values) == ("audit:*", False, DbOperation.INSERT,
                                                              (("msg", "hi"), ("at", 3)))  # fmt: skip
    assert ex.accesses(db_span("INSERT INTO orders (id) SELECT id FROM old_orders")) == ()
    assert ex.counters["insert_no_values"] == 1
    assert ex.unkeyed.peek("audit") == 1


def test_delete(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("DELETE FROM orders WHERE id = ?", (7,)))
    assert (a.entity, a.operation, a.lock) == ("orders:7", DbOperation.DELETE, LockMode.NONE)


def test_in_list_gives_one_access_per_value(ex: SqlAccessExtractor) -> None:
    got = ex.accesses(db_span("UPDATE orders SET status = ? WHERE id IN (?, ?) AND status = 'new'", ("x", 1, 2)))
    assert [a.entity for a in got] == ["orders:1", "orders:2"]
    assert all(a.set_values == (("status", "x"),) and a.predicates == (("status", "=", "new"),) for a in got)


def test_schema_qualified_table_and_casts(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("SELECT o.* FROM public.orders AS o WHERE o.id = ?::bigint FOR UPDATE", ("8812",)))
    assert (a.entity, a.table, a.lock) == ("orders:8812", "orders", LockMode.FOR_UPDATE)
    cfg = SqlAccessExtractor(key_columns={"shop.items": ["code"]})
    assert one(cfg, db_span("DELETE FROM shop.items WHERE code = ?", ("c1",))).entity == "items:c1"


def test_span_fields_copied(ex: SqlAccessExtractor) -> None:
    span = db_span("UPDATE orders SET status = ? WHERE id = ?", ("paid", 1), tx_id="771", row_version="3")
    a = one(ex, span, function="pay", file="app/pay.py")
    assert (a.trace_id, a.span_id, a.service, a.version) == (TRACE, "00f067aa0ba902b7", "checkout", "1.4.2")
    assert (a.start_ns, a.end_ns, a.tx_id, a.read_version) == (1_000_000_000, 1_002_000_000, "771", "3")
    assert (a.function, a.file, a.idempotency_key, a.links) == ("pay", "app/pay.py", "idem-1", ("a" * 32,))
    assert span.db is not None
    assert (a.params, a.statement) == (("paid", 1), span.db.statement)
    assert not a.error
    failed = one(ex, db_span("DELETE FROM orders WHERE id = 1", status=StatusCode.ERROR))
    assert failed.error and failed.function == "own_function"


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ("BEGIN", "not_dml"),
        ("COMMIT", "not_dml"),
        ("SET statement_timeout = 5000", "not_dml"),
        ("this is ((( not sql", "unparseable"),
        ("SELECT * FROM orders o JOIN items i ON i.order_id = o.id WHERE o.id = 1", "multi_table"),
        ("WITH x AS (SELECT 1) SELECT * FROM orders WHERE id = 1", "cte"),
        ("SELECT 1", "no_table"),
        ("SELECT 1 UNION SELECT 2", "set_operation"),
        ("BEGIN; UPDATE orders SET a = 1 WHERE id = 1", "multi_statement"),
    ],
)
def test_not_keyable_statements_are_counted(ex: SqlAccessExtractor, statement: str, reason: str) -> None:
    assert ex.accesses(db_span(statement)) == ()
    assert ex.counters[reason] == 1


def test_missing_parameter_is_still_an_access(ex: SqlAccessExtractor) -> None:
    """A keyed statement whose key values are not on the span (stock instrumentation) is a predicate access of the
    table that keeps its shape (operation, lock, the columns it filters on and sets), counted, never dropped."""
    read = one(ex, db_span("SELECT * FROM orders WHERE id = ? FOR UPDATE"))
    assert (read.entity, read.keyed, read.exact, read.keying) == ("orders:*", False, False, "predicate")
    assert (read.operation, read.lock, read.filters, read.unbound, read.unbound_key) == (
        DbOperation.READ, LockMode.FOR_UPDATE, ("id",), (("id", "="),), True)  # fmt: skip
    write = one(ex, db_span("UPDATE orders SET status = %s, amount = amount - 1 WHERE id = %s AND status = 'new'"))
    assert (write.entity, write.operation, write.unbound_key) == ("orders:*", DbOperation.WRITE, True)
    assert write.filters == ("id", "status") and write.set_columns == ("status", "amount")
    assert write.predicates == (("status", "=", "new"),) and write.set_exprs == ("amount",)
    assert ex.counters["unbound_key"] == 2 and not any(ex.telemetry.dropped.values())


def test_bound_parameters_still_win(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("UPDATE orders SET status = %s WHERE id = %s", ("paid", 7)))
    assert (a.entity, a.keyed, a.keying, a.unbound, a.unbound_key) == ("orders:7", True, "bound", (), False)
    assert (a.filters, a.set_columns, a.set_values) == (("id",), ("status",), (("status", "paid"),))


def test_a_predicate_access_names_the_terms_whose_values_the_span_lacks(ex: SqlAccessExtractor) -> None:
    """One IN-list value missing leaves that term out, inexact and named as unbound; a named parameter binds."""
    a = one(ex, db_span("SELECT * FROM orders WHERE status = %s AND amount IN (%s, %s)", ("new", 5)))
    assert (a.entity, a.keyed, a.exact) == ("orders:*", False, False)
    assert (a.predicates, a.unbound) == ((("status", "=", "new"),), (("amount", "IN"),))
    named = one(ex, db_span("SELECT * FROM orders WHERE status = :s AND amount > :m", named=((":s", "new"),)))
    assert (named.predicates, named.unbound, named.exact) == ((("status", "=", "new"),), (("amount", ">"),), False)
    full = one(ex, db_span("SELECT * FROM orders WHERE status = %s AND amount IN (%s, %s)", ("new", 5, 6)))
    assert (full.predicates[1], full.unbound, full.exact) == (("amount", "IN", (5, 6)), (), True)


def test_a_statement_yielding_no_access_is_a_counted_drop(ex: SqlAccessExtractor) -> None:
    assert ex.accesses(db_span("COMMIT")) == ()
    assert ex.accesses(db_span("SELEC nonsense (")) == ()
    assert {k: n for k, n in ex.telemetry.dropped.items() if n} == {"not_dml": 1, "unparseable": 1}


def test_statements_that_name_no_row_by_key_are_predicate_accesses(ex: SqlAccessExtractor) -> None:
    a = one(ex, db_span("SELECT count(*) FROM orders WHERE status = %s AND amount >= %s AND NOT flagged", ("new", 5)))
    assert (a.entity, a.keyed, a.exact) == ("orders:*", False, True)
    assert a.predicates == (("status", "=", "new"), ("amount", ">=", 5), ("flagged", "=", False))
    ored = one(ex, db_span("SELECT * FROM orders WHERE id = 1 OR id = 2"))
    assert (ored.entity, ored.keyed, ored.predicates) == ("orders:*", False, ())  # no conjunct terms, but
    assert ored.exact and ored.where is not None  # the whole WHERE, as a tree every part of which is evaluable
    odd = one(ex, db_span("SELECT * FROM orders WHERE id = 1 OR my_fn(id)"))
    assert (odd.exact, odd.where is not None) == (False, True)  # a function it cannot evaluate: not wholly known
    listed = one(ex, db_span("DELETE FROM orders WHERE status IN (%s, %s)", ("a", "b")))
    assert (listed.operation, listed.predicates) == (DbOperation.DELETE, (("status", "IN", ("a", "b")),))
    assert ex.unkeyed.peek("orders") == 4


def test_a_statement_without_parameters_is_bound_once_and_a_span_with_them_is_bound_alone(
    ex: SqlAccessExtractor,
) -> None:
    statement = "SELECT * FROM orders WHERE status = %s OR amount > 5"
    bare, again = one(ex, db_span(statement)), one(ex, db_span(statement))
    given = one(ex, db_span(statement, ("new",)))
    assert bare.where is not None and again.where is bare.where  # one binding shared by the parameterless spans
    assert given.where is not None and given.where[1] == (("new",),) and bare.where[1] == ((),)
    assert predicate_text(bare.predicates, bare.exact, bare.where) == "status = ? OR amount > 5"
    assert predicate_text(given.predicates, given.exact, given.where) == "status = 'new' OR amount > 5"
    assert (bare.exact, given.exact) == (False, True)
    assert ex.counters["predicate_undecidable_unbound_parameter"] == 2  # counted for each parameterless span


def test_the_shared_parameterless_bindings_starting_again_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unkeyed, "NO_PARAMS_SHAPES", 2)
    monkeypatch.setattr(unkeyed, "_NO_PARAMS", {})  # (process-wide: other tests' shapes left out)
    ex = SqlAccessExtractor()
    assert ex.telemetry.dropped["shared_cache_reset"] == 0  # declared: visible before the first reset
    before = unkeyed.resets()
    for n in range(5):  # five shapes through a cache of two: it starts again at the third and the fifth
        one(ex, db_span(f"SELECT * FROM orders WHERE amount > {n}"))
    assert unkeyed.resets() - before == 2
    assert ex.telemetry.dropped["shared_cache_reset"] == 2
    one(ex, db_span("SELECT * FROM orders WHERE amount > 1"))  # no reset: nothing more counted
    assert ex.telemetry.dropped["shared_cache_reset"] == 2


def test_a_table_with_no_known_key_gives_predicate_accesses_until_debezium_names_it() -> None:
    ex = SqlAccessExtractor()
    stmt = "UPDATE doctors SET on_call = false WHERE name = %s"
    before = one(ex, db_span(stmt, ("alice",)))
    assert (before.entity, before.keyed, before.predicates) == ("doctors:*", False, (("name", "=", "alice"),))
    assert before.set_values == (("on_call", False),)
    learned = RowChange(table="public.doctors", op=CdcOp.UPDATE, key=(("name", "alice"),), before=None, after=None,
                        commit_ts_ms=1, ts_ms=1, lsn=1, tx_id="")  # fmt: skip
    assert ex.keys.learn(learned) and not ex.keys.learn(learned)
    after = one(ex, db_span(stmt, ("alice",)))  # the cached shape is recomputed with the learned key
    assert (after.entity, after.keyed, after.set_values) == ("doctors:alice", True, (("on_call", False),))
    assert ex.keys.fresh() == {"doctors": ("name",)} and ex.keys.fresh() == {}
    configured = SqlAccessExtractor(key_columns={"doctors": ["name", "shift"]})
    configured.keys.learn(learned)  # the configuration wins over what Debezium says
    assert one(configured, db_span(stmt, ("alice",))).keyed is False


def test_cache_hit_on_repeat_and_bounded_lru() -> None:
    ex = SqlAccessExtractor(cache_size=2, key_columns={"orders": ["id"]})
    stmt = "UPDATE orders SET status = ? WHERE id = ?"
    assert one(ex, db_span(stmt, ("a", 1))).entity == "orders:1"
    assert one(ex, db_span(stmt, ("b", 2))).set_values == (("status", "b"),)
    assert (ex.counters["cache_misses"], ex.counters["cache_hits"]) == (1, 1)
    ex.accesses(db_span("DELETE FROM orders WHERE id = 1"))
    ex.accesses(db_span("DELETE FROM orders WHERE id = 2"))
    assert ex.telemetry.dropped["statement_cache"] == 1
    ex.accesses(db_span(stmt, ("c", 3)))  # evicted: parsed again
    assert ex.counters["cache_misses"] == 4


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    statement=st.one_of(
        st.text(max_size=200),
        st.lists(
            st.sampled_from(
                [
                    "SELECT",
                    "UPDATE",
                    "INSERT",
                    "DELETE",
                    "FROM",
                    "WHERE",
                    "SET",
                    "VALUES",
                    "INTO",
                    "ON",
                    "CONFLICT",
                    "DO",
                    "NOTHING",
                    "FOR",
                    "SHARE",
                    "AND",
                    "OR",
                    "IN",
                    "(",
                    ")",
                    ",",
                    "=",
                    ">=",
                    "-",
                    "+",
                    "?",
                    "%s",
                    "%%",
                    "$1",
                    "$0",
                    ":x",
                    "'",
                    '"',
                    ";",
                    "::",
                    "id",
                    "version",
                    "stock",
                    "orders",
                    "public.",
                    "*",
                    "1",
                    "'a'",
                    "NULL",
                ]
            ),
            max_size=25,
        ).map(" ".join),
    ),
    params=st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=5), st.booleans()), max_size=4),
)
def test_never_raises_on_arbitrary_text(statement: str, params: list[Scalar]) -> None:
    log = logging.getLogger("sqlglot")
    level = log.level
    log.setLevel(logging.ERROR)  # unsupported statements are logged as falling back to Command
    try:
        for a in SqlAccessExtractor().accesses(db_span(statement, tuple(params))):
            assert a.entity.startswith(a.table + ":") and (a.keyed or a.entity == a.table + ":*")
    finally:
        log.setLevel(level)


def test_an_aggregate_over_a_locking_subquery_reads_and_locks_the_subquery_rows(ex: SqlAccessExtractor) -> None:
    stmt = "SELECT count(*) FROM (SELECT * FROM doctors WHERE shift = %s AND on_call FOR UPDATE) AS doctors"
    a = one(ex, db_span(stmt, (3,)))
    assert (a.entity, a.operation, a.lock) == ("doctors:*", DbOperation.READ, LockMode.FOR_UPDATE)
    assert a.predicates == (("shift", "=", 3), ("on_call", "=", True))
