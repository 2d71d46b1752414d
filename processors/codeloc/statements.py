"""A statement's shape, for finding the code that issues it: its text, its parsed form, and the ORM names behind it.

Three levels, strongest first, the first that finds anything wins:

``text``
    The recorded text equals a string the code passes, once whitespace, case, a trailing ``;`` and the
    placeholder style (``%s``, ``%(name)s``, ``$1``, ``:name``, ``?``) are set aside.
``shape``
    Both parse (sqlglot) to the same kind (SELECT / INSERT / UPDATE / DELETE), tables, columns it reads or sets,
    columns it filters on and lock: the text an ORM or a driver rewrote (qualified columns, aliases, casts).
``orm``
    No string of the code is that statement (an ORM wrote it): a function is a candidate when it names the model
    of the statement's table (``__tablename__`` / ``Meta.db_table`` / the class named for the table) and does what
    the statement does with the columns: assigns a column an UPDATE sets, builds the model for an INSERT, deletes
    for a DELETE, uses it for a SELECT; and names every column the statement filters on (but the key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from processors.sql.syntax import DIALECT, number_qmarks, psycopg_to_qmark

_NUMBERED: Final = re.compile(r"\$\d+")
_NAMED: Final = re.compile(r"(?<![:\w]):[A-Za-z_]\w*")
_SPACE: Final = re.compile(r"\s+")
_KEYS: Final = frozenset({"id", "pk"})  # filtered on by session.get / objects.get(pk=) without naming the column


@dataclass(frozen=True, slots=True)
class Shape:
    """What a statement does, independent of how it is written."""

    kind: str  # select | insert | update | delete
    tables: tuple[str, ...]  # bare, lower case, sorted
    columns: frozenset[str]  # read (SELECT list), set (UPDATE SET) or inserted
    filters: frozenset[str]  # columns of the WHERE
    locked: bool  # FOR UPDATE / FOR SHARE


def normalise(sql: str) -> str:
    """Whitespace-, case- and placeholder-insensitive text of a statement."""
    text = _NAMED.sub("?", _NUMBERED.sub("?", psycopg_to_qmark(sql)))
    return _SPACE.sub(" ", text).strip().rstrip(";").strip().lower()


def _columns(node: exp.Expression | None) -> frozenset[str]:
    if node is None:
        return frozenset()
    return frozenset(c.name.lower() for c in node.find_all(exp.Column) if c.name)


def shape_of(sql: str) -> Shape | None:
    """The statement's shape, or None when it does not parse as one SELECT / INSERT / UPDATE / DELETE."""
    try:
        tree = sqlglot.parse_one(number_qmarks(_NAMED.sub("?", psycopg_to_qmark(sql)), DIALECT), read=DIALECT)
    except (SqlglotError, ValueError, RecursionError):
        return None
    except Exception:  # sqlglot on text it was not written for (a checkout's string, a hostile span): no shape
        return None
    tables = tuple(sorted({t.name.lower() for t in tree.find_all(exp.Table) if t.name}))
    where = tree.args.get("where")
    if isinstance(tree, exp.Update):
        sets = frozenset(e.this.name.lower() for e in tree.expressions if isinstance(e, exp.EQ) and e.this.name)
        return Shape("update", tables, sets, _columns(where), False)
    if isinstance(tree, exp.Insert):
        target = tree.this
        cols = frozenset(c.name.lower() for c in target.expressions) if isinstance(target, exp.Schema) else frozenset()
        return Shape("insert", tables, cols, frozenset(), False)
    if isinstance(tree, exp.Delete):
        return Shape("delete", tables, frozenset(), _columns(where), False)
    if isinstance(tree, exp.Select):
        read = frozenset(c.name.lower() for e in tree.expressions for c in e.find_all(exp.Column) if c.name)
        return Shape("select", tables, read, _columns(where), bool(tree.args.get("locks")))
    return None


def singular(table: str) -> set[str]:
    """Names a model class of ``table`` may have by convention (lower case): accounts -> account, ..."""
    bare = table.rsplit(".", 1)[-1].lower()
    names = {bare, bare.replace("_", "")}
    if bare.endswith("ies"):
        names.add(bare[:-3] + "y")
    if bare.endswith("es"):
        names.add(bare[:-2])
    if bare.endswith("s"):
        names.add(bare[:-1])
    if "_" in bare:  # Django's default <app>_<model>
        names |= singular(bare.split("_", 1)[1])
    return {n.replace("_", "") for n in names}


def orm_issues(shape: Shape, models: set[str], names: frozenset[str], calls: frozenset[str],
               assigned: frozenset[str], *, caller_names_model: bool = False) -> bool:  # fmt: skip
    """Whether a function that uses ``names``, calls ``calls`` and assigns ``assigned`` can issue ``shape`` through
    one of the table's ``models`` (see the module docstring); an UPDATE's assignment may be in a helper that is given
    the object (``_debit(account)``): then a caller names the model (``caller_names_model``)."""
    if shape.kind == "update" and caller_names_model:
        return bool(shape.columns & assigned)
    unnamed = {c for c in shape.filters - _KEYS if c not in names and c.removesuffix("_id") not in names}
    if not models & names or unnamed:  # filter(name=...), Model.owner == ... (column owner_id)
        return False
    if shape.kind == "update":
        return bool(shape.columns & assigned)
    if shape.kind == "insert":
        return bool(models & calls) or bool({"create", "bulk_create", "add", "add_all"} & calls)
    if shape.kind == "delete":
        return "delete" in calls
    return True
