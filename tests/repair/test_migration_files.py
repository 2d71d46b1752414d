"""Repairs that add migration files: a created file in the patch machinery (diff, apply, revert, the MR path), the
Alembic revision of a SQLAlchemy repair (its head found, its op calls read with :mod:`ast`: Alembic is not a
dependency), and the Django migration of the unique constraint, run by Django's ``migrate`` on PostgreSQL."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from processors.connectors.repro.config import ReproConfig
from processors.connectors.repro.worker import ReproWorker
from processors.repair.file_patch import FilePatch, PatchError, apply_files, revert_files, unified_diff
from processors.repair.migration_files import alembic, django
from processors.repair.patch import Patch
from processors.repair.planner import RepairPlan, apply, plan_repairs, revert
from processors.repair.source import SourceIndex
from processors.repair.strategies import OPTIMISTIC_VERSION, UNIQUE_INSERT
from sinks.gitlab import patching
from streamer.engines import LocalEngines
from tests.repair.django_cases import copy_stack, round_incident
from tests.repair.sqla_cases import stack_copy, stack_incident
from tests.repair.test_repair_anomalies import source_copy
from tests.repro.anomalies import CASES

INITIAL_REVISION = '''"""initial"""
revision = "0001aaaa"
down_revision = None
'''
SECOND_REVISION = '''"""accounts"""
from typing import Sequence, Union

revision: str = "0002bbbb"
down_revision: Union[str, Sequence[str], None] = "0001aaaa"
'''
DJANGO_INITIAL = """from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.CreateModel(
            name="Booking",
            fields=[
                ("booking_id", models.AutoField(primary_key=True, serialize=False)),
                ("room", models.IntegerField()),
                ("day", models.TextField()),
                ("guest", models.TextField()),
            ],
            options={"db_table": "corpus_bookings"},
        ),
    ]
"""


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def created(plan: RepairPlan) -> list[FilePatch]:
    return [f for f in plan.files if f.before is None]


def test_a_created_file_is_diffed_as_git_does_applied_and_reverted(tmp_path: Path) -> None:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "app.py").write_bytes(b"x = 1\n")
    files = [FilePatch("app.py", b"x = 1\n", b"x = 2\n"), FilePatch("migrations/0002_x.py", None, b"a = 1\nb = 2\n")]
    diff = unified_diff(files)
    assert "--- /dev/null\n+++ b/migrations/0002_x.py\n@@ -0,0 +1,2 @@\n+a = 1\n+b = 2\n" in diff
    git = tmp_path / "git"
    git.mkdir()
    (git / "migrations").mkdir()
    (git / "app.py").write_bytes(b"x = 1\n")
    subprocess.run(["git", "init", "-q"], cwd=git, check=True)
    subprocess.run(["git", "apply", "-"], cwd=git, input=diff.encode(), check=True)  # as git applies it
    assert (git / "migrations" / "0002_x.py").read_bytes() == b"a = 1\nb = 2\n"
    [_, new] = patching.parse(diff)  # the merge-request path commits it with the "create" action
    assert (new.old_path, patching.apply(None, new)) == (None, "a = 1\nb = 2\n")
    original = tree(tmp_path / "migrations")
    apply_files(files, tmp_path)
    apply_files(files, tmp_path)  # idempotent
    assert (tmp_path / "migrations" / "0002_x.py").read_bytes() == b"a = 1\nb = 2\n"
    revert_files(files, tmp_path)
    revert_files(files, tmp_path)
    assert tree(tmp_path / "migrations") == original and (tmp_path / "app.py").read_bytes() == b"x = 1\n"
    (tmp_path / "migrations" / "0002_x.py").write_bytes(b"someone else's\n")
    with pytest.raises(PatchError, match="exists already"):
        apply_files(files, tmp_path)
    assert (tmp_path / "app.py").read_bytes() == b"x = 1\n"  # all or nothing
    with pytest.raises(PatchError, match="changed since"):
        revert_files(files, tmp_path)
    assert (tmp_path / "migrations" / "0002_x.py").read_bytes() == b"someone else's\n"


def alembic_setup(root: Path) -> Path:
    (root / "alembic.ini").write_text("[alembic]\nscript_location = %(here)s/db\n")
    versions = root / "db" / "versions"
    versions.mkdir(parents=True)
    (root / "db" / "env.py").write_text("# env\n")
    (versions / "1111_initial.py").write_text(INITIAL_REVISION)
    (versions / "2222_accounts.py").write_text(SECOND_REVISION)
    return versions


def op_calls(source: bytes, function: str) -> list[tuple[str, list[object], dict[str, object]]]:
    """The ``op.<name>(...)`` calls of ``function`` with their literal arguments (``sa.*`` calls by their text)."""

    def value(node: ast.expr) -> object:
        return ast.unparse(node) if isinstance(node, ast.Call) else ast.literal_eval(node)

    [fn] = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function]
    out = []
    for stmt in fn.body:
        assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
        call = stmt.value
        assert isinstance(call.func, ast.Attribute) and ast.unparse(call.func.value) == "op"
        out.append(
            (call.func.attr, [value(a) for a in call.args], {k.arg or "": value(k.value) for k in call.keywords})
        )
    return out


def test_sqlalchemy_repairs_add_an_alembic_revision_after_the_head(tmp_path: Path) -> None:
    root = stack_copy(tmp_path)
    versions = alembic_setup(root)
    original = tree(root)
    plan = plan_repairs(stack_incident("phantom", "bug", root), root=root)
    assert plan.strategy == UNIQUE_INSERT
    [revision] = created(plan)
    assert revision.path.startswith("db/versions/") and f"--- /dev/null\n+++ b/{revision.path}\n" in plan.diff
    source = revision.after
    compile(source, revision.path, "exec")
    module = ast.parse(source)
    assigned = {n.targets[0].id: ast.literal_eval(n.value) for n in module.body if isinstance(n, ast.Assign)}  # type: ignore[attr-defined]
    assert assigned["down_revision"] == "0002bbbb" and len(assigned["revision"]) == 12
    assert op_calls(source, "upgrade") == [
        ("create_unique_constraint", ["corpus_bookings_room_day_key", "corpus_bookings", ["room", "day"]], {})
    ]
    assert op_calls(source, "downgrade") == [
        ("drop_constraint", ["corpus_bookings_room_day_key", "corpus_bookings"], {"type_": "unique"})
    ]
    apply(plan, root)
    assert (root / revision.path).read_bytes() == source
    revert(plan, root)
    assert tree(root) == original
    again = plan_repairs(stack_incident("phantom", "bug", root), root=root)
    assert created(again) == [revision]  # deterministic

    lost = plan_repairs(stack_incident("lost_update", "bug", root), root=root)
    [versioned] = [a for a in lost.alternatives if a.strategy == OPTIMISTIC_VERSION]
    [column] = created(versioned)
    assert op_calls(column.after, "upgrade") == [
        ("add_column", ["corpus_accounts", "sa.Column('version', sa.Integer(), nullable=False, server_default='1')"],
         {})
    ]  # fmt: skip
    assert op_calls(column.after, "downgrade") == [("drop_column", ["corpus_accounts", "version"], {})]

    (versions / "3333_branch.py").write_text('revision = "0003cccc"\ndown_revision = "0001aaaa"\n')
    branched = plan_repairs(stack_incident("phantom", "bug", root), root=root)
    assert branched.strategy == UNIQUE_INSERT and created(branched) == []
    assert any("several heads (0002bbbb, 0003cccc): merge them first" in n for n in branched.notes), branched.notes


def test_without_alembic_or_migrations_the_plan_keeps_the_sql_only(tmp_path: Path) -> None:
    root = stack_copy(tmp_path)
    plan = plan_repairs(stack_incident("phantom", "bug", root), root=root)
    assert created(plan) == [] and plan.migrations
    django = copy_stack(tmp_path / "django")
    plan = plan_repairs(round_incident("phantom"), root=django)
    assert plan.strategy == UNIQUE_INSERT and created(plan) == [] and plan.migrations


MIGRATE = """
import sys
from django.conf import settings
site, stack, dsn, schema, target = sys.argv[1:]
sys.path[:0] = [stack, site]
from urllib.parse import urlsplit
parts = urlsplit(dsn)
settings.configure(
    INSTALLED_APPS=["corpus_app"], MIGRATION_MODULES={"corpus": "migrations"},
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/") or "postgres",
                           "USER": parts.username or "", "PASSWORD": parts.password or "", "HOST": parts.hostname,
                           "PORT": str(parts.port or ""), "OPTIONS": {"options": f"-c search_path={schema}"}}},
)
import django
django.setup()
from django.core.management import call_command
call_command("migrate", "corpus", target, verbosity=0)
"""


def migrate(tmp_path: Path, stack: Path, dsn: str, schema: str, target: str) -> None:
    site = tmp_path / "site"
    (site / "corpus_app").mkdir(parents=True, exist_ok=True)
    (site / "corpus_app" / "__init__.py").write_text("")
    (site / "corpus_app" / "apps.py").write_text(textwrap.dedent("""\
        from django.apps import AppConfig

        class CorpusConfig(AppConfig):
            name = "corpus_app"
            label = "corpus"
        """))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", MIGRATE, str(site), str(stack), dsn, schema, target],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def unique_constraints(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT c.conname FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace "
                            "WHERE n.nspname = %s AND c.contype = 'u' ORDER BY 1", (schema,)).fetchall()  # fmt: skip
    return [r[0] for r in rows]


@pytest.mark.engines
def test_the_django_repair_adds_a_migration_that_migrate_runs(engines: LocalEngines, tmp_path: Path) -> None:
    dsn = engines.address("postgres")
    stack = copy_stack(tmp_path / "stack")
    (stack / "migrations").mkdir()
    (stack / "migrations" / "__init__.py").write_text("")
    (stack / "migrations" / "0001_initial.py").write_text(DJANGO_INITIAL)
    original = tree(stack)
    plan = plan_repairs(round_incident("phantom"), root=stack)
    assert plan.strategy == UNIQUE_INSERT
    [migration] = created(plan)
    assert migration.path == "migrations/0002_corpus_bookings_room_day_key.py", plan.notes
    assert f"--- /dev/null\n+++ b/{migration.path}\n" in plan.diff
    schema = f"migration_files_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        apply(plan, stack)
        migrate(tmp_path, stack, dsn, schema, "0002")
        assert unique_constraints(dsn, schema) == ["corpus_bookings_room_day_key"]
        migrate(tmp_path, stack, dsn, schema, "0001")  # the migration reverses
        assert unique_constraints(dsn, schema) == []
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
        revert(plan, stack)
    assert {k: v for k, v in tree(stack).items() if "__pycache__" not in k} == original


def test_names_from_the_recorded_sql_stay_string_literals_in_the_migration_files(tmp_path: Path) -> None:
    """A hostile table, column or constraint name becomes a string literal, never code (nor a docstring's end)."""
    hostile = '"""); import os; os.system("x"); ("'
    versions = alembic_setup(tmp_path)
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "__init__.py").write_text("")
    patch = Patch(SourceIndex(tmp_path))
    lines = alembic.unique_constraint(hostile, f"{hostile}.t", [hostile, "day"])
    alembic.revision_op(versions, "CREATE UNIQUE INDEX ...", f"unique {hostile}", *lines)(patch)
    django.add_constraint_op(tmp_path / "migrations", hostile, hostile, [hostile], hostile)(patch)
    [(_, none, revision), (_, _, migration)] = patch.render()
    assert none is None
    calls = op_calls(revision, "upgrade")
    assert calls == [("create_unique_constraint", [hostile, "t", [hostile, "day"]], {"schema": hostile})]
    assert all(isinstance(n, ast.Expr | ast.ImportFrom | ast.Import | ast.Assign | ast.FunctionDef)
               for n in ast.parse(revision).body)  # fmt: skip
    module = ast.parse(migration)
    assert [type(n) for n in module.body] == [ast.Expr, ast.ImportFrom, ast.ClassDef]
    assert hostile in [c.value for c in ast.walk(module) if isinstance(c, ast.Constant)]
    assert "os.system" not in {ast.unparse(n) for n in ast.walk(module) if isinstance(n, ast.Attribute)}


@pytest.mark.engines
def test_the_green_run_leaves_a_created_migration_out_of_its_partial_copy(postgres_dsn: str, tmp_path: Path) -> None:
    """The code-level GREEN copies only the called packages: a migration the plan creates elsewhere (``db/versions``
    at the root) stays out of that copy (its schema change runs as SQL), and GREEN still runs and passes."""
    root = source_copy(tmp_path / "app")
    (root / "db" / "versions").mkdir(parents=True)
    config = ReproConfig(enabled=True, output_dir=str(tmp_path / "out"), source_root=str(root), copy_paths=["bench"],
                         call_specs="bench.shop.repro_specs:CALL_SPECS",
                         schema_sql=str(root / "bench" / "shop" / "schema.sql"))  # fmt: skip
    worker = ReproWorker(config, graph=None, publish=None, dsn=postgres_dsn, invariants={})  # type: ignore[arg-type]
    incident = CASES["phantom"](root)
    plan = plan_repairs(incident, root=root)
    revision = FilePatch("db/versions/0001_x.py", None, b'revision = "0001"\n')
    test = worker._compile(incident, "app", worker.call_specs)
    (tmp_path / "w").mkdir()
    green = worker._green(
        incident, test, replace(plan, files=[*plan.files, revision]), tmp_path / "w", worker.call_specs
    )
    assert green.status == "passed", green
    assert not (root / revision.path).exists()  # the checkout itself is never written
