"""The flask_sqlalchemy stack's code paths as the daemon records them, and incidents built from them.

The statements are SQLAlchemy's own text (``fixtures/flask_sqlalchemy_statements.json``, recorded from the stack's
views on PostgreSQL with a ``before_cursor_execute`` listener; ``test_sqlalchemy_orm_live`` checks on every run that
the stack still sends exactly these); each
access's operation and lock are the daemon's classification of that text (``SqlAccessExtractor``). The function and
file are what the code locator names in the stack's checkout (``app.<view>`` in ``app.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Final

from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.incident import CommitInfo
from processors.model.outputs import AccessInfo, IncidentEvent
from processors.model.span import Span
from processors.sql import SqlAccessExtractor
from tests.repair.cases import REPO, incident

STACK: Final = REPO / "bench" / "corpus" / "stacks" / "flask_sqlalchemy"
RECORDED: Final = Path(__file__).with_name("fixtures") / "flask_sqlalchemy_statements.json"
TABLES: Final = {"lost_update": "corpus_accounts", "write_skew": "corpus_doctors", "phantom": "corpus_bookings"}
# Each round's row changes as Debezium shows them (before, after), the leader's first.
IMAGES: Final = {
    "lost_update": [({"account_no": "acc-1", "balance": 100}, {"account_no": "acc-1", "balance": 110}),
                    ({"account_no": "acc-1", "balance": 110}, {"account_no": "acc-1", "balance": 125})],
    "write_skew": [({"name": "alice-1", "shift": 1, "on_call": True},
                    {"name": "alice-1", "shift": 1, "on_call": False}),
                   ({"name": "bob-1", "shift": 1, "on_call": True}, {"name": "bob-1", "shift": 1, "on_call": False})],
    "phantom": [(None, {"booking_id": 1, "room": 101, "day": "2030-01-15", "guest": "ann"}),
                (None, {"booking_id": 2, "room": 101, "day": "2030-01-15", "guest": "bo"})],
}  # fmt: skip
_WRITES: Final = ("write", "insert", "delete")


def recorded() -> dict[str, dict[str, object]]:
    """``{"<scenario>/<kind>": {"view": name, "status": int, "statements": [...]}}``."""
    data: dict[str, dict[str, object]] = json.loads(RECORDED.read_text())
    return data


def stack_copy(tmp_path: Path) -> Path:
    """A root holding a private copy of the stack's ``app.py`` (the code locator's checkout of the service)."""
    root = tmp_path / "flask_sqlalchemy"
    root.mkdir()
    shutil.copy(STACK / "app.py", root / "app.py")
    return root


def classified(statement: str) -> tuple[str, str]:
    """(operation, lock) as the daemon's extractor gives them for SQLAlchemy's text (no parameters recorded)."""
    span = Span(trace_id="0" * 32, span_id="0" * 16, parent_id="", name="s", kind=SpanKind.CLIENT, start_ns=0,
                end_ns=0, status=StatusCode.UNSET, resource=Resource(service="corpus-flask_sqlalchemy"),
                db=DbCall(system="postgresql", statement=statement, params=()))  # fmt: skip
    [found] = SqlAccessExtractor().accesses(span)
    return found.operation.value, found.lock.value


def path_accesses(key: str, trace: str, root: Path, at: float = 0.0) -> list[AccessInfo]:
    """One request of the recorded view ``key`` (``"lost_update/bug"``): its statements as accesses."""
    entry = recorded()[key]
    statements = entry["statements"]
    assert isinstance(statements, list)
    out = []
    for i, statement in enumerate(statements):
        operation, lock = classified(statement)
        out.append(AccessInfo(
            trace_id=trace * 32, span_id=f"{trace}{i:015d}", service="corpus-flask_sqlalchemy", version="1.0.0",
            function=f"app.{entry['view']}", file="app.py", route="", operation=operation, lock=lock,
            statement=statement, params=[], set_values={}, start_unix_ms=1_800_000_000_000 + at + i,
            offset_ms=at + i, error=False, exception="", http_status=200, located_by="route",
        ))  # fmt: skip
    return out


def stack_incident(anomaly: str, kind: str, root: Path) -> IncidentEvent:
    """Two requests of the view of ``kind`` (the leader ``a`` commits first, the follower ``b``), as an incident, with
    their row changes (no statement parameters: the stack's spans carry none)."""
    leader = path_accesses(f"{anomaly}/{kind}", "a", root, at=0)
    follower = path_accesses(f"{anomaly}/{kind}", "b", root, at=1)
    accesses = sorted(leader + follower, key=lambda a: a.start_unix_ms)
    culprit = next(a for a in leader if a.operation in _WRITES)
    victim = next(a for a in follower if a.operation in _WRITES)
    table = TABLES[anomaly]
    commits = [
        CommitInfo(lsn=101 + i, tx_id=str(700 + i), commit_unix_ms=1_800_000_000_010 + i, offset_ms=10.0 + i,
                   op="c" if before is None else "u", before=before, after=after, trace_id=who.trace_id,
                   span_id=who.span_id, correlation="values_time", skew_ms=0.0)
        for i, ((before, after), who) in enumerate(zip(IMAGES[anomaly], (culprit, victim), strict=True))
    ]  # fmt: skip
    event = incident(anomaly, table, f"{table}:x", culprit, victim, accesses)
    return event.model_copy(update={"commits": commits})
