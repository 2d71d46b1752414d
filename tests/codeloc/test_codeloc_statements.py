"""Statement shape -> the code that issues it: SQL text, parsed shape, ORM model and attributes; ambiguity kept."""

from __future__ import annotations

from pathlib import Path

from processors.api.telemetry import Telemetry
from processors.codeloc import Site
from processors.codeloc.statements import Shape, normalise, shape_of
from tests.codeloc.sample import checkout, client, line_of, locator, server, trace

RAW = {
    "bank/handlers.py": """
        READ = "SELECT balance FROM accounts WHERE id = %s"
        WRITE = "UPDATE accounts SET balance = %s WHERE id = %s"
        ADD = "UPDATE accounts SET balance = balance + %s WHERE id = %s"


        def deposit(conn, account_id, amount):
            balance = conn.execute(READ, (account_id,)).fetchone()[0]
            conn.execute(WRITE, (balance + amount, account_id))


        def deposit_locked(conn, account_id, amount):
            balance = conn.execute(READ + " FOR UPDATE", (account_id,)).fetchone()[0]
            conn.execute(WRITE, (balance + amount, account_id))


        def deposit_atomic(conn, account_id, amount):
            conn.execute(READ, (account_id,))
            conn.execute(ADD, (amount, account_id))


        def deposit_twin(conn, account_id, amount):
            balance = conn.execute(READ, (account_id,)).fetchone()[0]
            conn.execute(WRITE, (balance + amount, account_id))
    """,
}

ORM = {
    "bank/models.py": """
        from sqlalchemy.orm import DeclarativeBase, Mapped


        class Base(DeclarativeBase):
            pass


        class Account(Base):
            __tablename__ = "accounts"
            id: Mapped[int]
            balance: Mapped[int]
    """,
    "bank/service.py": """
        from bank.models import Account


        def withdraw(session, account_id, amount):
            account = session.get(Account, account_id)
            _debit(account, amount)
            session.commit()


        def _debit(account, amount):
            account.balance -= amount


        def statement(session):
            return session.query(Account).all()


        def rename(session, account_id, name):
            session.get(Account, account_id).name = name
    """,
}

# What SQLAlchemy 2 sends for ``session.get(Account, 7)`` then a flush of ``account.balance -= 10``.
ORM_SELECT = ("SELECT accounts.id AS accounts_id, accounts.balance AS accounts_balance FROM accounts "
              "WHERE accounts.id = %(pk_1)s::INTEGER")  # fmt: skip
ORM_UPDATE = "UPDATE accounts SET balance=%(balance)s::INTEGER WHERE accounts.id = %(accounts_id)s::INTEGER"


def _sites(root: Path, *statements: str, telemetry: Telemetry | None = None) -> list[Site | None]:
    spans = [client(i + 2, 1, s) for i, s in enumerate(statements)]
    t = trace(server(1, "POST", "/accounts/{id}/deposits"), *spans)
    found = locator(root, telemetry).sites(t, spans)
    return [found.get(s.span_id) for s in spans]


def test_normalised_text_and_shape_set_placeholders_case_and_spacing_aside() -> None:
    """``%s``, ``%(name)s``, ``$1``, ``:name`` are one placeholder; the shape ignores qualification and casts."""
    assert normalise("select  balance\nFROM accounts WHERE id = $1;") == normalise(
        "SELECT balance FROM accounts WHERE id = :id"
    )
    assert shape_of(ORM_UPDATE) == shape_of("UPDATE accounts SET balance = ? WHERE id = ?") == Shape(
        "update", ("accounts",), frozenset({"balance"}), frozenset({"id"}), False
    )  # fmt: skip
    assert shape_of("SELECT balance FROM accounts WHERE id = %s FOR UPDATE") == Shape(
        "select", ("accounts",), frozenset({"balance"}), frozenset({"id"}), True
    )
    assert shape_of("not sql at all") is None


def test_the_function_that_issues_every_statement_of_the_request_is_its_handler(tmp_path: Path) -> None:
    """READ is in three functions, WRITE in three: only ``deposit`` and its twin pass both, and so the twin makes
    it ambiguous; with the twin gone the statements name ``deposit`` and each line that issues them."""
    root = checkout(tmp_path, RAW)
    read, write = "SELECT balance FROM accounts WHERE id = %s", "UPDATE accounts SET balance = %s WHERE id = %s"
    both = ("bank.handlers.deposit", "bank.handlers.deposit_twin")
    assert _sites(root, read, write) == [Site("", "", 0, "statement", both)] * 2
    source = (root / "bank/handlers.py").read_text()
    (root / "bank/handlers.py").write_text(source[: source.index("def deposit_twin")])
    file = str(root / "bank/handlers.py")
    line = line_of(root, "bank/handlers.py", "conn.execute(READ, (account_id,)).fetchone()")
    assert _sites(root, read, write) == [
        Site("bank.handlers.deposit", file, line, "statement"),
        Site("bank.handlers.deposit", file, line + 1, "statement"),
    ]
    locked = "SELECT balance FROM accounts WHERE id = %s FOR UPDATE"  # READ + " FOR UPDATE" in the code
    assert [s.function if s else None for s in _sites(root, locked, write)] == ["bank.handlers.deposit_locked"] * 2


def test_sql_an_orm_wrote_is_traced_to_the_functions_that_use_the_model_and_its_columns(tmp_path: Path) -> None:
    """No string of the code is SQLAlchemy's SQL: the UPDATE of ``balance`` on ``accounts`` is code that assigns
    ``.balance`` and names ``Account`` (``_debit`` assigns, ``withdraw`` calls it); the SELECT is any function that
    names ``Account``; together they name ``withdraw``, the outermost function reaching both."""
    root = checkout(tmp_path, ORM)
    service = str(root / "bank/service.py")
    withdraw = line_of(root, "bank/service.py", "def withdraw")
    assert _sites(root, ORM_SELECT, ORM_UPDATE) == [Site("bank.service.withdraw", service, withdraw, "statement")] * 2


def test_statement_shape_finds_the_line_inside_the_route_handler(tmp_path: Path) -> None:
    """Route known: the handler is the route's, the line is where its call tree passes the statement."""
    root = checkout(tmp_path, {
        "app.py": """
            from flask import Flask

            app = Flask(__name__)


            @app.post("/accounts/<int:id>/deposits")
            def deposit(id):
                return _store(id)


            def _store(id):
                return db.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (id,))
        """,
    })  # fmt: skip
    sites = _sites(root, "UPDATE accounts SET balance = balance + 1 WHERE id = %s")
    assert sites == [Site("app.deposit", str(root / "app.py"), line_of(root, "app.py", "def deposit"), "route")]


def test_the_checkout_index_and_the_request_cache_are_bounded_and_counted(tmp_path: Path) -> None:
    """``max_files``: files past the bound are not read (counted); an unparsable file is counted; the request cache
    evicts (counted) past ``max_cached_requests``."""
    root = checkout(tmp_path, {**RAW, "bank/broken.py": "def (:\n", "bank/z_extra.py": "X = 1\n"})
    telemetry = Telemetry("codeloc")
    loc = locator(root, telemetry, max_files=2, max_cached_requests=1)
    assert telemetry.dropped["max_files"] == 1 and telemetry.dropped["unparsable"] == 1
    assert telemetry.state["indexed_files"] == 2
    for statement in ("SELECT balance FROM accounts WHERE id = %s", "UPDATE accounts SET balance = %s WHERE id = %s"):
        span = client(2, 1, statement)
        loc.sites(trace(server(1, "POST", "/x"), span), [span])
    assert telemetry.dropped["max_cached_requests"] == 1
    assert telemetry.events == {"ambiguous": 2}


def test_tests_in_the_checkout_are_not_code_that_issues_statements(tmp_path: Path) -> None:
    """A test passes the same SQL as the code it tests: ``exclude`` leaves tests out (else: ambiguous)."""
    test_file = """
        def test_deposit(conn):
            conn.execute("SELECT balance FROM accounts WHERE id = %s", (1,))
            conn.execute("UPDATE accounts SET balance = %s WHERE id = %s", (2, 1))
    """
    source = RAW["bank/handlers.py"]
    root = checkout(tmp_path, {"bank/handlers.py": source[: source.index("def deposit_twin")],
                               "tests/test_bank.py": test_file, "bank/test_more.py": test_file})  # fmt: skip
    read, write = "SELECT balance FROM accounts WHERE id = %s", "UPDATE accounts SET balance = %s WHERE id = %s"
    assert [s.function if s else None for s in _sites(root, read, write)] == ["bank.handlers.deposit"] * 2
    spans = [client(2, 1, read), client(3, 1, write)]
    everything = locator(root, exclude=[]).sites(trace(server(1, "POST", "/x"), *spans), spans)
    assert everything[spans[0].span_id].candidates == ("bank.handlers.deposit", "bank.test_more.test_deposit",
                                                        "tests.test_bank.test_deposit")  # fmt: skip


def test_each_service_is_located_in_its_own_checkout(tmp_path: Path) -> None:
    """``services``: service.name -> its checkout under the root; two services with the same SQL stay apart."""
    code = 'def capture(conn):\n    conn.execute("UPDATE payments SET state = %s WHERE id = %s")\n'
    root = checkout(tmp_path, {"payments/app.py": code, "refunds/app.py": code.replace("capture", "refund")})
    update = "UPDATE payments SET state = %s WHERE id = %s"
    for service, function in (("payments", "app.capture"), ("refunds", "app.refund")):
        span = client(2, 1, update, service=service)
        t = trace(server(1, "POST", "/x", service=service), span)
        split = locator(root, services={"payments": "payments", "refunds": "refunds"}).sites(t, [span])
        assert (split[span.span_id].function, split[span.span_id].located_by) == (function, "statement")
        assert locator(root).sites(t, [span])[span.span_id].candidates == ("payments.app.capture", "refunds.app.refund")
