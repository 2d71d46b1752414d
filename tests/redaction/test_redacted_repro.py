"""A repro compiled from a redacted incident: valid Python that says it replays placeholders, and still RED on a real
PostgreSQL when the defect does not depend on the redacted values."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from processors.model.outputs import IncidentEvent
from processors.redaction import DROPPED, Policy, RedactionConfig, Redactor
from processors.repro import compile_repro, run_repro
from tests.repro.cases import incident

pytestmark = pytest.mark.engines
EMAIL = "ann.lee@example.com"


def with_email(e: IncidentEvent) -> IncidentEvent:
    """``e`` on a table whose rows also hold a customer's email (a column that looks sensitive)."""
    commits = [
        c.model_copy(update={"before": c.before and {**c.before, "email": EMAIL},
                             "after": c.after and {**c.after, "email": EMAIL}})
        for c in e.commits
    ]  # fmt: skip
    return e.model_copy(update={"commits": commits})


def test_a_repro_of_a_redacted_incident_compiles_says_so_and_still_reproduces(postgres_dsn: str,
                                                                              tmp_path: Path) -> None:  # fmt: skip
    """The dropped email is the placeholder in the seed rows; the docstring says so; the lost update is still RED."""
    event = Redactor(Policy(RedactionConfig()))(with_email(incident("lost_update")))
    assert event.commits[0].before and event.commits[0].before["email"] == DROPPED
    test = compile_repro(event)  # no schema: the table is derived from the (redacted) row images
    ast.parse(test.source)
    assert EMAIL not in test.source and repr(DROPPED) in test.source
    doc = ast.get_docstring(ast.parse(test.source)) or ""
    assert "redacted" in doc and "[REDACTED]" in doc
    run, _executed = run_repro(test, dsn=postgres_dsn, workdir=tmp_path)
    assert run.status == "failed" and "DefectReproduced" in run.failure, run.failure
    plain = compile_repro(with_email(incident("lost_update")))
    assert "redacted" not in (ast.get_docstring(ast.parse(plain.source)) or "")
