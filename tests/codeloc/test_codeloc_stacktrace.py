"""``exception.stacktrace`` (Python and Java) -> the innermost frame inside the service's checkout."""

from __future__ import annotations

from pathlib import Path

from processors.codeloc import Site
from processors.codeloc.stacktrace import Frame, frames
from processors.model.events import StatusCode
from tests.codeloc.sample import checkout, client, line_of, locator, server, trace

PAYMENTS = {
    "shop/__init__.py": "",
    "shop/payments.py": """
        from shop.db import connect


        def pay(order_id):
            with connect() as conn:
                conn.execute("SELECT status FROM orders WHERE id = %s", (order_id,))
                _capture(conn, order_id)


        def _capture(conn, order_id):
            conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (order_id,))
    """,
    "shop/db.py": "def connect():\n    raise NotImplementedError\n",
    "vendor/flask/app.py": "def full_dispatch_request():\n    pass\n",  # vendored library code: never a frame's site
}


def _python_trace(root: Path) -> str:
    """What ``traceback.format_exception`` records on the server span: the app ran from /srv/app, not from root."""
    pay = line_of(root, "shop/payments.py", "    _capture(conn, order_id)")
    capture = line_of(root, "shop/payments.py", "UPDATE orders")
    return (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/shop/payments.py", line 3, in pay\n'
        "    raise KeyError('first')\n"
        "KeyError: 'first'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/site-packages/flask/app.py", line 880, in full_dispatch_request\n'
        "    rv = self.dispatch_request()\n"
        f'  File "/srv/app/shop/payments.py", line {pay}, in pay\n'
        "    _capture(conn, order_id)\n"
        f'  File "/srv/app/shop/payments.py", line {capture}, in _capture\n'
        '    conn.execute("UPDATE orders ...", (order_id,))\n'
        '  File "/usr/lib/python3.11/site-packages/psycopg/cursor.py", line 97, in execute\n'
        "    raise ex.with_traceback(None)\n"
        "psycopg.errors.SerializationFailure: could not serialize access due to concurrent update\n"
    )


JAVA = """java.sql.SQLException: could not serialize access due to concurrent update
\tat org.postgresql.core.v3.QueryExecutorImpl.receiveErrorResponse(QueryExecutorImpl.java:2725)
\tat com.zaxxer.hikari.pool.HikariProxyPreparedStatement.executeUpdate(HikariProxyPreparedStatement.java)
\tat com.shop.accounts.AccountRepository.withdraw(AccountRepository.java:42)
\tat com.shop.accounts.AccountController$Inner.post(AccountController.java:17)
\tat org.springframework.web.servlet.FrameworkServlet.service(FrameworkServlet.java:885)
Caused by: org.postgresql.util.PSQLException: could not serialize access
\tat com.shop.accounts.Other.run(Other.java:9)
"""


def test_python_frames_innermost_first_of_the_last_raised_exception(tmp_path: Path) -> None:
    """Python prints outermost first and the chained cause before: only the raised exception's frames, reversed."""
    got = frames(_python_trace(checkout(tmp_path, PAYMENTS)))
    assert [f.function for f in got] == ["execute", "_capture", "pay", "full_dispatch_request"]
    assert got[0] == Frame("/usr/lib/python3.11/site-packages/psycopg/cursor.py", 97, "execute")


def test_java_frames_innermost_first_up_to_the_cause() -> None:
    """``at pkg.Class.method(File.java:N)``; an inner class is its outer class's file; ``Caused by`` ends it."""
    got = frames(JAVA)
    assert [(f.owner, f.function, f.line) for f in got] == [
        ("org.postgresql.core.v3.QueryExecutorImpl", "receiveErrorResponse", 2725),
        ("com.zaxxer.hikari.pool.HikariProxyPreparedStatement", "executeUpdate", 0),
        ("com.shop.accounts.AccountRepository", "withdraw", 42),
        ("com.shop.accounts.AccountController", "post", 17),
        ("org.springframework.web.servlet.FrameworkServlet", "service", 885),
    ]
    assert frames("just a message\nno frames") == []


def test_the_failed_statement_is_the_innermost_checkout_frame_and_the_others_the_handler(tmp_path: Path) -> None:
    """The stack trace on the server span (the app's paths are not the checkout's: matched by path suffix); library
    frames (site-packages, psycopg) are skipped; a frame's function must be the def at its line."""
    root = checkout(tmp_path, PAYMENTS)
    text = _python_trace(root)
    request = server(1, "POST", "/orders/{id}/pay", status=StatusCode.ERROR, exception_type="SerializationFailure",
                     exception_stacktrace=text)  # fmt: skip
    read = client(2, 1, "SELECT status FROM orders WHERE id = %s")
    write = client(3, 1, "UPDATE orders SET status = 'paid' WHERE id = %s", error=True)
    t = trace(request, read, write)
    sites = locator(root).sites(t, [read, write])
    file = str(root / "shop/payments.py")
    capture, pay = (
        line_of(root, "shop/payments.py", "UPDATE orders"),
        line_of(root, "shop/payments.py", "    _capture("),
    )
    assert sites[write.span_id] == Site("shop.payments._capture", file, capture, "stacktrace")
    assert sites[read.span_id] == Site("shop.payments.pay", file, pay, "stacktrace")


def test_a_source_map_takes_recorded_paths_to_the_checkout(tmp_path: Path) -> None:
    """``source_map``: /srv/app -> the root, so even a file name that is not unique resolves."""
    root = checkout(tmp_path, {**PAYMENTS, "other/shop/payments.py": "def pay():\n    pass\n"})
    text = _python_trace(root)
    request = server(1, "POST", "/pay", status=StatusCode.ERROR, exception_stacktrace=text)
    write = client(2, 1, "UPDATE orders SET status = 'paid' WHERE id = %s", error=True)
    t = trace(request, write)
    unmapped = locator(root).sites(t, [write])[write.span_id]  # two shop/payments.py: the suffix decides nothing
    assert (unmapped.function, unmapped.located_by) == ("shop.payments.pay", "statement")  # the weaker method
    mapped = locator(root, source_map={"/srv/app": "."}).sites(t, [write])
    assert mapped[write.span_id].function == "shop.payments._capture"
    assert mapped[write.span_id].located_by == "stacktrace"


def test_java_stack_trace_names_the_class_method_and_its_file_in_the_checkout(tmp_path: Path) -> None:
    """A Java service's checkout: the frame's class is found as <package path>/<File>.java under the root."""
    root = checkout(tmp_path, {
        "src/main/java/com/shop/accounts/AccountRepository.java": "class AccountRepository {}\n",
        "src/main/java/com/shop/accounts/AccountController.java": "class AccountController {}\n",
    })  # fmt: skip
    request = server(1, "POST", "/accounts/{id}/withdraw", service="accounts", exception_stacktrace=JAVA)
    write = client(2, 1, "UPDATE accounts SET balance = ? WHERE id = ?", service="accounts", error=True)
    other = client(3, 1, "SELECT balance FROM accounts WHERE id = ?", service="accounts")
    t = trace(request, write, other)
    sites = locator(root).sites(t, [write, other])
    repo = str(root / "src/main/java/com/shop/accounts/AccountRepository.java")
    controller = str(root / "src/main/java/com/shop/accounts/AccountController.java")
    assert sites[write.span_id] == Site("com.shop.accounts.AccountRepository.withdraw", repo, 42, "stacktrace")
    assert sites[other.span_id] == Site("com.shop.accounts.AccountController.post", controller, 17, "stacktrace")
