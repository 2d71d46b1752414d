"""A Django migration for a repair's new unique constraint, when the model's app has a ``migrations`` package.

The migration is ``NNNN_<constraint>.py`` with the number after the highest existing one, depending on the app's
latest migration (the one with that number; several are refused: merge them first, and the plan keeps the SQL and
a note), with ``migrations.AddConstraint(model_name=..., constraint=models.UniqueConstraint(fields=[...],
name=...))``, the operation ``makemigrations`` writes for the constraint the model now declares, so ``migrate``
creates it and ``migrate <app> <previous>`` drops it. Every name in it is a string literal, never formatted in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import libcst as cst

from processors.repair.edits import string_literal
from processors.repair.migration_files.alembic import docstring
from processors.repair.patch import Patch
from processors.repair.strategies.base import NotApplicable, Op

_NUMBERED = re.compile(r"^(\d{4})_\w+\.py$")


def migrations_dir(model_path: Path) -> Path | None:
    """The ``migrations`` package of the app whose models are in ``model_path`` (None: the app has none)."""
    package = model_path.parent / "migrations"
    return package if (package / "__init__.py").is_file() else None


def app_label(model_path: Path, meta: cst.ClassDef | None) -> str:
    """The model's app label: its ``Meta.app_label`` literal, else the name of its app's directory."""
    for stmt in meta.body.body if meta is not None else ():
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else None
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.SimpleString):
            target = small.targets[0].target
            value = small.value.evaluated_value
            if isinstance(target, cst.Name) and target.value == "app_label" and isinstance(value, str):
                return value
    return model_path.parent.name


def latest(package: Path, created: Mapping[Path, bytes]) -> tuple[int, str | None]:
    """(the highest number, the migration holding it, None when there is none); NotApplicable when several do."""
    names = {p.name for p in package.glob("*.py")} | {p.name for p in created if p.parent == package}
    numbered = sorted((int(m.group(1)), name[:-3]) for name in names if (m := _NUMBERED.match(name)))
    if not numbered:
        return 0, None
    top = numbered[-1][0]
    leaves = [name for number, name in numbered if number == top]
    if len(leaves) > 1:
        raise NotApplicable(f"the app has several latest migrations ({', '.join(leaves)}): merge them first")
    return top, leaves[0]


def add_constraint_op(package: Path, app_label: str, model: str, fields: Sequence[str], name: str) -> Op:
    """The patch operation creating the migration that adds ``UniqueConstraint(fields=..., name=name)``."""
    slug = re.sub(r"\W+", "_", name.lower()).strip("_")[:60] or "unique"

    def op(patch: Patch) -> None:
        number, previous = latest(package, patch.created)
        present = [*package.glob("*.py"), *(p for p in patch.created if p.parent == package)]
        if any(_NUMBERED.match(p.name) and p.name[5:] == f"{slug}.py" for p in present):
            return  # made by an earlier plan (or another writer of this one)
        lit = string_literal
        depends = f"({lit(app_label).value}, {lit(previous).value})" if previous else ""
        listed = ", ".join(lit(f).value for f in fields)
        lines = [
            docstring(f"trace-repro: the unique constraint {name} on {model} ({', '.join(fields)})."),
            "",
            "from django.db import migrations, models",
            "",
            "",
            "class Migration(migrations.Migration):",
            f"    dependencies = [{depends}]",
            "",
            "    operations = [",
            "        migrations.AddConstraint(",
            f"            model_name={lit(model.lower()).value},",
            f"            constraint=models.UniqueConstraint(fields=[{listed}], name={lit(name).value}),",
            "        ),",
            "    ]",
            "",
        ]
        patch.create(package / f"{number + 1:04d}_{slug}.py", "\n".join(lines).encode())

    return op
