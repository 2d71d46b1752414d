"""The ORM stacks' incidents proven by their own repro: each bug of the flask_sqlalchemy and django_orm stacks (lost
update, write skew, phantom), as the daemon records it on the default telemetry (the ORM's rendered statements with
no parameters, the Debezium row images in ``commits``, the function and file the code locator names), handed to the
repro worker with ``source_root`` at a copy of the stack. The views cannot be called from the spans (they read the
request body), so the repro is SQL level: RED on a scratch PostgreSQL, faithful to the recorded statements (whose
parameters are read back off the row images, :mod:`processors.repro.image_params`), the plan the ORM-level one (the
stack's own code patched), and GREEN from the plan's SQL-level form: proven.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest
from structlog.testing import capture_logs

from bench.corpus.apps import SCENARIOS
from processors.connectors.repro.green import sql_green, unavailable
from processors.model.incident import CommitInfo
from processors.model.outputs import IncidentEvent, ReproEvent
from processors.repair import plan_repairs
from processors.repro.image_params import recovered
from processors.repro.statements import ReproError, to_psycopg
from tests.repair import django_cases, sqla_cases
from tests.repro.test_repro_worker import Worker

# The rows each incident is about, named as the collision detector names them.
ENTITIES: Final = {
    "lost_update": ["corpus_accounts:acc-1"],
    "write_skew": ["corpus_doctors:alice-1", "corpus_doctors:bob-1"],
    "phantom": ["corpus_bookings:1", "corpus_bookings:2"],
}
# (stack, anomaly) -> a line the ORM-level repair adds to the stack's code (not SQL: the ORM's own calls)
ORM_LINES: Final = {
    ("flask_sqlalchemy", "lost_update"): "+        account = _account(session, account_no, lock=True)",
    ("flask_sqlalchemy", "write_skew"): "+    doctor = session.get(Doctor, name, with_for_update=True)",
    ("flask_sqlalchemy", "phantom"): '+    __table_args__ = (UniqueConstraint("room", "day"),)',
    ("django_orm", "lost_update"): "+        account = Account.objects.select_for_update().get(pk=account_no)",
    ("django_orm", "write_skew"): "+    doctor = doctors.select_for_update().get(pk=name)",
    ("django_orm", "phantom"): '+        constraints = [models.UniqueConstraint(fields=["room", "day"]',
}
STRATEGIES: Final = {"lost_update": ["row_lock"], "write_skew": ["row_lock", "row_lock"], "phantom": ["unique_insert"]}


def _django(anomaly: str, root: Path) -> IncidentEvent:
    """The Django round's incident with its row changes (the same rows as the SQLAlchemy stack's), credited to the
    trace that wrote each, as the daemon's ``values_time`` correlation credits them."""
    django_cases.copy_stack(root)
    event = django_cases.round_incident(anomaly)
    writes = [a for a in event.accesses if a.operation != "read"]
    who = [next(a for a in writes if a.trace_id.startswith(t)) for t in "ab"]
    commits = [
        CommitInfo(lsn=101 + i, tx_id=str(700 + i), commit_unix_ms=1_800_000_000_010 + i, offset_ms=10.0 + i,
                   op="c" if before is None else "u", before=before, after=after, trace_id=w.trace_id,
                   span_id=w.span_id, correlation="values_time", skew_ms=0.0)
        for i, ((before, after), w) in enumerate(zip(sqla_cases.IMAGES[anomaly], who, strict=True))
    ]  # fmt: skip
    return event.model_copy(update={"commits": commits})


def stack_incident(stack: str, anomaly: str, root: Path) -> IncidentEvent:
    """The stack's bug as an incident, its code in ``root``; no statement carries a parameter."""
    if stack == "django_orm":
        event = _django(anomaly, root)
    else:  # (``stack_copy`` makes ``<tmp>/flask_sqlalchemy``)
        event = sqla_cases.stack_incident(anomaly, "bug", sqla_cases.stack_copy(root.parent))
    assert all(a.params == [] for a in event.accesses)
    entities = ENTITIES[anomaly]
    return event.model_copy(update={"entity": entities[0], "entities": entities})


@pytest.mark.engines
@pytest.mark.parametrize("anomaly", ["lost_update", "write_skew", "phantom"])
@pytest.mark.parametrize("stack", ["flask_sqlalchemy", "django_orm"])
async def test_an_orm_stack_bug_is_proven_by_its_sql_level_repro(stack: str, anomaly: str, postgres_dsn: str,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    """RED at SQL level and faithful, the ORM-level repair planned on the stack's own code, GREEN from its SQL form."""
    root = tmp_path / stack
    incident = stack_incident(stack, anomaly, root)
    schema = tmp_path / "schema.sql"
    schema.write_text(SCENARIOS[anomaly].schema_sql, encoding="utf-8")
    worker = Worker(tmp_path / "out", postgres_dsn, root, schema_sql=str(schema))
    [event] = await worker.feed(incident)
    assert isinstance(event, ReproEvent)
    assert (event.level, event.red.status, event.divergence.faithful) == ("sql", "failed", True), event.red
    assert event.red.failure.startswith(f"test_repro_{incident.fingerprint}_sql.DefectReproduced: "), event.red
    assert [r.strategy for r in event.repairs] == STRATEGIES[anomaly]
    assert {r.function for r in event.repairs} == {incident.culprit.function}
    assert event.patch.startswith("--- a/app.py\n+++ b/app.py\n"), event.patch
    assert ORM_LINES[stack, anomaly] in event.patch, event.patch
    assert event.green is not None and event.green.status == "passed", event.green
    assert event.proven


@pytest.mark.engines
@pytest.mark.parametrize("stack", ["flask_sqlalchemy", "django_orm"])
async def test_an_orm_atomic_update_is_not_proven_at_sql_level(stack: str, postgres_dsn: str, tmp_path: Path) -> None:
    """The deposit as an invariant violation gets the ORM's atomic update, which edits no recorded statement (the
    UPDATE it sends binds the amount, which no span carries): the repro is RED, but GREEN is not run (replaying the
    unrepaired statements would "fail" the repair), the reason is logged, and the incident is not counted proven."""
    root = tmp_path / stack
    incident = stack_incident(stack, "lost_update", root).model_copy(update={"anomaly": "invariant_violation"})
    schema = tmp_path / "schema.sql"
    schema.write_text(SCENARIOS["lost_update"].schema_sql, encoding="utf-8")
    worker = Worker(tmp_path / "out", postgres_dsn, root, schema_sql=str(schema), reduce=False)
    with capture_logs() as logs:
        [event] = await worker.feed(incident)
    assert isinstance(event, ReproEvent)
    assert (event.level, event.red.status, event.divergence.faithful) == ("sql", "failed", True), event.red
    assert [(r.function, r.strategy) for r in event.repairs] == [("app.deposit", "atomic_update")]
    assert (event.green, event.proven) == (None, False), event.green
    [why] = {e["reason"] for e in logs if e["event"] == "repro.no_sql_green"}
    assert why == (
        "GREEN not available at SQL level: the repair of app.deposit (atomic_update) changes no recorded statement"
        " (the statement it sends binds a value no span carries); only an application-level repro can prove it"
    )


def test_each_placeholder_gets_the_value_its_session_s_row_change_shows(tmp_path: Path) -> None:
    """SET and VALUES from the after-image, a comparison from the row before the change (after it, for a row it
    inserted), a select-list echo bound to NULL; only the accessing trace's own changes count."""
    event = stack_incident("flask_sqlalchemy", "write_skew", tmp_path / "flask_sqlalchemy")
    count, get, update = (a for a in event.accesses if a.trace_id.startswith("b"))
    assert [recovered(a, event.commits) for a in (count, get, update)] == [[1], ["bob-1"], [False, "bob-1"]]
    phantom = _django("phantom", tmp_path / "django_orm")
    check, insert = (a for a in phantom.accesses if a.trace_id.startswith("a"))
    assert recovered(check, phantom.commits) == [None, "2030-01-15", 101]
    assert recovered(insert, phantom.commits) == [101, "2030-01-15", "ann"]


def test_a_placeholder_no_image_holds_is_refused_and_recorded_parameters_are_kept(tmp_path: Path) -> None:
    """``balance + %s`` (the amount is in no image): refused with the reason; recorded parameters are the ones used;
    named placeholders take values only in their order of appearance, never a recorded list."""
    event = _django("lost_update", tmp_path)
    update = next(a for a in event.accesses if a.operation == "write" and a.trace_id.startswith("a"))
    relative = update.model_copy(update={"statement": 'UPDATE "corpus_accounts" SET "balance" = "balance" + %s'})
    with pytest.raises(ReproError, match="no row image of its session holds the placeholder outside a column"):
        recovered(relative, event.commits)
    assert recovered(update.model_copy(update={"params": [7, "x"]}), event.commits) == [7, "x"]
    named = "UPDATE t SET a = %(a)s WHERE id = %(id)s"
    assert to_psycopg(named, [1, 2], in_order=True).sql == "UPDATE t SET a = %s WHERE id = %s"
    with pytest.raises(ReproError, match="named"):
        to_psycopg(named, [1, 2])


def test_the_orm_version_check_has_no_sql_level_form_either(tmp_path: Path) -> None:
    """SQLAlchemy's optimistic version (the lost update's alternative) adds the version column and edits no recorded
    statement (the UPDATE binds the version the code read): GREEN not available at SQL level; the row lock has one."""
    root = tmp_path / "flask_sqlalchemy"
    incident = stack_incident("flask_sqlalchemy", "lost_update", root)
    plan = plan_repairs(incident, root=root)
    [version] = [p for p in plan.alternatives if p.strategy == "optimistic_version"]
    assert unavailable(version).startswith("GREEN not available at SQL level: the repair of app.deposit "
                                           "(optimistic_version) changes no recorded statement")  # fmt: skip
    assert sql_green(incident, version) is None
    assert (plan.strategy, unavailable(plan)) == ("row_lock", "")
