"""An Alembic revision for a SQLAlchemy repair's schema change, when the project keeps its migrations in Alembic.

The setup is found next to the model or above it (up to the checkout's root): an ``alembic.ini`` and the script
directory its ``script_location`` names, or an ``alembic/`` or ``migrations/`` directory, each with ``env.py`` and
``versions/``. The revision follows the current head: the one revision no other names as its ``down_revision``
(read with :mod:`ast`, never imported); several heads are refused (merge them first), and the plan then keeps the
SQL and a note. Its id is the first 12 hex digits of the SHA-256 of the migration SQL (a plan made twice creates
the same file); every name in it (table, columns, constraint) is written as a string literal, never formatted in.
"""

from __future__ import annotations

import ast
import configparser
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from processors.repair.edits import string_literal
from processors.repair.patch import Patch
from processors.repair.strategies.base import NotApplicable, Op, Outcome


def versions_dir(start: Path, root: Path) -> Path | None:
    """The ``versions/`` directory of the Alembic setup of the code in ``start`` (None: the project has none)."""
    here = start.resolve()
    top = root.resolve()
    while True:
        for script in _script_dirs(here):
            if (script / "env.py").is_file() and (script / "versions").is_dir():
                return script / "versions"
        if here == top or top not in here.parents:
            return None
        here = here.parent


def _script_dirs(here: Path) -> list[Path]:
    found = []
    ini = here / "alembic.ini"
    if ini.is_file():
        parser = configparser.ConfigParser(defaults={"here": str(here)})
        try:
            parser.read(ini, encoding="utf-8")
            location = parser.get("alembic", "script_location", fallback="")
        except (configparser.Error, UnicodeDecodeError):
            location = ""
        if location and ":" not in location.replace(str(here), ""):  # ``package:resource`` locations are not read
            found.append((here / location).resolve())
    return [*found, here / "alembic", here / "migrations"]


def head(versions: Path, created: Mapping[Path, bytes]) -> str | None:
    """The current head revision (None: no revision yet); NotApplicable when there are several."""
    revisions: dict[str, list[str]] = {}
    sources = {p: p.read_bytes() for p in sorted(versions.glob("*.py"))}
    sources.update({p: data for p, data in created.items() if p.parent == versions})
    for path, data in sources.items():
        try:
            found = _revision(ast.parse(data, str(path)))
        except (SyntaxError, ValueError) as exc:
            raise NotApplicable(f"Alembic revision {path.name} cannot be read: {exc}") from exc
        if found is not None:
            revisions[found[0]] = found[1]
    named = {down for downs in revisions.values() for down in downs}
    heads = sorted(set(revisions) - named)
    if len(heads) > 1:
        raise NotApplicable(f"Alembic has several heads ({', '.join(heads)}): merge them first")
    if revisions and not heads:
        raise NotApplicable("Alembic's revisions form a cycle: no head")
    return heads[0] if heads else None


def _revision(tree: ast.Module) -> tuple[str, list[str]] | None:
    """(revision, its down revisions) of one revision file (None: not a revision)."""
    values: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            values[node.target.id] = node.value
    if "revision" not in values:
        return None
    revision = ast.literal_eval(values["revision"])
    down = ast.literal_eval(values["down_revision"]) if "down_revision" in values else None
    downs = [down] if isinstance(down, str) else list(down or ())
    if not isinstance(revision, str) or not all(isinstance(d, str) for d in downs):
        raise ValueError("revision or down_revision is not a string")
    return revision, downs


def add_revision(out: Outcome, code: Path, root: Path, sql: str, message: str,
                 lines: tuple[list[str], list[str]]) -> str:  # fmt: skip
    """Add the revision's patch operation to ``out`` when the project of ``code`` uses Alembic; what the note says."""
    versions = versions_dir(code.parent, root)
    if versions is None:
        return "the project has no Alembic setup"
    try:
        head(versions, {})
    except NotApplicable as exc:
        return f"no Alembic revision: {exc}"
    out.ops.append(revision_op(versions, sql, message, *lines))
    return f"the plan adds it as an Alembic revision in {versions.relative_to(root.resolve()).as_posix()}"


def revision_op(versions: Path, sql: str, message: str, upgrade: Sequence[str], downgrade: Sequence[str]) -> Op:
    """The patch operation creating the revision (``upgrade``/``downgrade``: their body lines, already literal-safe;
    ``sa`` and ``op`` are imported)."""
    revision = hashlib.sha256(sql.encode()).hexdigest()[:12]

    def op(patch: Patch) -> None:
        path = versions / f"{revision}_{_slug(message)}.py"
        if path.exists() or path in patch.created:
            return  # made by an earlier plan (same SQL, same file) or by another writer of this one
        down = head(versions, patch.created)
        doc = f"{message}\n\nRevision ID: {revision}\nRevises: {down or ''}\n"
        lines = [
            docstring(doc),
            "",
            "import sqlalchemy as sa",
            "from alembic import op",
            "",
            f"revision = {string_literal(revision).value}",
            f"down_revision = {string_literal(down).value if down else 'None'}",
            "branch_labels = None",
            "depends_on = None",
            "",
            "",
            "def upgrade() -> None:",
            *(f"    {line}" for line in upgrade),
            "",
            "",
            "def downgrade() -> None:",
            *(f"    {line}" for line in downgrade),
            "",
        ]
        patch.create(path, "\n".join(lines).encode())

    return op


def docstring(text: str) -> str:
    """A triple-quoted docstring when ``text`` is plain words, else its one-line literal (names come from SQL)."""
    plain = all(c.isalnum() or c in " _.,()-:\n" for c in text)
    return f'"""{text}"""' if plain else string_literal(text).value


def _slug(text: str) -> str:
    words = "".join(c if c.isalnum() else " " for c in text.lower()).split()
    return "_".join(words)[:40].rstrip("_") or "repair"


def unique_constraint(name: str, table: str, columns: Sequence[str]) -> tuple[list[str], list[str]]:
    """``upgrade`` and ``downgrade`` lines adding and dropping a unique constraint (``schema.table`` split)."""
    schema, _, bare = table.rpartition(".")
    at = f", schema={string_literal(schema).value}" if schema else ""
    listed = ", ".join(string_literal(c).value for c in columns)
    lit = string_literal
    return (
        [f"op.create_unique_constraint({lit(name).value}, {lit(bare).value}, [{listed}]{at})"],
        [f'op.drop_constraint({lit(name).value}, {lit(bare).value}, type_="unique"{at})'],
    )


def version_column(table: str, column: str) -> tuple[list[str], list[str]]:
    """``upgrade`` and ``downgrade`` lines adding and dropping the version counter (existing rows at 1)."""
    schema, _, bare = table.rpartition(".")
    at = f", schema={string_literal(schema).value}" if schema else ""
    lit = string_literal
    return (
        [f"op.add_column({lit(bare).value}, sa.Column({lit(column).value}, sa.Integer(), nullable=False, "
         f'server_default="1"){at})'],
        [f"op.drop_column({lit(bare).value}, {lit(column).value}{at})"],
    )  # fmt: skip
