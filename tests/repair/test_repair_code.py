"""Code shapes beyond the shop: where SQL lives, "no row" handling, retries, constants, methods, imports."""

from __future__ import annotations

import textwrap
from itertools import pairwise
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.model.outputs import AccessInfo, IncidentEvent
from processors.repair import apply, plan_repairs, revert
from processors.repair.locate import call_sites
from processors.repair.source import SourceIndex
from tests.repair.cases import incident

READ = "SELECT stock FROM inventory WHERE sku = %s"


def write_module(root: Path, name: str, source: str) -> Path:
    path = root / "svc" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def rec(function: str, path: Path, statement: str, operation: str, trace: str, at: float = 0.0) -> AccessInfo:
    """One recorded, unprotected statement of ``function`` in ``path``."""
    return AccessInfo(trace_id=trace * 32, span_id=trace * 16, service="svc", version="1", function=function,
                      file=str(path), route="", operation=operation, lock="none", statement=statement, params=[],
                      set_values={}, start_unix_ms=at, offset_ms=at, error=False, exception="",
                      http_status=200)  # fmt: skip


def race(
    anomaly: str, table: str, function: str, path: Path, read: str, write: str, op: str = "write"
) -> IncidentEvent:
    """Two traces of ``function`` racing through ``read`` (when given) then ``write``."""
    accesses = [rec(function, path, read, "read", t) for t in "ab" if read]
    accesses += [rec(function, path, write, op, "a", 1), rec(function, path, write, op, "b", 2)]
    return incident(anomaly, table, f"{table}:1", accesses[-2], accesses[-1], accesses)


def patched(root: Path, event: IncidentEvent, strategy: str = "", **kwargs: object) -> str:
    """The module text after applying the primary plan, or its alternative ``strategy`` (and checks that revert
    restores it)."""
    path = Path(event.culprit.file)
    before = path.read_bytes()
    plan = plan_repairs(event, root=root, **kwargs)  # type: ignore[arg-type]
    if strategy:
        (plan,) = [a for a in plan.alternatives if a.strategy == strategy]
    apply(plan, root)
    text = path.read_text()
    revert(plan, root)
    assert path.read_bytes() == before
    return text


def test_unused_result_gets_a_rowcount_check_like_the_failed_read_check(tmp_path: Path) -> None:
    """A guarded UPDATE whose result is unused gets ``if cur.rowcount == 0:`` answering like the stock check."""
    path = write_module(tmp_path, "stock", '''
        def reserve(conn, sku, qty):
            with conn.transaction(), conn.cursor() as cur:
                row = cur.execute("SELECT stock FROM inventory WHERE sku = %s", (sku,)).fetchone()
                if row[0] < qty:
                    raise OutOfStock(sku, qty)
                cur.execute("UPDATE inventory SET stock = stock - %s WHERE sku = %s", (qty, sku))
    ''')  # fmt: skip
    update = "UPDATE inventory SET stock = stock - %s WHERE sku = %s"
    text = patched(tmp_path, race("invariant_violation", "inventory", "svc.stock.reserve", path, READ, update),
                   invariants={"inventory": ["stock >= 0"]})  # fmt: skip
    assert (
        "        # repair(atomic_update): no row if the guard fails; handled below like the failed check\n"
        '        cur.execute("UPDATE inventory SET stock = stock - %s WHERE sku = %s AND stock >= %s",'
        " (qty, sku, qty))\n"
        "        if cur.rowcount == 0:\n"
        "            raise OutOfStock(sku, qty)\n"
    ) in text


def test_assigned_fetch_without_handling_gets_a_none_check(tmp_path: Path) -> None:
    """``row = ....fetchone()`` used without a None check gets ``if row is None:`` with the failed check's answer."""
    path = write_module(tmp_path, "seats", '''
        def book(conn, show):
            with conn.transaction(), conn.cursor() as cur:
                (free,) = cur.execute("SELECT free FROM shows WHERE id = %s", (show,)).fetchone()
                if free < 1:
                    return {"booked": False}
                row = cur.execute("UPDATE shows SET free = free - 1 WHERE id = %s RETURNING free", (show,)).fetchone()
                return {"booked": True, "left": row[0]}
    ''')  # fmt: skip
    event = race("invariant_violation", "shows", "svc.seats.book", path, "SELECT free FROM shows WHERE id = %s",
                 "UPDATE shows SET free = free - 1 WHERE id = %s RETURNING free")  # fmt: skip
    text = patched(tmp_path, event, invariants={"shows": ["free >= 0"]})
    assert 'cur.execute("UPDATE shows SET free = free - 1 WHERE id = %s AND free >= 1"\n' in text
    assert '" RETURNING free", (show,)).fetchone()\n' in text
    assert '        if row is None:\n            return {"booked": False}\n        return {"booked": True' in text


def test_write_skew_locks_what_it_counts_or_runs_serializable_with_a_retry(tmp_path: Path) -> None:
    """Write skew: the count reads the rows through a subquery that locks them (FOR UPDATE is refused next to an
    aggregate); the alternative retries the transaction block on SerializationFailure at SERIALIZABLE, importing
    psycopg."""
    path = write_module(tmp_path, "oncall", '''
        """On-call rota."""

        from typing import Any


        def go_off_call(conn: Any, doctor: int, shift: int) -> bool:
            with conn.transaction():
                (n,) = conn.execute("SELECT count(*) FROM doctors WHERE shift = %s AND on_call", (shift,)).fetchone()
                if n < 2:
                    return False
                conn.execute("UPDATE doctors SET on_call = false WHERE id = %s", (doctor,))
            return True
    ''')  # fmt: skip
    count, leave = (
        "SELECT count(*) FROM doctors WHERE shift = %s AND on_call",
        "UPDATE doctors SET on_call = false WHERE id = %s",
    )
    event = race("write_skew", "doctors", "svc.oncall.go_off_call", path, count, leave)
    plan = plan_repairs(event, root=tmp_path)
    assert plan.strategy == "row_lock" and [r.statement_after for r in plan.repairs] == [
        "SELECT count(*) FROM (SELECT * FROM doctors WHERE shift = %s AND on_call FOR UPDATE) AS doctors"]  # fmt: skip
    assert '(SELECT * FROM doctors WHERE shift = %s AND on_call"\n' in plan.diff  # split at the line length
    (serializable,) = plan.alternatives
    apply(serializable, tmp_path)
    text = path.read_text()
    assert "from typing import Any\nimport psycopg\n" in text
    assert textwrap.dedent('''
        def go_off_call(conn: Any, doctor: int, shift: int) -> bool:
            # repair(stricter_isolation): SERIALIZABLE; a transaction aborted by a conflict is retried
            for attempt in range(3):
                try:
                    with conn.transaction():
                        conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    ''') in text  # fmt: skip
    assert "            break\n        except psycopg.errors.SerializationFailure:\n" in text
    compile(text, str(path), "exec")


def test_async_transactions_await_the_isolation_statement(tmp_path: Path) -> None:
    """In ``async with conn.transaction()`` the SET TRANSACTION statement is awaited on the async cursor."""
    path = write_module(tmp_path, "rota", '''
        import psycopg


        async def leave(conn, doctor, shift):
            async with conn.transaction(), conn.cursor() as cur:
                await cur.execute("SELECT on_call FROM doctors WHERE shift = %s", (shift,))
                await cur.execute("UPDATE doctors SET on_call = false WHERE id = %s", (doctor,))
    ''')  # fmt: skip
    read, write = "SELECT on_call FROM doctors WHERE shift = %s", "UPDATE doctors SET on_call = false WHERE id = %s"
    text = patched(tmp_path, race("write_skew", "doctors", "svc.rota.leave", path, read, write), "stricter_isolation")
    assert '                await cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")\n' in text
    assert text.count("import psycopg") == 1


def test_inline_fetchone_falls_back_to_the_existing_row(tmp_path: Path) -> None:
    """``cur.execute(INSERT ...).fetchone()`` inline becomes ``(... or cur.execute(SELECT by key).fetchone())``."""
    path = write_module(tmp_path, "pay", '''
        def pay(cur, order_id, idempotency_key):
            return cur.execute("INSERT INTO payments (order_id) VALUES (%s) RETURNING id", (order_id,)).fetchone()[0]
    ''')  # fmt: skip
    insert = "INSERT INTO payments (order_id) VALUES (%s) RETURNING id"
    text = patched(tmp_path, race("duplicate_apply", "payments", "svc.pay.pay", path, "", insert, "insert"))
    assert (
        '    return (cur.execute("INSERT INTO payments (order_id, idempotency_key) VALUES (%s, %s)"\n'
        '                       " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",'
        " (order_id, idempotency_key)).fetchone()\n"
        '            or cur.execute("SELECT id FROM payments WHERE idempotency_key = %s",'
        " (idempotency_key,)).fetchone())[0]\n"
    ) in text


def test_a_constant_only_unprotected_writers_use_is_edited_once(tmp_path: Path) -> None:
    """When every use of a SQL constant is repaired the same way, the constant itself is rewritten."""
    path = write_module(tmp_path, "accounts", '''
        LOAD = "SELECT balance FROM accounts WHERE id = %s"
        STORE = "UPDATE accounts SET balance = %s WHERE id = %s"


        def deposit(cur, account, amount):
            (balance,) = cur.execute(LOAD, (account,)).fetchone()
            cur.execute(STORE, (balance + amount, account))


        def withdraw(cur, account, amount):
            (balance,) = cur.execute(LOAD, (account,)).fetchone()
            cur.execute(STORE, (balance - amount, account))
    ''')  # fmt: skip
    load, store = "SELECT balance FROM accounts WHERE id = %s", "UPDATE accounts SET balance = %s WHERE id = %s"
    event = race("lost_update", "accounts", "svc.accounts.deposit", path, load, store)
    sites = [
        rec("svc.accounts.withdraw", path, load, "read", "c"),
        rec("svc.accounts.withdraw", path, store, "write", "c"),
    ]
    text = patched(tmp_path, event, sites=sites)
    assert 'LOAD = "SELECT balance FROM accounts WHERE id = %s FOR UPDATE"\n' in text
    assert text.count("cur.execute(LOAD, (account,))") == 2


def test_sql_in_a_local_variable_is_extended_at_the_call(tmp_path: Path) -> None:
    """SQL held by a local variable is not rewritten in place: the call appends the lock to it."""
    path = write_module(tmp_path, "local", '''
        class Repo:
            def rename(self, cur, item, name):
                sql = "SELECT name FROM items WHERE id = %s"
                cur.execute(sql, (item,))
                cur.execute("UPDATE items SET name = %s WHERE id = %s", (name, item))
    ''')  # fmt: skip
    event = race("lost_update", "items", "svc.local.Repo.rename", path, "SELECT name FROM items WHERE id = %s",
                 "UPDATE items SET name = %s WHERE id = %s")  # fmt: skip
    text = patched(tmp_path, event)
    assert '        cur.execute(sql + " FOR UPDATE", (item,))\n' in text


def test_recorded_whitespace_need_not_match_the_code(tmp_path: Path) -> None:
    """The code's own line breaks and spacing are matched loosely and kept (triple quotes too); the lock follows."""
    path = write_module(tmp_path, "spaced", '''
        def f(cur, i):
            cur.execute("""
                SELECT a,  b
                  FROM t
                 WHERE id = %s
            """, (i,))
            cur.execute("UPDATE t SET a = 1 WHERE id = %s", (i,))
    ''')  # fmt: skip
    event = race(
        "lost_update", "t", "svc.spaced.f", path, "SELECT a, b FROM t WHERE id = %s", "UPDATE t SET a = 1 WHERE id = %s"
    )
    text = patched(tmp_path, event)
    assert (
        '    cur.execute("""\n        SELECT a,  b\n          FROM t\n         WHERE id = %s FOR UPDATE\n    """'
        in text
    )


def test_a_statement_that_is_not_in_the_code_is_reported_not_guessed(tmp_path: Path) -> None:
    """Telemetry that no longer matches the code (renamed table) yields a note and no edit."""
    path = write_module(tmp_path, "gone", '''
        def f(cur, i):
            cur.execute("SELECT a FROM other WHERE id = %s", (i,))
            cur.execute("UPDATE t SET a = 1 WHERE id = %s", (i,))
    ''')  # fmt: skip
    event = race(
        "lost_update", "t", "svc.gone.f", path, "SELECT a FROM t WHERE id = %s", "UPDATE t SET a = 1 WHERE id = %s"
    )
    plan = plan_repairs(event, root=tmp_path)
    assert not plan.repairs and not plan.diff
    assert any("not found in svc.gone.f" in n for n in plan.notes)


def test_unparseable_source_is_a_note_not_a_crash(tmp_path: Path) -> None:
    """A writer whose file does not parse is reported; the other writers are still repaired."""
    good = write_module(tmp_path, "good", '''
        def f(cur, i):
            cur.execute("SELECT a FROM t WHERE id = %s", (i,))
            cur.execute("UPDATE t SET a = 1 WHERE id = %s", (i,))
    ''')  # fmt: skip
    bad = write_module(tmp_path, "bad", "def g(cur, i):\n    cur.execute(\n")
    read, write = "SELECT a FROM t WHERE id = %s", "UPDATE t SET a = 1 WHERE id = %s"
    event = race("lost_update", "t", "svc.good.f", good, read, write)
    plan = plan_repairs(event, root=tmp_path, sites=[rec("svc.bad.g", bad, read, "read", "c"),
                                                     rec("svc.bad.g", bad, write, "write", "c")])  # fmt: skip
    assert [r.function for r in plan.repairs] == ["svc.good.f"]
    assert any(n.startswith("svc.bad.g: row_lock does not apply") for n in plan.notes)


_PIECES = st.lists(st.sampled_from(["literal", "constant"]), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=_PIECES, cuts=st.lists(st.integers(min_value=1, max_value=60), max_size=3, unique=True))
def test_the_rewrite_lands_wherever_the_sql_is_split(
    tmp_path_factory: object, kinds: list[str], cuts: list[int]
) -> None:
    """However the statement is split into literals and constants, the patched call runs exactly the protected SQL."""
    root: Path = tmp_path_factory.mktemp("split")  # type: ignore[attr-defined]
    statement = "SELECT status, version, amount FROM orders WHERE id = %s"
    bounds = sorted({0, len(statement), *(c for c in cuts if c < len(statement))})
    chunks = [statement[a:b] for a, b in pairwise(bounds)]
    constants, parts = [], []
    for i, chunk in enumerate(chunks):
        if kinds[i % len(kinds)] == "constant":
            constants.append(f"Q{i} = {chunk!r}")
            parts.append(f"Q{i}")
        else:
            parts.append(repr(chunk))
    shared = [f"def other(cur):\n    cur.execute({' + '.join(parts)} + ' FOR SHARE')"]  # keeps constants shared
    source = "\n".join(constants) + f"\n\n\ndef f(cur, i):\n    cur.execute({' + '.join(parts)}, (i,))\n"
    source += '    cur.execute("UPDATE orders SET status = %s WHERE id = %s", ("x", i))\n\n\n' + shared[0] + "\n"
    path = write_module(root, "split", source)
    event = race("lost_update", "orders", "svc.split.f", path, statement, "UPDATE orders SET status = %s WHERE id = %s")
    plan = plan_repairs(event, root=root)
    apply(plan, root)
    index = SourceIndex(root)
    assert call_sites(index, path, "svc.split.f", statement + " FOR UPDATE")
    assert call_sites(index, path, "svc.split.other", statement + " FOR SHARE")  # the other user is untouched
    compile(path.read_text(), str(path), "exec")
