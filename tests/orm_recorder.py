"""Records the SQL that ORMs and drivers really send, as their stock OpenTelemetry instrumentations report it.

Each stack runs a small account-ledger workload (get, change + commit, filtered select, FOR UPDATE, atomic update,
insert with RETURNING, bulk insert, nested transaction / savepoint, delete) against a real PostgreSQL, traced by its
stock instrumentation with DEFAULT options (no parameters captured), except the ``psycopg2+params`` run, which turns
``capture_parameters`` on to show what binding sees. Every span's name, kind and attributes are written to
``tests/processors/fixtures/orm_statements.json``; ``tests/processors/test_orm_statements.py`` checks the shape the
daemon reads from each. Regenerate (the shared engines' DSN from ``trace-repro local status``)::

    .venv/bin/python -m tests.orm_recorder postgresql://postgres@127.0.0.1:PORT/postgres

The JDBC statements are not recorded (no JVM stack here): ``JDBC`` below writes them by hand the way Hibernate 6
issues them, after the OpenTelemetry Java agent's statement sanitiser (on by default): every literal (string,
number, boolean) becomes ``?``, ``?`` placeholders stay, identifiers, keywords and operators stay as sent.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

FIXTURE = Path(__file__).parent / "processors" / "fixtures" / "orm_statements.json"
# Spans the OpenTelemetry Java agent reported for the corpus's Java service (bench/corpus/stacks/java_jdbc), copied
# from its span exporter's output: this recorder runs no JVM, so a new recording keeps them as they are.
KEPT_STACKS = frozenset({"jdbc+otel-java-agent-recorded"})
DATABASE = "trp_orm_recorder"

# Hibernate 6 on PostgreSQL through the OpenTelemetry Java agent (db.statement sanitised: literals -> ?).
JDBC: tuple[tuple[str, str], ...] = (
    ("find", "select a1_0.id,a1_0.balance,a1_0.owner,a1_0.version from accounts a1_0 where a1_0.id=?"),
    ("update_versioned", "update accounts set balance=?,owner=?,version=? where id=? and version=?"),
    ("filter", "select a1_0.id,a1_0.balance,a1_0.owner,a1_0.version from accounts a1_0 where a1_0.owner=?"),
    ("lock_pessimistic_write",
     "select a1_0.id,a1_0.balance,a1_0.owner,a1_0.version from accounts a1_0 where a1_0.id=? for no key update"),
    ("lock_for_update", "select a1_0.id,a1_0.balance from accounts a1_0 where a1_0.id=? for update"),
    ("insert_returning", "insert into accounts (balance,owner,version) values (?,?,?) returning id"),
    ("insert_keyed", "insert into accounts (balance,owner,version,id) values (?,?,?,?)"),
    ("atomic_sanitised", "UPDATE accounts SET balance = balance - ? WHERE id = ? AND balance >= ?"),
    ("literal_sanitised", "SELECT id, balance FROM accounts WHERE owner = ? AND balance > ?"),
    ("delete", "delete from accounts where id=? and version=?"),
    ("savepoint", "SAVEPOINT sp1"),
)  # fmt: skip


def _dsn(base: str, database: str) -> str:
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path="/" + database))


class Recorder:
    """An in-memory span exporter; ``take(stack, step)`` files the spans finished since the last take."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.records: list[dict[str, Any]] = []

    def take(self, stack: str, step: str) -> None:
        for span in self.exporter.get_finished_spans():
            attributes = {k: _plain(v) for k, v in (span.attributes or {}).items()}
            self.records.append({"stack": stack, "step": step, "name": span.name, "kind": span.kind.name,
                                 "attributes": attributes})  # fmt: skip
        self.exporter.clear()


def _plain(value: Any) -> Any:
    """An attribute value as JSON: bytes (psycopg2's ``execute_values`` sends its statement as bytes, and the SDK
    exports them as OTLP ``bytes_value``) as ``{"bytes": text}``, sequences as lists."""
    if isinstance(value, bytes):
        return {"bytes": value.decode()}
    return value if isinstance(value, str | int | float | bool) else list(value)


def _reset_database(base: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")


def _schema(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS accounts")
        conn.execute("CREATE TABLE accounts (id serial PRIMARY KEY, owner text NOT NULL, balance integer NOT NULL,"
                     " version integer NOT NULL DEFAULT 1)")  # fmt: skip
        conn.execute("INSERT INTO accounts (owner, balance) VALUES ('ann', 100), ('bob', 100)")


# -- SQLAlchemy 2: ORM and Core, on psycopg2, psycopg 3 and asyncpg -----------------------------------------------
def _sqlalchemy_models() -> tuple[Any, Any]:
    from sqlalchemy import Integer, String
    from sqlalchemy.orm import DeclarativeBase, mapped_column

    class Base(DeclarativeBase):
        pass

    class Account(Base):
        __tablename__ = "accounts"
        id = mapped_column(Integer, primary_key=True)
        owner = mapped_column(String)
        balance = mapped_column(Integer)
        version = mapped_column(Integer, default=1)
        __mapper_args__ = {"version_id_col": version}

    return Base, Account


def _uninstrument_sqlalchemy() -> None:
    """The instrumentor keeps every engine it ever listened to and fails removing a disposed one's listeners."""
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from sqlalchemy.exc import InvalidRequestError

    with suppress(InvalidRequestError):
        SQLAlchemyInstrumentor().uninstrument()


def _sqlalchemy_sync(recorder: Recorder, dsn: str, stack: str, driver: str) -> None:
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from sqlalchemy import create_engine, delete, insert, select, update
    from sqlalchemy.orm import Session

    _, Account = _sqlalchemy_models()
    engine = create_engine(_dsn(dsn, DATABASE).replace("postgresql://", f"postgresql+{driver}://"))
    _schema(_dsn(dsn, DATABASE))
    SQLAlchemyInstrumentor().instrument(engine=engine, tracer_provider=recorder.provider)
    take = recorder.take
    try:
        with Session(engine) as session:
            account = session.get(Account, 1)
            take(stack, "orm_get")
            assert account is not None
            account.balance -= 10
            session.commit()
            take(stack, "orm_change_commit")
            session.scalars(select(Account).where(Account.owner == "bob")).all()
            take(stack, "orm_select_where")
            session.scalars(select(Account).where(Account.id == 2).with_for_update()).one()
            take(stack, "orm_for_update")
            session.scalars(select(Account).where(Account.id == 2).with_for_update(key_share=True)).one()
            take(stack, "orm_for_no_key_update")
            session.execute(update(Account).where(Account.id == 2, Account.balance >= 5)
                            .values(balance=Account.balance - 5))  # fmt: skip
            session.commit()
            take(stack, "orm_atomic_update")
            session.add(Account(owner="cy", balance=7))
            session.commit()
            take(stack, "orm_insert_returning")
            session.add_all([Account(owner=f"bulk{i}", balance=i) for i in range(3)])
            session.commit()
            take(stack, "orm_bulk_insert")
            session.execute(insert(Account), [{"owner": f"many{i}", "balance": i} for i in range(3)])
            session.commit()
            take(stack, "orm_executemany")
            with session.begin_nested():
                nested = session.get(Account, 1)
                assert nested is not None
                nested.balance += 1
            session.commit()
            take(stack, "orm_savepoint")
            doomed = session.scalars(select(Account).where(Account.owner == "cy")).one()
            session.delete(doomed)
            session.commit()
            take(stack, "orm_delete")
        table = Account.__table__
        with engine.begin() as conn:
            conn.execute(select(table).where(table.c.id == 1)).one()
            take(stack, "core_select")
            conn.execute(update(table).where(table.c.id == 1).values(balance=table.c.balance + 1))
            take(stack, "core_update")
            conn.execute(insert(table).values(owner="dee", balance=3).returning(table.c.id)).one()
            take(stack, "core_insert_returning")
            conn.execute(delete(table).where(table.c.owner == "dee"))
            take(stack, "core_delete")
    finally:
        _uninstrument_sqlalchemy()
        engine.dispose()
    recorder.take(stack, "teardown")


def _sqlalchemy_asyncpg(recorder: Recorder, dsn: str) -> None:
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from sqlalchemy import select, update
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    _, Account = _sqlalchemy_models()
    _schema(_dsn(dsn, DATABASE))
    stack, take = "sqlalchemy+asyncpg", recorder.take

    async def run() -> None:
        engine = create_async_engine(_dsn(dsn, DATABASE).replace("postgresql://", "postgresql+asyncpg://"))
        SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine, tracer_provider=recorder.provider)
        try:
            async with AsyncSession(engine) as session:
                account = await session.get(Account, 1)
                take(stack, "orm_get")
                assert account is not None
                account.balance -= 10
                await session.commit()
                take(stack, "orm_change_commit")
                await session.execute(select(Account).where(Account.id == 2).with_for_update())
                take(stack, "orm_for_update")
                await session.execute(update(Account).where(Account.id == 2).values(balance=Account.balance - 5))
                await session.commit()
                take(stack, "orm_atomic_update")
                session.add_all([Account(owner=f"bulk{i}", balance=i) for i in range(3)])
                await session.commit()
                take(stack, "orm_bulk_insert")
                async with session.begin_nested():
                    nested = await session.get(Account, 1)
                    assert nested is not None
                    nested.balance += 1
                await session.commit()
                take(stack, "orm_savepoint")
        finally:
            _uninstrument_sqlalchemy()
            await engine.dispose()

    asyncio.run(run())
    recorder.take(stack, "teardown")


# -- Django ORM ---------------------------------------------------------------------------------------------------
def _django(recorder: Recorder, dsn: str) -> None:
    import django
    from django.conf import settings

    parts = urlsplit(_dsn(dsn, DATABASE))
    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": DATABASE, "USER": parts.username,
                               "PASSWORD": parts.password or "", "HOST": parts.hostname, "PORT": parts.port}},
        INSTALLED_APPS=[], USE_TZ=True, DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )  # fmt: skip
    django.setup()
    from django.db import connection, models, transaction
    from django.db.models import F
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.psycopg2 import Psycopg2Instrumentor

    class Account(models.Model):
        owner = models.CharField(max_length=40)
        balance = models.IntegerField()

        class Meta:
            app_label = "app"

    with connection.schema_editor() as editor:
        editor.create_model(Account)
    connection.close()
    stack, take = f"django+{connection.vendor}+{_django_driver()}", recorder.take
    DjangoInstrumentor().instrument(tracer_provider=recorder.provider)
    PsycopgInstrumentor().instrument(tracer_provider=recorder.provider)
    Psycopg2Instrumentor().instrument(tracer_provider=recorder.provider)
    objects: Any = Account.objects
    try:
        objects.create(owner="ann", balance=100)
        take(stack, "create")
        ann = objects.get(pk=1)
        take(stack, "get")
        ann.balance -= 10
        ann.save()
        take(stack, "save")
        ann.save(update_fields=["balance"])
        take(stack, "save_update_fields")
        list(objects.filter(owner="ann"))
        take(stack, "filter")
        objects.filter(owner="ann").exists()
        take(stack, "exists")
        with transaction.atomic():
            locked = objects.select_for_update().get(pk=1)
            locked.balance -= 1
            locked.save()
        take(stack, "select_for_update")
        with transaction.atomic():
            objects.select_for_update(no_key=True).filter(pk=1).first()
        take(stack, "select_for_no_key_update")
        objects.filter(pk=1).update(balance=F("balance") - 5)
        take(stack, "update_f")
        objects.filter(pk=1, balance__gte=5).update(balance=F("balance") - 5)
        take(stack, "update_f_guarded")
        with transaction.atomic(), transaction.atomic():
            objects.filter(pk=1).update(owner="ann2")
        take(stack, "nested_atomic")
        objects.bulk_create([Account(owner=f"bulk{i}", balance=i) for i in range(3)])
        take(stack, "bulk_create")
        objects.get_or_create(owner="cy", defaults={"balance": 1})
        take(stack, "get_or_create")
        objects.filter(owner="cy").delete()
        take(stack, "delete")
    finally:
        Psycopg2Instrumentor().uninstrument()
        PsycopgInstrumentor().uninstrument()
        DjangoInstrumentor().uninstrument()
        connection.close()
    recorder.take(stack, "teardown")


def _django_driver() -> str:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return "psycopg" if is_psycopg3 else "psycopg2"


# -- asyncpg ------------------------------------------------------------------------------------------------------
def _asyncpg(recorder: Recorder, dsn: str) -> None:
    import asyncpg
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    _schema(_dsn(dsn, DATABASE))
    stack, take = "asyncpg", recorder.take

    async def run() -> None:
        conn = await asyncpg.connect(_dsn(dsn, DATABASE))
        try:
            await conn.fetchrow("SELECT id, owner, balance FROM accounts WHERE id = $1", 1)
            take(stack, "fetchrow")
            await conn.execute("UPDATE accounts SET balance = $1 WHERE id = $2", 90, 1)
            take(stack, "update")
            await conn.execute("UPDATE accounts SET balance = balance - $1 WHERE id = $2 AND balance >= $1", 5, 1)
            take(stack, "atomic_update")
            async with conn.transaction():
                await conn.fetchrow("SELECT balance FROM accounts WHERE id = $1 FOR UPDATE", 2)
                await conn.execute("UPDATE accounts SET balance = $1 WHERE id = $2", 80, 2)
            take(stack, "transaction_for_update")
            async with conn.transaction(), conn.transaction():
                await conn.execute("UPDATE accounts SET owner = $1 WHERE id = $2", "bo", 2)
            take(stack, "nested_transaction")
            await conn.fetchval("INSERT INTO accounts (owner, balance) VALUES ($1, $2) RETURNING id", "cy", 3)
            take(stack, "insert_returning")
            await conn.executemany("INSERT INTO accounts (owner, balance) VALUES ($1, $2)", [("d", 1), ("e", 2)])
            take(stack, "executemany")
            await conn.fetch("SELECT id FROM accounts WHERE owner = ANY($1::text[])", ["d", "e"])
            take(stack, "any_array")
            await conn.execute("DELETE FROM accounts WHERE id = $1", 3)
            take(stack, "delete")
        finally:
            await conn.close()

    AsyncPGInstrumentor().instrument(tracer_provider=recorder.provider)
    try:
        asyncio.run(run())
    finally:
        AsyncPGInstrumentor().uninstrument()
    recorder.take(stack, "teardown")


# -- psycopg2, as an app without an ORM writes it -----------------------------------------------------------------
def _psycopg2(recorder: Recorder, dsn: str, *, capture_parameters: bool) -> None:
    import psycopg2
    import psycopg2.extras
    from opentelemetry.instrumentation.psycopg2 import Psycopg2Instrumentor

    _schema(_dsn(dsn, DATABASE))
    stack = "psycopg2+params" if capture_parameters else "psycopg2"
    take = recorder.take
    options = {"capture_parameters": True} if capture_parameters else {}
    Psycopg2Instrumentor().instrument(tracer_provider=recorder.provider, **options)
    try:
        conn = psycopg2.connect(_dsn(dsn, DATABASE))
        with conn, conn.cursor() as cur:
            cur.execute("SELECT id, balance FROM accounts WHERE id = %s FOR UPDATE", (1,))
            take(stack, "select_for_update")
            cur.execute("UPDATE accounts SET balance = %(balance)s WHERE id = %(id)s", {"balance": 70, "id": 1})
            take(stack, "update_named")
            cur.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s AND balance >= %s", (5, 2, 5))
            take(stack, "atomic_update")
            cur.execute("INSERT INTO accounts (owner, balance) VALUES (%s, %s) RETURNING id", ("cy", 3))
            take(stack, "insert_returning")
            cur.executemany(
                "INSERT INTO accounts (id, owner, balance) VALUES (%s, %s, %s)", [(50, "d", 1), (51, "e", 2)]
            )
            take(stack, "executemany")
            cur.executemany("UPDATE accounts SET balance = %(balance)s WHERE id = %(id)s",
                            [{"balance": 11, "id": 50}, {"balance": 12, "id": 51}])  # fmt: skip
            take(stack, "executemany_named")
            psycopg2.extras.execute_values(cur, "INSERT INTO accounts (id, owner, balance) VALUES %s",
                                           [(60, "f", 1), (61, "g", 2)])  # fmt: skip
            take(stack, "execute_values")
            cur.execute("SELECT id FROM accounts WHERE owner LIKE %s AND balance %% 2 = 0", ("%",))
            take(stack, "like_modulo")
            cur.execute("DELETE FROM accounts WHERE id = %s", (50,))
            take(stack, "delete")
        conn.close()
    finally:
        Psycopg2Instrumentor().uninstrument()
    recorder.take(stack, "teardown")


@contextmanager
def _quiet() -> Iterator[None]:
    import logging

    logging.getLogger("opentelemetry").setLevel(logging.ERROR)
    yield


def record(dsn: str) -> list[dict[str, Any]]:
    """Runs every stack against the PostgreSQL at ``dsn`` (a scratch database is made there) and returns the spans."""
    recorder = Recorder()
    _reset_database(dsn)
    runs: list[Callable[[], None]] = [
        lambda: _sqlalchemy_sync(recorder, dsn, "sqlalchemy+psycopg2", "psycopg2"),
        lambda: _sqlalchemy_sync(recorder, dsn, "sqlalchemy+psycopg", "psycopg"),
        lambda: _sqlalchemy_asyncpg(recorder, dsn),
        lambda: _asyncpg(recorder, dsn),
        lambda: _psycopg2(recorder, dsn, capture_parameters=False),
        lambda: _psycopg2(recorder, dsn, capture_parameters=True),
        lambda: _django(recorder, dsn),
    ]
    with _quiet():
        for run in runs:
            run()
    for step, statement in JDBC:
        recorder.records.append({"stack": "jdbc+otel-java-agent", "step": step, "name": statement.split()[0].upper(),
                                 "kind": "CLIENT", "attributes": {"db.system": "postgresql",
                                                                  "db.statement": statement}})  # fmt: skip
    kept = [r for r in json.loads(FIXTURE.read_text()) if r["stack"] in KEPT_STACKS] if FIXTURE.exists() else []
    return recorder.records + kept


def main() -> None:
    """``python -m tests.orm_recorder DSN [OUT]``: records every stack, writes the fixture (or ``OUT``)."""
    records = record(sys.argv[1])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else FIXTURE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(records)} spans -> {out}")


if __name__ == "__main__":
    main()
