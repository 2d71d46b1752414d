"""The repro compiler without a database: placeholders, the replay gate, the production schedule, and the shape of
the generated file."""

from __future__ import annotations

import ast
import sys

import pytest

from bench.shop.repro_specs import CALL_SPECS, SCHEMA_SQL
from processors.repro import CallSpec, Param, ReproError, compile_repro
from processors.repro.app_level import Const, PerSession
from processors.repro.schedule import build
from processors.repro.statements import shape, to_psycopg
from tests.repro.cases import ANOMALIES, REPO, incident


def test_numbered_placeholders_become_psycopg_ones_with_parameters_reordered() -> None:
    """``$2 ... $1`` → ``%s ... %s`` with the parameters in placeholder order; a literal ``%`` is doubled."""
    form = to_psycopg("UPDATE t SET a = $2, b = 'x%' WHERE id = $1 AND c = '$3'", [7, "v"])
    assert (form.sql, form.params) == ("UPDATE t SET a = %s, b = 'x%%' WHERE id = %s AND c = '$3'", ["v", 7])
    assert form.numbered == "UPDATE t SET a = $1, b = 'x%' WHERE id = $2 AND c = '$3'"


def test_question_marks_outside_strings_and_comments_are_placeholders() -> None:
    """``?`` placeholders are converted in order; ones in strings, identifiers, comments and dollar quotes are not."""
    form = to_psycopg("SELECT '?', \"a?\" FROM t /* ? */ WHERE a = ? AND b = $$?$$ AND c = ? -- ?", [1, 2])
    assert form.sql == "SELECT '?', \"a?\" FROM t /* ? */ WHERE a = %s AND b = $$?$$ AND c = %s -- ?"
    assert form.params == [1, 2]


def test_psycopg_statements_are_kept_as_recorded() -> None:
    """The shop's own statements need no conversion; a statement without parameters runs without any."""
    form = to_psycopg("SELECT stock FROM inventory WHERE sku = %s AND note LIKE 'a%%'", ["s"])
    assert (form.sql, form.params) == ("SELECT stock FROM inventory WHERE sku = %s AND note LIKE 'a%%'", ["s"])
    assert to_psycopg("SELECT 1 FROM t WHERE a LIKE 'x%'", []).params is None


@pytest.mark.parametrize(
    ("statement", "params"),
    [("UPDATE t SET a = %s WHERE id = %s", [1]), ("SELECT a FROM t WHERE id = $2", [1]),
     ("SELECT a FROM t WHERE id = %(id)s", [1]), ("SELECT a FROM t WHERE id = ? AND b = $1", [1, 2]),
     ("SELECT a FROM t", [1])],
)  # fmt: skip
def test_parameters_that_do_not_fit_the_placeholders_are_refused(statement: str, params: list[object]) -> None:
    """Too few or too many parameters, named placeholders, or mixed styles: no repro."""
    with pytest.raises(ReproError):
        to_psycopg(statement, params)


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE orders",
        "SELECT id FROM orders; DELETE FROM orders",
        "DELETE FROM users WHERE id = %s",
        "SELECT pg_read_file('/etc/passwd') FROM orders WHERE id = %s",
        "COPY orders TO PROGRAM 'touch /tmp/pwned'",
        "WITH x AS (DELETE FROM orders RETURNING id) SELECT id FROM orders WHERE id = %s",
        "SELECT id INTO stolen FROM orders WHERE id = %s",
        "SELECT o.id FROM orders o JOIN secrets s ON s.id = o.id WHERE o.id = %s",
    ],
)
def test_only_plain_dml_on_the_incident_table_is_replayed(statement: str) -> None:
    """Recorded SQL is untrusted: anything but one SELECT/INSERT/UPDATE/DELETE on the entity's table is refused."""
    with pytest.raises(ReproError):
        shape(to_psycopg(statement, [1] if "%s" in statement else []), "orders")


def test_a_statement_refused_by_the_gate_refuses_the_whole_repro() -> None:
    """An incident whose recorded statement is not plain DML compiles to nothing."""
    event = incident("lost_update")
    hostile = event.accesses[0].model_copy(update={"statement": "COPY orders TO PROGRAM 'touch /tmp/x'", "params": []})
    with pytest.raises(ReproError, match="only SELECT/INSERT/UPDATE/DELETE"):
        compile_repro(event.model_copy(update={"accesses": [hostile, *event.accesses[1:]]}))


def test_unsupported_anomalies_and_levels_are_refused() -> None:
    """A regression has no repro; the level must be sql or app; app needs CallSpecs for the recorded functions."""
    event = incident("lost_update")
    with pytest.raises(ReproError, match="regression"):
        compile_repro(event.model_copy(update={"anomaly": "regression"}))
    with pytest.raises(ReproError, match="isolation"):
        compile_repro(event, session_isolation={"shop.jobs.expire_cart": "read_uncommitted"})
    with pytest.raises(ReproError, match="level"):
        compile_repro(event, level="java")
    with pytest.raises(ReproError, match="call_specs"):
        compile_repro(event, level="app")
    with pytest.raises(ReproError, match="no CallSpec"):
        compile_repro(event, level="app", call_specs={"shop.jobs.expire_cart": CALL_SPECS["shop.jobs.expire_cart"]})


def test_commits_go_to_the_sessions_in_lock_order_when_correlation_names_one_trace_twice() -> None:
    """The captured oversell correlates both commits to one trace; each writer still gets its own transaction."""
    event = incident("invariant_violation")
    assert len({c.trace_id for c in event.commits}) == 1
    steps = build(event).steps
    assert [(s.session, s.kind, s.rows, s.values) for s in steps] == [
        (1, "read", 1, [1]), (2, "read", 1, [1]), (2, "write", 1, [0]), (1, "write", 1, [-1]),
        (2, "commit", None, None), (1, "commit", None, None),
    ]  # fmt: skip


def test_the_broken_invariant_comes_from_the_incidents_typed_field_not_its_damage() -> None:
    """The detector names the invariant in ``invariant``; the repro uses it whatever the damage's sentence says (an
    event from before the field, like the captured one, is still read from its damage)."""
    captured = incident("invariant_violation")
    assert captured.invariant == "" and build(captured).invariant == "stock >= 0"  # the fallback for old events
    reworded = captured.model_copy(update={"damage": "stock went negative", "invariant": "stock >= 0"})
    assert build(reworded).invariant == "stock >= 0"
    other = captured.model_copy(update={"invariant": "stock >= -5"})  # the field wins over the sentence
    assert build(other).invariant == "stock >= -5"


def test_the_schedule_knows_keys_seeds_and_the_derived_table() -> None:
    """Typed keys from the parameters, seeds from the earliest before-image, and a minimal table from the images."""
    lost, oversell, double = (build(incident(a)) for a in ANOMALIES)
    assert (lost.key, lost.identity, lost.seed) == (
        {"id": 1000}, False, [{"id": 1000, "status": "pending", "amount": 4200, "version": 0}])  # fmt: skip
    assert lost.columns == [["id", "bigint", ""], ["status", "text", ""], ["amount", "bigint", ""],
                            ["version", "bigint", ""]]  # fmt: skip
    assert (oversell.key, oversell.invariant) == ({"sku": "sku-d3912d92-0"}, "stock >= 0")
    assert (double.key, double.identity, double.seed) == ({"order_id": 1009}, True, [])
    assert double.columns[0] == ["id", "bigint", "identity"]


def test_an_invariant_that_is_not_a_plain_predicate_is_refused() -> None:
    """The invariant becomes SQL in the test only after the daemon's own checker accepts it."""
    with pytest.raises(ReproError, match="unsupported"):
        compile_repro(incident("invariant_violation"), invariants=["stock >= (SELECT 0)"])
    test = compile_repro(incident("invariant_violation"), invariants=["stock >= 0 AND sku IS NOT NULL"])
    assert "'invariant_sql': '\"stock\" >= 0 AND \"sku\" IS NOT NULL'" in test.source


@pytest.mark.parametrize("level", ["sql", "app"])
@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_generated_files_import_only_the_standard_library_pytest_and_psycopg(anomaly: str, level: str) -> None:
    """A generated repro runs with pytest alone: no trace-repro, no application import at module level."""
    test = compile_repro(incident(anomaly), level=level, schema_sql=SCHEMA_SQL, call_specs=CALL_SPECS)
    modules = set()
    for node in ast.parse(test.source).body:
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert "psycopg" in modules and modules - set(sys.stdlib_module_names) <= {"psycopg", "pytest"}
    assert "time.sleep" not in test.source and "sleep(" not in test.source


@pytest.mark.parametrize("level", ["sql", "app"])
def test_each_module_is_imported_on_one_line_across_the_templates(level: str) -> None:
    """The harness templates' imports are merged: one ``from m import ...`` per module unless a name is aliased."""
    test = compile_repro(incident("lost_update"), level=level, schema_sql=SCHEMA_SQL, call_specs=CALL_SPECS)
    plain = [n.module for n in ast.parse(test.source).body
             if isinstance(n, ast.ImportFrom) and all(a.asname is None for a in n.names)]  # fmt: skip
    assert len(plain) == len(set(plain))
    assert "from collections.abc import Callable, Iterator\n" in test.source


def test_app_arguments_come_from_the_recorded_parameters_by_the_call_specs() -> None:
    """A spec's arguments resolve to the recorded sku, a fresh value per session and a fixed one; a bad spec is
    refused."""
    spec = CallSpec("bench.shop.handlers:checkout", (Param(0, 0), PerSession(9_000_000), Const(4200)))
    test = compile_repro(incident("invariant_violation"), level="app", call_specs={"shop.handlers.checkout": spec})
    assert "'args': ['sku-d3912d92-0', 9000001, 4200]" in test.source
    assert "'args': ['sku-d3912d92-0', 9000002, 4200]" in test.source
    assert test.source_root == str(REPO)
    bad = {"shop.handlers.checkout": CallSpec("bench.shop.handlers:checkout", (Param(0, 5),))}
    with pytest.raises(ReproError, match="no parameter #5"):
        compile_repro(incident("invariant_violation"), level="app", call_specs=bad)
    elsewhere = {"shop.handlers.checkout": CallSpec("other.module:checkout")}
    with pytest.raises(ReproError, match="source_root"):
        compile_repro(incident("invariant_violation"), level="app", call_specs=elsewhere)
