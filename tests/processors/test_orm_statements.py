"""The SQL that ORMs and drivers really send, as their stock instrumentations report it, read into the right shape.

The statements come from ``fixtures/orm_statements.json``, recorded by ``tests/orm_recorder.py`` from SQLAlchemy 2
(ORM and Core, on psycopg2, psycopg 3 and asyncpg), Django's ORM, asyncpg and psycopg2 against a real PostgreSQL,
each traced by its stock OpenTelemetry instrumentation with default options (no parameter values), plus JDBC
statements written as Hibernate sends them after the OpenTelemetry Java agent's sanitiser, and the corpus's Java
service's JDBC statements as the agent reported them (``jdbc+otel-java-agent-recorded``, copied from its span
exporter's output). Each span goes through the SDK's OTLP encoder and the daemon's decoder, then the access extractor;
the shape it reads (table, operation, lock, which placeholder feeds the key, the columns set and filtered) is compared
with what the statement does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from processors.model.events import DbOperation
from processors.model.span import Span
from processors.sql import SqlAccessExtractor
from processors.sql.shape import Shape
from processors.sql.syntax import Const, Expr, Named, Pos, Ref
from streamer.decode import decode_traces_proto
from tests.otlp_factory import to_proto

FIXTURE = Path(__file__).parent / "fixtures" / "orm_statements.json"
KEYS = {"accounts": ["id"], "app_account": ["id"],  # as Debezium's message keys teach them
        "corpus_accounts": ["account_no"], "corpus_doctors": ["name"], "corpus_bookings": ["booking_id"],
        "corpus_bookings_safe": ["booking_id"]}  # fmt: skip


def _recorded() -> list[tuple[str, str, Span]]:
    """(stack, step, decoded span) of every recorded DB span that has a statement, in recording order."""
    records: list[dict[str, Any]] = json.loads(FIXTURE.read_text())
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("orm")
    for r in records:
        attributes = {k: v["bytes"].encode() if isinstance(v, dict) else v for k, v in r["attributes"].items()}
        tracer.start_span(r["name"], kind=SpanKind[r["kind"]], attributes=attributes).end()
    spans = decode_traces_proto(to_proto(exporter.get_finished_spans()))
    assert len(spans) == len(records)
    return [(r["stack"], r["step"], s) for r, s in zip(records, spans, strict=True) if s.db and s.db.statement]


RECORDED = _recorded()


def _ref(ref: Ref | tuple[Ref, ...]) -> str:
    if isinstance(ref, tuple):
        return "(" + ", ".join(map(_ref, ref)) + ")"
    if isinstance(ref, Named):
        return ":" + ref.name
    if isinstance(ref, Pos):
        return f"${ref.index + 1}"
    if isinstance(ref, Const):
        return repr(ref.value)
    assert isinstance(ref, Expr)
    return "expr"


def summary(shape: Shape | str) -> str:
    """``table op lock key=<refs> set=<columns> where=<column op ref ...>`` (``pred`` for a predicate access)."""
    if isinstance(shape, str):
        return shape
    if shape.keyed:
        keys = " | ".join(",".join(map(_ref, t.key)) for t in shape.targets)
        sets = [c for c, _ in shape.targets[0].set_values]
        head = f"key={keys}"
    else:
        sets = [c for c, _ in shape.set_values]
        head = "pred" if shape.operation is not DbOperation.INSERT else f"pred rows={getattr(shape, 'rows', 1)}"
    where = " ".join(f"{c}{o}{_ref(r)}" for c, o, r in shape.predicates)
    text = f"{shape.table} {shape.operation.value} {shape.lock.value} {head} set={','.join(sets)} where={where}"
    return text if shape.exact else text + " inexact"


def shapes(stack: str) -> dict[str, list[str]]:
    """step → the summary of each of its statements, in order."""
    extractor = SqlAccessExtractor(key_columns=KEYS)
    out: dict[str, list[str]] = {}
    for s, step, span in RECORDED:
        if s == stack:
            assert span.db is not None
            out.setdefault(step, []).append(summary(extractor._shape(span.db.statement)))
    return out


def _sqlalchemy(p: str, *, executemany_rows: int) -> dict[str, list[str]]:
    """What SQLAlchemy 2's ORM and Core statements do; ``p`` renders a placeholder of the driver's style."""
    get = f"accounts read none key={p('pk_1', 1)} set= where="
    versioned = (f"accounts write optimistic key={p('accounts_id', 3)} set=balance,version "
                 f"where=version={p('accounts_version', 4)}")  # fmt: skip
    return {
        "orm_get": [get],
        "orm_change_commit": [versioned],
        "orm_select_where": [f"accounts read none pred set= where=owner={p('owner_1', 1)}"],
        "orm_for_update": [f"accounts read for_update key={p('id_1', 1)} set= where="],
        "orm_for_no_key_update": [f"accounts read for_update key={p('id_1', 1)} set= where="],
        "orm_atomic_update": [
            f"accounts write atomic key={p('id_1', 2)} set=balance where=balance>={p('balance_2', 3)}"
        ],
        "orm_insert_returning": ["accounts insert none pred rows=1 set=owner,balance,version where="],
        "orm_bulk_insert": ["accounts insert none pred rows=3 set=owner,balance,version where="],
        "orm_executemany": [f"accounts insert none pred rows={executemany_rows} set=owner,balance,version where="],
        "orm_savepoint": ["not_dml", get, versioned, "not_dml"],
        "orm_delete": [f"accounts read none pred set= where=owner={p('owner_1', 1)}",
                       f"accounts delete optimistic key={p('id', 1)} set= where=version={p('version', 2)}"],
        "core_select": [f"accounts read none key={p('id_1', 1)} set= where="],
        "core_update": [f"accounts write none key={p('id_1', 2)} set=balance where="],
        "core_insert_returning": ["accounts insert none pred rows=1 set=owner,balance,version where="],
        "core_delete": [f"accounts delete none pred set= where=owner={p('owner_1', 1)}"],
    }  # fmt: skip


def _named(name: str, _: int) -> str:
    return ":" + name


def test_sqlalchemy_on_psycopg2() -> None:
    """``WHERE accounts.id = %(pk_1)s``, version-checked updates, insertmanyvalues (INSERT ... SELECT FROM VALUES
    ... RETURNING) and the multi-row VALUES of an executemany, SAVEPOINT / RELEASE SAVEPOINT."""
    assert shapes("sqlalchemy+psycopg2") == _sqlalchemy(_named, executemany_rows=3)


def test_sqlalchemy_on_psycopg3() -> None:
    """The same with casts around every placeholder: ``%(pk_1)s::INTEGER``, ``p0::VARCHAR`` over ``VALUES``."""
    assert shapes("sqlalchemy+psycopg") == _sqlalchemy(_named, executemany_rows=1)


def test_sqlalchemy_on_asyncpg() -> None:
    """SQLAlchemy's asyncpg dialect: ``$1::INTEGER``; its unguarded ``balance - $1`` is relative, not a guard."""
    expected = _sqlalchemy(lambda _, n: f"${n}", executemany_rows=3)
    positional = {"orm_get": ["accounts read none key=$1 set= where="],
                  "orm_for_update": ["accounts read for_update key=$1 set= where="],
                  "orm_atomic_update": ["accounts write none key=$2 set=balance where="]}  # fmt: skip
    expected = {k: positional.get(k, v) for k, v in expected.items()}
    recorded = shapes("sqlalchemy+asyncpg")
    assert recorded == {k: v for k, v in expected.items() if k in recorded}
    assert len(recorded) == 6


def test_django_orm() -> None:
    """Quoted, qualified identifiers, ``%s``, ``LIMIT 21``, ``FOR NO KEY UPDATE``, ``F()`` updates, bulk_create's
    ``INSERT ... SELECT * FROM UNNEST(%s::varchar[], ...)`` and quoted savepoint names."""
    assert shapes("django+postgresql+psycopg") == {
        "create": ["no_table", "app_account insert none pred rows=1 set=owner,balance where="],
        "get": ["app_account read none key=$1 set= where="],
        "save": ["app_account write none key=$3 set=owner,balance where="],
        "save_update_fields": ["app_account write none key=$2 set=balance where="],
        "filter": ["app_account read none pred set= where=owner=$1"],
        "exists": ["app_account read none pred set= where=owner=$2"],  # `SELECT %s AS "a"` is $1
        "select_for_update": ["app_account read for_update key=$1 set= where=",
                              "app_account write none key=$3 set=owner,balance where="],
        "select_for_no_key_update": ["app_account read for_update key=$1 set= where="],
        "update_f": ["app_account write none key=$2 set=balance where="],
        "update_f_guarded": ["app_account write atomic key=$3 set=balance where=balance>=$2"],
        "nested_atomic": ["not_dml", "app_account write none key=$2 set=owner where=", "not_dml"],
        "bulk_create": ["app_account insert none pred rows=0 set=owner,balance where="],
        "get_or_create": ["app_account read none pred set= where=owner=$1",
                          "app_account insert none pred rows=1 set=owner,balance where="],
        "delete": ["app_account delete none pred set= where=owner=$1"],
    }  # fmt: skip


# Expression predicates (``= ANY($1::text[])``, ``LIKE``, ``%``) are read by the predicate evaluator's own tests.
_EXPRESSIONS = {"any_array", "like_modulo"}


def test_asyncpg() -> None:
    """``$1`` placeholders, one reused (``balance >= $1``), and BEGIN; / SAVEPOINT ...; / COMMIT; as spans."""
    recorded = {k: v for k, v in shapes("asyncpg").items() if k not in _EXPRESSIONS}
    assert recorded == {
        "fetchrow": ["accounts read none key=$1 set= where="],
        "update": ["accounts write none key=$2 set=balance where="],
        "atomic_update": ["accounts write atomic key=$2 set=balance where=balance>=$1"],
        "transaction_for_update": ["not_dml", "accounts read for_update key=$1 set= where=",
                                   "accounts write none key=$2 set=balance where=", "not_dml"],
        "nested_transaction": ["not_dml", "not_dml", "accounts write none key=$2 set=owner where=", "not_dml",
                               "not_dml"],
        "insert_returning": ["accounts insert none pred rows=1 set=owner,balance where="],
        "executemany": ["accounts insert none pred rows=1 set=owner,balance where="],
        "delete": ["accounts delete none key=$1 set= where="],
    }  # fmt: skip


_PSYCOPG2 = {
    "select_for_update": ["accounts read for_update key=$1 set= where="],
    "update_named": ["accounts write none key=:id set=balance where="],
    "atomic_update": ["accounts write atomic key=$2 set=balance where=balance>=$3"],
    "insert_returning": ["accounts insert none pred rows=1 set=owner,balance where="],
    "executemany": ["accounts insert none key=$1 set=id,owner,balance where="],
    "executemany_named": ["accounts write none key=:id set=balance where="],
    "delete": ["accounts delete none key=$1 set= where="],
    "execute_values": ["accounts insert none key=60 | 61 set=id,owner,balance where="],  # literal rows: two keys
}


@pytest.mark.parametrize("stack", ["psycopg2", "psycopg2+params"])
def test_psycopg2(stack: str) -> None:
    """``%s`` and ``%(name)s``, with and without ``capture_parameters``: the shape does not depend on the values."""
    recorded = {k: v for k, v in shapes(stack).items() if k not in _EXPRESSIONS}
    assert recorded == _PSYCOPG2


def test_jdbc_through_the_java_agent() -> None:
    """Hibernate 6's statements after the Java agent's sanitiser: ``?`` for every literal, table aliases (``a1_0.id``),
    ``for no key update`` (Hibernate's PESSIMISTIC_WRITE on PostgreSQL), a sanitised atomic update."""
    assert shapes("jdbc+otel-java-agent") == {
        "find": ["accounts read none key=$1 set= where="],
        "update_versioned": ["accounts write optimistic key=$4 set=balance,owner,version where=version=$5"],
        "filter": ["accounts read none pred set= where=owner=$1"],
        "lock_pessimistic_write": ["accounts read for_update key=$1 set= where="],
        "lock_for_update": ["accounts read for_update key=$1 set= where="],
        "insert_returning": ["accounts insert none pred rows=1 set=balance,owner,version where="],
        "insert_keyed": ["accounts insert none key=$4 set=balance,owner,version,id where="],
        "atomic_sanitised": ["accounts write atomic key=$2 set=balance where=balance>=$3"],
        "literal_sanitised": ["accounts read none pred set= where=owner=$1 balance>$2"],
        "delete": ["accounts delete optimistic key=$1 set= where=version=$2"],
        "savepoint": ["not_dml"],
    }


def test_jdbc_recorded_from_the_java_agent() -> None:
    """The corpus's Java service (``bench/corpus/stacks/java_jdbc``) as the OpenTelemetry Java agent 2.x reported it
    on its defaults: JDBC ``?`` placeholders, a literal the sanitiser keeps (``on_call = false``), a bare boolean
    column as a predicate, ``FOR UPDATE`` over a predicate, ``ON CONFLICT (room, day) DO NOTHING RETURNING``, and
    the driver's ``SET SESSION CHARACTERISTICS`` (no row)."""
    assert shapes("jdbc+otel-java-agent-recorded") == {
        "read": ["corpus_accounts read none key=$1 set= where="],
        "write": ["corpus_accounts write none key=$2 set=balance where="],
        "read_for_update": ["corpus_accounts read for_update key=$1 set= where="],
        "add": ["corpus_accounts write none key=$2 set=balance where="],  # relative: balance = balance + ?
        "count": ["corpus_doctors read none pred set= where=shift=$1 on_call=True"],
        "off": ["corpus_doctors write none key=$1 set=on_call where="],
        "lock": ["corpus_doctors read for_update pred set= where=shift=$1 on_call=True"],
        "set_isolation": ["not_dml"],  # Connection.setTransactionIsolation(SERIALIZABLE) is a span of its own
        "find": ["corpus_bookings read none pred set= where=room=$1 day=$2"],
        "insert_returning": ["corpus_bookings insert none pred rows=1 set=room,day,guest where="],
        "find_safe": ["corpus_bookings_safe read none pred set= where=room=$1 day=$2"],
        "insert_on_conflict": ["corpus_bookings_safe insert upsert key=$1,$2 set=room,day,guest where="],
    }


def _accesses(stack: str, step: str) -> list[tuple[str, str, str, tuple[Any, ...], tuple[Any, ...]]]:
    """(entity, operation, lock, set values, predicates) of the accesses of one recorded step."""
    extractor = SqlAccessExtractor(key_columns=KEYS)
    return [(a.entity, a.operation.value, a.lock.value, a.set_values, a.predicates)
            for s, st, span in RECORDED if (s, st) == (stack, step)
            for a in extractor.accesses(span)]  # fmt: skip


def test_psycopg2_parameters_bind_into_the_shape() -> None:
    """With ``capture_parameters=True`` the recorded values (a tuple, or a dict for ``%(name)s``) name the rows."""
    stack = "psycopg2+params"
    assert _accesses(stack, "select_for_update") == [("accounts:1", "read", "for_update", (), ())]
    assert _accesses(stack, "update_named") == [("accounts:1", "write", "none", (("balance", 70),), ())]
    assert _accesses(stack, "atomic_update") == [
        ("accounts:2", "write", "atomic", (("balance", "balance - 5"),), (("balance", ">=", 5),))
    ]
    assert _accesses(stack, "insert_returning") == [
        ("accounts:*", "insert", "none", (("owner", "cy"), ("balance", 3)), ())
    ]
    assert _accesses(stack, "delete") == [("accounts:50", "delete", "none", (), ())]


def test_savepoints_are_not_dml_and_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Every stack's SAVEPOINT / RELEASE SAVEPOINT / BEGIN / COMMIT is counted ``not_dml``, without sqlglot's warning
    per new savepoint name (Django names each one after its thread and a counter)."""
    extractor = SqlAccessExtractor(key_columns=KEYS)
    controls = [
        span for _, _, span in RECORDED if span.name.split()[0] in {"SAVEPOINT", "RELEASE", "BEGIN;", "COMMIT;"}
    ]
    assert len(controls) == 15  # 2 per SQLAlchemy stack and for Django, 6 asyncpg, 1 JDBC
    with caplog.at_level("WARNING"):
        assert all(extractor.accesses(span) == () for span in controls)
    assert extractor.counters["not_dml"] == len(controls)
    assert not caplog.records


def test_executemany_batches_bind_row_by_row() -> None:
    """``executemany`` is one span whose recorded parameters are the list of rows (``[(50, 'd', 1), (51, 'e', 2)]``,
    or dicts for ``%(name)s``): each row is one run of the statement, never one value (``accounts:(50, 'd', 1)``)."""
    stack = "psycopg2+params"
    assert _accesses(stack, "executemany") == [
        ("accounts:50", "insert", "none", (("id", 50), ("owner", "d"), ("balance", 1)), ()),
        ("accounts:51", "insert", "none", (("id", 51), ("owner", "e"), ("balance", 2)), ()),
    ]
    assert _accesses(stack, "executemany_named") == [
        ("accounts:50", "write", "none", (("balance", 11),), ()),
        ("accounts:51", "write", "none", (("balance", 12),), ()),
    ]


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        # Hibernate's PESSIMISTIC_WRITE with a table alias, and the OF clauses ORMs add (select_for_update(of=...)).
        ("select a1_0.id from accounts a1_0 where a1_0.id=? for no key update of a1_0",
         "accounts read for_update key=$1 set= where="),
        ('SELECT "app_account"."id" FROM "app_account" WHERE "app_account"."id" = %s LIMIT 21 FOR UPDATE OF '
         '"app_account"', "app_account read for_update key=$1 set= where="),
        ("SELECT accounts.id FROM accounts WHERE accounts.id = %(pk_1)s::INTEGER FOR UPDATE OF accounts SKIP LOCKED",
         "accounts read for_update key=:pk_1 set= where="),
        # with_for_update(read=True, key_share=True) / (read=True, nowait=True)
        ("SELECT accounts.id FROM accounts WHERE accounts.id = %(id_1)s::INTEGER FOR KEY SHARE",
         "accounts read for_share key=:id_1 set= where="),
        ("SELECT accounts.id FROM accounts WHERE accounts.id = %(id_1)s::INTEGER FOR SHARE NOWAIT",
         "accounts read for_share key=:id_1 set= where="),
        # The Java agent may collapse an IN list to one `?` (semantic conventions allow it): one placeholder, k rows.
        ("select a1_0.id,a1_0.balance from accounts a1_0 where a1_0.id in (?)",
         "accounts read none key=$1 set= where="),
        ("update accounts a set balance=a.balance-? where a.id=? and a.balance>=?",
         "accounts write atomic key=$2 set=balance where=balance>=$3"),
    ],
)  # fmt: skip
def test_lock_clauses_and_aliases_as_orms_write_them(statement: str, expected: str) -> None:
    """Lock strengths and OF / SKIP LOCKED / NOWAIT, table aliases and a collapsed IN list keep their shape."""
    assert summary(SqlAccessExtractor(key_columns=KEYS)._shape(statement)) == expected
