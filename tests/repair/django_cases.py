"""The Django stack's rounds as the daemon reports them: each view's statements as Django sent them, and incidents.

``fixtures/django_statements.json`` holds, per scenario and kind of round, the statements each contender's view sent
(recorded by ``tests.repair.django_rounds`` from the stack running on PostgreSQL; the live test re-records them and
checks they are still these). The stock instrumentation reports no parameters and no ``code.*``: the code locator
names the view (``app.<view>``, from the route) and its checkout's file (``app.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Final

from processors.model.outputs import AccessInfo, IncidentEvent
from processors.repair.classify import lock_of
from tests.repair.cases import REPO, incident

STACK: Final = REPO / "bench" / "corpus" / "stacks" / "django_orm"
FIXTURE: Final = Path(__file__).with_name("fixtures") / "django_statements.json"
TABLES: Final = {"lost_update": "corpus_accounts", "write_skew": "corpus_doctors", "phantom": "corpus_bookings"}
VIEWS: Final = {  # scenario -> kind -> the view that served the round
    "lost_update": {"bug": "deposit", "control:for_update": "deposit_locked",
                    "control:atomic_update": "deposit_atomic"},
    "write_skew": {"bug": "go_off_call", "control:for_update": "go_off_call_locked",
                   "control:serializable_retry": "go_off_call_serializable"},
    "phantom": {"bug": "book", "control:unique_on_conflict": "book_safe"},
}  # fmt: skip
SAFE_TABLE: Final = {"control:unique_on_conflict": "corpus_bookings_safe"}


def recorded() -> dict[str, dict[str, dict[str, list[str]]]]:
    data: dict[str, dict[str, dict[str, list[str]]]] = json.loads(FIXTURE.read_text())
    return data


def copy_stack(root: Path) -> Path:
    """A private copy of the stack's ``app.py`` (the checkout root the planner gets)."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(STACK / "app.py", root / "app.py")
    return root


def operation(statement: str) -> str:
    word = statement.split(None, 1)[0].upper()
    return {"SELECT": "read", "UPDATE": "write", "INSERT": "insert", "DELETE": "delete"}[word]


def accesses(statements: dict[str, list[str]], view: str) -> list[AccessInfo]:
    """The round's statements as AccessInfos of ``app.<view>`` (leader's trace ``a``, follower's ``b``)."""
    out = []
    for role, trace in (("leader", "a"), ("follower", "b")):
        for i, statement in enumerate(statements[role]):
            at = (0 if role == "leader" else 1) + 10 * i
            out.append(AccessInfo(
                trace_id=trace * 32, span_id=f"{trace}{i:015d}", service="corpus-django_orm", version="1.0.0",
                function=f"app.{view}", file="app.py", route="", operation=operation(statement),
                lock=lock_of(statement, None, ("version",)), statement=statement, params=[], set_values={},
                start_unix_ms=1_800_000_000_000 + at, offset_ms=at, error=False, exception="", http_status=200,
                located_by="route",
            ))  # fmt: skip
    return out


def round_incident(scenario: str, kind: str = "bug", statements: dict[str, list[str]] | None = None,
                   **kwargs: Any) -> IncidentEvent:  # fmt: skip
    """The incident of a round of the Django stack (for a control: as if one had been reported)."""
    found = accesses(statements or recorded()[scenario][kind], VIEWS[scenario][kind])
    writes = [a for a in found if a.operation != "read"]
    culprit = next(a for a in writes if a.trace_id.startswith("a"))
    victim = next(a for a in reversed([*found, *writes]) if a.trace_id.startswith("b"))  # its write, if any
    table = SAFE_TABLE.get(kind, TABLES[scenario])
    return incident(scenario, table, f"{table}:1", culprit, victim, found, **kwargs)
