"""The repro sandbox (issue 13): recorded SQL is production's text, so a repro refuses what is not one plain statement
on the incident's table when it compiles, and contains what runs (an unprivileged role of its own on a scratch
database, a statement timeout); the subprocess that runs a generated test sees only an allow-listed environment.

The crafted incidents are the captured lost update with one recorded statement replaced. The run-time tests go one
step further than any incident can: they replace the compiled test's recorded steps (as data, through libcst) with
statements the compiler refuses, to show what the database itself does with them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import libcst as cst
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from processors.model.outputs import IncidentEvent
from processors.repro import GeneratedTest, ReproError, compile_repro, run_repro
from processors.repro.literals import literal
from processors.repro.runner import PASSED, environment
from tests.repro.cases import incident, run_all

FINGERPRINT = "5a4db0c5a4db0c05"  # the crafted incidents' own: their scratch roles and databases are findable
SCRATCH = f"repro\\_{FINGERPRINT}\\_%"
TOKEN = "TRACE_REPRO_GITLAB_TOKEN"


def crafted(statement: str, params: Sequence[Any] = ()) -> IncidentEvent:
    """The captured lost update, its first recorded statement (the job's read) replaced by ``statement``."""
    event = incident("lost_update")
    accesses = list(event.accesses)
    accesses[0] = accesses[0].model_copy(update={"statement": statement, "params": list(params)})
    return event.model_copy(update={"fingerprint": FINGERPRINT, "accesses": accesses})


# ---- refused when the repro is compiled ------------------------------------------------------------------------
REFUSED = {
    "drop-table": ("DROP TABLE accounts", (), "refused recorded SQL: DROP TABLE is not replayed"),
    "drop-qualified": ("DELETE FROM public.accounts WHERE id = %s", (1,), "names 'public.accounts'"),
    "pg-sleep": ("SELECT pg_sleep(600)", (), r"it calls pg_sleep\(\)"),
    "pg-sleep-in-where": (
        "SELECT status FROM orders WHERE id = %s AND pg_catalog.pg_sleep(600) IS NOT NULL",
        (1000,),
        r"it calls pg_sleep\(\)",
    ),
    "copy-program": ("COPY orders TO PROGRAM 'touch /tmp/x'", (), "refused recorded SQL: COPY is not replayed"),
    "copy-query-program": ("COPY (SELECT 1) TO PROGRAM 'touch /tmp/x'", (), "COPY is not replayed"),
    "two-statements": ("SELECT status FROM orders; DROP TABLE orders", (), "2 statements in one"),
    "timeout-off": ("SET statement_timeout = 0", (), "SET is not replayed"),
    "set-config": ("SELECT set_config('statement_timeout', '0', false) FROM orders", (), r"calls set_config\(\)"),
    "server-file": ("SELECT pg_read_file('/etc/passwd') FROM orders", (), r"calls pg_read_file\(\)"),
    "catalog": ("SELECT rolpassword FROM pg_authid", (), "names 'pg_authid'"),
    "do-block": ("DO $$ BEGIN PERFORM pg_sleep(600); END $$", (), "DO is not replayed"),
}


@pytest.mark.parametrize("attack", list(REFUSED))
def test_recorded_sql_that_is_not_one_plain_statement_is_refused_at_compile(attack: str) -> None:
    """A DROP, a COPY ... PROGRAM, a server function, two statements in one: the compiler refuses the incident with
    a message that says what it refused and what a repro replays."""
    statement, params, message = REFUSED[attack]
    with pytest.raises(ReproError, match=message) as refused:
        compile_repro(crafted(statement, params))
    assert "a repro replays only SELECT/INSERT/UPDATE/DELETE, one statement on the incident's table" in str(
        refused.value
    )


def test_a_plain_statement_on_the_table_still_compiles() -> None:
    """The check is not a blanket refusal: the captured read, schema-qualified, compiles."""
    test = compile_repro(crafted("SELECT status, version, amount FROM public.orders WHERE id = %s", (1000,)))
    assert test.level == "sql"


# ---- contained when it runs -------------------------------------------------------------------------------------
def with_steps(test: GeneratedTest, first: str, second: str) -> GeneratedTest:
    """``test`` with the first recorded statement of each session replaced (the data assignment rewritten by libcst,
    the statements as literals): what would run had the compiler let them through."""

    class Steps(cst.CSTTransformer):
        def leave_AnnAssign(self, original: cst.AnnAssign, updated: cst.AnnAssign) -> cst.AnnAssign:
            if not (isinstance(updated.target, cst.Name) and updated.target.value == "STEPS"):
                return updated
            steps = [
                {"session": 1, "kind": "read", "sql": first, "params": None, "rows": None, "values": None},
                {"session": 2, "kind": "read", "sql": second, "params": None, "rows": None, "values": None},
                {"session": 1, "kind": "commit", "sql": "COMMIT", "params": None, "rows": None, "values": None},
                {"session": 2, "kind": "commit", "sql": "COMMIT", "params": None, "rows": None, "values": None},
            ]
            return updated.with_changes(value=literal(steps))

    source = cst.parse_module(test.source).visit(Steps()).code
    assert source != test.source
    return replace(test, source=source)


@pytest.fixture(scope="module")
def victim(postgres_dsn: str) -> Iterator[str]:
    """A table in the server's own database, outside any scratch database (the target of a DROP TABLE)."""
    name = f"sandbox_victim_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


PRIVILEGES = (
    "SELECT r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolbypassrls, r.rolreplication,"
    " array(SELECT datname FROM pg_database d WHERE d.datdba = r.oid) = array[current_database()]::name[],"
    " current_setting('statement_timeout'), current_setting('lock_timeout')"
    " FROM pg_roles r WHERE r.rolname = current_user"
)


@pytest.fixture(scope="module")
def runs(postgres_dsn: str, victim: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run per pair of attacks (one per session), in parallel; each run's marker path, work dir and outcome."""
    base = compile_repro(crafted("SELECT status, version, amount FROM orders WHERE id = %s", (1000,)))
    root = tmp_path_factory.mktemp("sandbox")
    marker = root / "copy-program-ran"
    admin = str(conninfo_to_dict(postgres_dsn).get("user") or "postgres")
    attacks = {
        "sleep": ("SELECT pg_sleep(600)", "SELECT 1", 1000),
        "copy": (f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'", f"COPY orders TO PROGRAM 'touch {marker}'", 5000),
        "drop": (f"DROP TABLE {victim}", f"DROP ROLE {admin}", 5000),
        "escalate": ("ALTER ROLE CURRENT_USER SUPERUSER", "CREATE ROLE sandbox_escaped LOGIN", 5000),
        "privileges": (PRIVILEGES, "SELECT pg_read_file('/etc/hostname')", 5000),
    }
    jobs = {}
    for name, (first, second, ms) in attacks.items():
        test = with_steps(base, first, second)
        jobs[name] = partial(run_repro, test, dsn=postgres_dsn, workdir=root / name, statement_timeout_ms=ms)
    return {"marker": marker, "done": run_all(jobs)}


@pytest.mark.engines
def test_pg_sleep_ends_by_the_statement_timeout(runs: dict[str, Any]) -> None:
    """``pg_sleep(600)`` is cancelled by the role's statement_timeout; the run is an error that says so, never a
    verdict."""
    run, executed = runs["done"]["sleep"]
    assert run.status == "error", run.failure
    assert "timeout" in run.failure and "QueryCanceled" in run.failure, run.failure
    slept = next(s for s in executed if s.step == 0)
    assert slept.outcome == "error" and "statement timeout" in slept.error, slept


@pytest.mark.engines
def test_copy_to_program_is_refused_by_the_database(runs: dict[str, Any]) -> None:
    """Both forms of ``COPY ... TO PROGRAM`` fail for lack of privilege, and the program never ran."""
    _, executed = runs["done"]["copy"]
    copies = [s for s in executed if s.step in (0, 1)]
    assert [s.outcome for s in copies] == ["error", "error"], copies
    assert all("InsufficientPrivilege" in s.error for s in copies), copies
    assert not runs["marker"].exists()


@pytest.mark.engines
def test_drop_reaches_nothing_outside_the_scratch_database(runs: dict[str, Any], postgres_dsn: str,
                                                           victim: str) -> None:  # fmt: skip
    """``DROP TABLE`` of a table in the server's own database does not find it, ``DROP ROLE`` of the server's
    superuser is refused; the table and its row are still there."""
    _, executed = runs["done"]["drop"]
    table, role = (next(s for s in executed if s.step == i) for i in (0, 1))
    assert table.outcome == "error" and "UndefinedTable" in table.error, table
    assert role.outcome == "error" and "InsufficientPrivilege" in role.error, role
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(victim))).fetchall()
    assert rows == [(1,)]


@pytest.mark.engines
def test_no_privilege_can_be_taken(runs: dict[str, Any]) -> None:
    """The role can neither make itself a superuser nor create a role."""
    _, executed = runs["done"]["escalate"]
    attempts = [s for s in executed if s.step in (0, 1)]
    assert [s.outcome for s in attempts] == ["error", "error"], attempts
    assert all("InsufficientPrivilege" in s.error for s in attempts), attempts


@pytest.mark.engines
def test_recorded_sql_runs_as_an_unprivileged_role_with_timeouts(runs: dict[str, Any]) -> None:
    """The statements run as a role that is no superuser, creates no database or role, owns only its scratch
    database, has the statement and lock timeouts set, and cannot read server files."""
    _, executed = runs["done"]["privileges"]
    role, read = (next(s for s in executed if s.step == i) for i in (0, 1))
    assert role.outcome == "ok", role
    assert role.values == [False, False, False, False, False, True, "5s", "5s"]
    assert read.outcome == "error" and "InsufficientPrivilege" in read.error, read


@pytest.mark.engines
def test_runs_leave_no_role_or_scratch_database(runs: dict[str, Any], postgres_dsn: str) -> None:
    """Every run drops its scratch database and the role it made for it."""
    with psycopg.connect(postgres_dsn) as conn:
        roles = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (SCRATCH,)).fetchall()
        databases = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (SCRATCH,)).fetchall()
    assert (roles, databases) == ([], [])


# ---- the subprocess's environment ------------------------------------------------------------------------------
PROBE = '''

def test_environment() -> None:
    """(added by the sandbox test) Writes the environment this generated test runs in."""
    import json
    import os

    with open("environment.json", "w", encoding="utf-8") as out:
        json.dump(dict(os.environ), out)
'''

# The run's own variables, and the two pytest sets in the test's process itself.
RUN_VARIABLES = {"REPRO_DSN", "REPRO_TRACE_OUT", "REPRO_STATEMENT_TIMEOUT_MS", "REPRO_SOURCE_ROOT",
                 "REPRO_SCRATCH_NAME", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTHONDONTWRITEBYTECODE", "PYTEST_VERSION",
                 "PYTEST_CURRENT_TEST"}  # fmt: skip


def allowed(name: str) -> bool:
    return name in PASSED or name.startswith("LC_") or name in RUN_VARIABLES


@pytest.mark.engines
def test_the_daemons_environment_does_not_reach_a_generated_test(
    postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the GitLab token (and other settings) in the daemon's environment, a generated test sees none of them:
    only the allow-listed variables and the run's own."""
    leaks = {TOKEN: "secret", "TRACE_REPRO_KAFKA__BOOTSTRAP": "secret-kafka:9092", "AWS_SECRET_ACCESS_KEY": "secret",
             "PGOPTIONS": "-c statement_timeout=0", "PGPASSWORD": "secret", "PYTHONPATH": "/secret/site"}  # fmt: skip
    for name, value in leaks.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    base = compile_repro(crafted("SELECT status, version, amount FROM orders WHERE id = %s", (1000,)))
    run, _ = run_repro(replace(base, source=base.source + PROBE), dsn=postgres_dsn, workdir=tmp_path)
    seen = json.loads((tmp_path / "environment.json").read_text(encoding="utf-8"))
    assert run.status == "failed", run.failure  # the repro itself still ran (RED) in that environment
    assert TOKEN not in seen
    assert not [name for name, value in seen.items() if "secret" in value], seen
    assert [name for name in seen if not allowed(name)] == []
    assert seen["LC_ALL"] == "C.UTF-8" and seen["REPRO_DSN"] == postgres_dsn


def test_the_environment_is_an_allow_list() -> None:
    """Built from a daemon environment: what is not allow-listed is dropped, whatever its name."""
    daemon = {"PATH": "/usr/bin", "HOME": "/home/d", "LANG": "C.UTF-8", "LC_CTYPE": "C", "TMPDIR": "/t",
              TOKEN: "secret", "TRACE_REPRO_GITLAB_URL": "https://x", "REPRO_DSN": "postgresql://wrong",
              "PYTEST_ADDOPTS": "-p evil", "PYTHONPATH": "/evil", "PYTHONSTARTUP": "/evil.py", "PGPASSWORD": "pw",
              "LD_PRELOAD": "/evil.so", "http_proxy": "http://p"}  # fmt: skip
    env = environment(dsn="postgresql://right", trace=Path("/w/trace.json"), statement_timeout_ms=1500,
                      source_root=None, daemon=daemon)  # fmt: skip
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/d",
        "LANG": "C.UTF-8",
        "LC_CTYPE": "C",
        "TMPDIR": "/t",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "REPRO_DSN": "postgresql://right",
        "REPRO_TRACE_OUT": "/w/trace.json",
        "REPRO_STATEMENT_TIMEOUT_MS": "1500",
    }
