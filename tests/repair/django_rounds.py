"""One round of the Django stack, from a copy of its source, in a process of its own (Django's settings are
process-global): ``python -m tests.repair.django_rounds <app.py> <dsn> <schema> <scenario> <kind> [<migration>...]``.

The copy is imported under its own module name (its URLconf is itself), its two database aliases pointed at
``dsn`` and ``schema`` as the stack's ``start`` does, but untraced: the statements each request sends are recorded
as Django hands them to the driver (``connection.execute_wrapper``: the text the psycopg instrumentation reports).
The scenario's tables are created afresh, the migrations run, and the round of that kind (``bug``, or a control)
is played with its interleaving forced (``bench.corpus.race.duel``). A race point that can no longer be reached
together (the repaired code locks before it) releases after ``TIMEOUT_S``: shortened here, it only bounds how long
the leader waits for a follower its lock holds back. Prints one JSON object: the statuses, the statements of each
role, and what PostgreSQL shows.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.corpus import race
from bench.corpus.runner import drop_schema, prepare, untraced

FACTS = {  # what the database shows after a round, by scenario
    "lost_update": "SELECT balance FROM corpus_accounts WHERE account_no = %s",
    "write_skew": "SELECT count(*) FROM corpus_doctors WHERE shift = %s AND on_call",
    "phantom": "SELECT count(*) FROM corpus_bookings WHERE room = %s",
    "phantom/control": "SELECT count(*) FROM corpus_bookings_safe WHERE room = %s",
}
RACE_TIMEOUT_S = 1.5


def load(path: Path) -> Any:
    name = f"repaired_{path.parent.name}_app"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> dict[str, Any]:
    app_path, dsn, schema, name, kind, *migrations = argv
    app = load(Path(app_path))
    from django.conf import settings
    from django.db import connections
    from django.test import Client

    parts = urlsplit(dsn)
    for alias, database in settings.DATABASES.items():
        database.update(NAME=parts.path.lstrip("/") or "postgres", USER=parts.username or "",
                        PASSWORD=parts.password or "", HOST=parts.hostname or "", PORT=str(parts.port or ""),
                        OPTIONS={"options": f"-c search_path={schema}"})  # fmt: skip
        if alias == "serializable":
            from psycopg import IsolationLevel

            database["OPTIONS"]["isolation_level"] = IsolationLevel.SERIALIZABLE
    scenario, plans = next((s, p) for s, p in app.plans() if s.name == name)
    plan = next(p for p in plans if p.kind == kind)
    prepare(dsn, [(scenario, [plan])], schema=schema)
    try:
        with untraced(dsn, schema) as conn:
            for sql in migrations:
                conn.execute(sql)
        recorded: dict[str, list[str]] = {"leader": [], "follower": []}
        local = threading.local()

        def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
            recorded[local.role].append(sql)
            return execute(sql, params, many, context)

        def request(role: str, path: str, args: list[Any]) -> tuple[int, str]:
            local.role = role
            try:
                with ExitStack() as stack:
                    for alias in settings.DATABASES:
                        stack.enter_context(connections[alias].execute_wrapper(wrapper))
                    response = Client(raise_request_exception=False).post(
                        path, {"args": args}, content_type="application/json"
                    )
            finally:
                connections.close_all()
            return response.status_code, response.content.decode(errors="replace")[:300]

        race.TIMEOUT_S = RACE_TIMEOUT_S
        leader, follower, order = race.duel(
            lambda: request("leader", plan.leader.path, list(plan.leader.args)),
            lambda: request("follower", plan.follower.path, list(plan.follower.args)),
            plan.choreography,
        )
        key = plan.leader.args[1] if name == "write_skew" else plan.leader.args[0]
        with untraced(dsn, schema) as conn:
            fact = FACTS[name if plan.is_bug else f"{name}/control"] if name == "phantom" else FACTS[name]
            row = conn.execute(fact, (key,)).fetchone()
        return {"statuses": [leader[0], follower[0]], "bodies": [leader[1], follower[1]], "commit_order": order,
                "fact": row[0] if row else None, "statements": recorded}  # fmt: skip
    finally:
        drop_schema(dsn, schema)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
